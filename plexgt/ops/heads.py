"""Linear projections written straight into the head-major layout of the attention kernels.

x [N, F] -> [h, N, d'] (returned as its node-major view [N, h, d'], so callers see the usual
shape): ``x Wᵀ + b`` computed in row blocks that stay in cache, each scattered to its heads.
Why: the attention kernels read one head's [N, d'] slice at random rows, so they need each
head contiguous; projecting node-major and copying afterwards moves every [N, h·d'] tensor
through memory twice more (about 14 ms per 100K x 128 float32 tensor on 2 cores, a quarter of
the attention layer's sparse time).

The backward needs nothing head-major: the kernels return node-major gradients, and the
transposed view of a node-major gradient is what arrives here, so dX = dY W and dW = dYᵀ X run
on it as one [N, h·d'] matrix without a copy.
"""

from __future__ import annotations

import torch
from torch import nn

from plexgt.ops.precision import autocast_dtype

Tensor = torch.Tensor

BLOCK_ROWS = 2048
"""Rows per block: the [rows, h·d'] block (1 MB at h·d' = 128 float32) stays in L2 between its
GEMM and its scatter."""


class _HeadMajorLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, heads: int) -> Tensor:
        n, out_dim = x.shape[0], weight.shape[0]
        dh = out_dim // heads
        out = torch.empty(heads, n, dh, dtype=x.dtype, device=x.device)
        wt = weight.t()
        for r0 in range(0, n, BLOCK_ROWS):
            r1 = min(n, r0 + BLOCK_ROWS)
            blk = x[r0:r1] @ wt if bias is None else torch.addmm(bias, x[r0:r1], wt)
            out[:, r0:r1].copy_(blk.view(r1 - r0, heads, dh).transpose(0, 1))
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        # a view when grad is node-major, as the kernels return it (explicit width: N may be 0)
        g = grad.reshape(grad.shape[0], weight.shape[0])
        dx = g @ weight if ctx.needs_input_grad[0] else None
        dw = g.t() @ x if ctx.needs_input_grad[1] else None
        db = g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None


def head_major_linear(x: Tensor, lin: nn.Linear, heads: int) -> Tensor:
    """x [N, F] -> ``lin(x)`` as [N, h, d'] whose memory is head-major [h, N, d'].

    Equal to ``lin(x).view(N, h, d')``; only the layout differs. Dense CPU inputs outside
    autocast only (others get exactly that).
    """
    if (x.device.type != "cpu" or x.layout != torch.strided or x.dim() != 2
            or autocast_dtype(x.device) is not None):
        return lin(x).view(x.shape[0], heads, lin.out_features // heads)
    return _HeadMajorLinear.apply(x, lin.weight, lin.bias, heads)
