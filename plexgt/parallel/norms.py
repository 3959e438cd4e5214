"""LayerNorm and BatchNorm on a split activation, exact: statistics all-reduced as autograd
Functions with their adjoints, every byte in the ledger.

An activation x [n, w] is one rank's block of the whole [N, d]:

* **LayerNorm** normalises each row over its d features. Where the feature dim is split over
  a group (the 3D GCN's output columns over the (a, b) plane), a row's sum and its sum of
  squared deviations are all-reduced over that group (two [n] all-reduces: two passes, so
  the variance is a mean of squares about the exact mean, as torch computes it, not
  E[x²] - E[x]²); the backward all-reduces the row sums of ĝ = g·γ and ĝ·x̂ ([n, 2]).
* **BatchNorm** normalises each column over the N rows. Where the rows are split (the 3D
  GCN's output rows over c, the row partition of gt / gps), the column sums run over the
  rank's real rows only (padding rows excluded) and are all-reduced over that group ([w]
  twice forward, [2, w] backward). Running statistics (momentum, unbiased running variance,
  as :class:`torch.nn.BatchNorm1d`) are updated identically on every rank of the group;
  evaluation reads them and communicates nothing.

``mask`` marks the true columns (LayerNorm: padded feature columns are left out of the
statistics and come out zero) or the real rows (BatchNorm). The parameters' gradients are
this rank's partial sums: the caller sums them over the ranks holding copies, as it does a
bias's (:func:`~plexgt.distributed.collectives.replicated`, or the gradient all-reduce of a
row-parallel model).
"""

from __future__ import annotations

from typing import Any

import torch

from plexgt.distributed.collectives import Comm, CommOp, all_reduce_, all_reduce_bytes
from plexgt.models.recompute import recomputing

Tensor = torch.Tensor


def _compute(x: Tensor) -> Tensor:
    """Statistics in at least float32 (bfloat16 activations under mixed precision)."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


class _LayerNormCols(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor, mask: Tensor, d: int,
                comm: Comm, eps: float) -> Tensor:
        xf = _compute(x)
        m = mask.to(xf.dtype)
        s = (xf * m).sum(1)
        all_reduce_(s, comm)
        xc = (xf - (s / d)[:, None]) * m
        v = (xc * xc).sum(1)
        all_reduce_(v, comm)
        rstd = torch.rsqrt(v / d + eps)
        xhat = xc * rstd[:, None]
        ctx.save_for_backward(xhat, rstd, weight, m)
        ctx.d, ctx.comm = d, comm
        return (xhat * weight.to(xf.dtype) + bias.to(xf.dtype)).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Any, ...]:
        xhat, rstd, weight, m = ctx.saved_tensors
        gf = g.to(xhat.dtype)
        gw = gf * weight.to(xhat.dtype) * m
        sums = torch.stack([gw.sum(1), (gw * xhat).sum(1)], 1)
        all_reduce_(sums, ctx.comm)
        d = ctx.d
        dx = (rstd / d)[:, None] * (d * gw - sums[:, :1] - xhat * sums[:, 1:]) * m
        dw = (gf * xhat).sum(0).to(weight.dtype)
        db = gf.sum(0).to(weight.dtype)
        return dx.to(g.dtype), dw, db, None, None, None, None


def layer_norm_cols(x: Tensor, weight: Tensor, bias: Tensor, mask: Tensor, d: int, comm: Comm,
                    eps: float = 1e-5) -> Tensor:
    """LayerNorm of rows x [n, w] whose d true features are split over ``comm`` (this rank's
    w columns, ``mask`` [w] true where a column is one of the d; weight, bias [w])."""
    return _LayerNormCols.apply(x, weight, bias, mask, d, comm, eps)


def layer_norm_comm(rows: int, esize: int, p: int) -> list[CommOp]:
    """:func:`layer_norm_cols`'s collectives over a group of p: two [rows] all-reduces
    forward, one [rows, 2] backward (statistics at least 4 bytes an element)."""
    if p == 1:
        return []
    es = max(esize, 4)
    one, two = all_reduce_bytes(rows * es, p), all_reduce_bytes(2 * rows * es, p)
    return [CommOp("all_reduce", one, one), CommOp("all_reduce", one, one),
            CommOp("all_reduce", two, two, "backward")]


class _BatchNormRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor, mask: Tensor, count: int,
                comm: Comm, eps: float, stats: list[Tensor]) -> Tensor:
        xf = _compute(x)
        m = mask.to(xf.dtype)[:, None]
        s = (xf * m).sum(0)
        all_reduce_(s, comm)
        mean = s / count
        xc = xf - mean
        v = (xc * xc * m).sum(0)
        all_reduce_(v, comm)
        var = v / count
        rstd = torch.rsqrt(var + eps)
        xhat = xc * rstd
        ctx.save_for_backward(xhat, rstd, weight, m)
        ctx.count, ctx.comm = count, comm
        stats[:] = [mean, var]
        return (xhat * weight.to(xf.dtype) + bias.to(xf.dtype)).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Any, ...]:
        xhat, rstd, weight, m = ctx.saved_tensors
        gm = g.to(xhat.dtype) * m
        local = torch.stack([gm.sum(0), (gm * xhat).sum(0)])
        sums = local.clone()
        all_reduce_(sums, ctx.comm)
        n = ctx.count
        wr = weight.to(xhat.dtype) * rstd
        dx = wr / n * (n * gm - sums[0] - xhat * sums[1]) * m
        return (dx.to(g.dtype), local[1].to(weight.dtype), local[0].to(weight.dtype),
                None, None, None, None, None)


def batch_norm_rows(x: Tensor, norm: torch.nn.BatchNorm1d, mask: Tensor, count: int,
                    comm: Comm, weight: Tensor | None = None, bias: Tensor | None = None
                    ) -> Tensor:
    """BatchNorm of x [n, w] whose ``count`` real rows (``mask`` [n]) are split over ``comm``,
    with ``norm``'s parameters (or ``weight``, ``bias`` [w]: the same, passed through a
    collective's identity) and running statistics: batch statistics over every rank's real
    rows in training (the running ones updated as torch does), the running ones in
    evaluation."""
    w = norm.weight if weight is None else weight
    b = norm.bias if bias is None else bias
    rm, rv = norm.running_mean, norm.running_var
    if not (norm.training or rm is None or rv is None):
        r = torch.rsqrt(rv + norm.eps)
        return ((x - rm.to(x.dtype)) * (r * w).to(x.dtype) + b.to(x.dtype))
    stats: list[Tensor] = []
    y = _BatchNormRows.apply(x, w, b, mask, count, comm, norm.eps, stats)
    if rm is not None and rv is not None and not recomputing():  # updated once a step
        with torch.no_grad():
            tracked = norm.num_batches_tracked
            if tracked is not None:
                tracked.add_(1)
            mom = norm.momentum
            if mom is None:  # torch's cumulative average
                mom = 1.0 / float(tracked) if tracked is not None else 0.0
            mean, var = stats
            rm.mul_(1 - mom).add_(mom * mean.to(rm.dtype))
            rv.mul_(1 - mom).add_(mom * var.to(rv.dtype) * count / max(1, count - 1))
    return y


def batch_norm_comm(width: int, esize: int, p: int, training: bool = True) -> list[CommOp]:
    """:func:`batch_norm_rows`'s collectives over a group of p in a training step: two [w]
    all-reduces forward, one [2, w] backward (none in evaluation)."""
    if p == 1 or not training:
        return []
    es = max(esize, 4)
    one, two = all_reduce_bytes(width * es, p), all_reduce_bytes(2 * width * es, p)
    return [CommOp("all_reduce", one, one), CommOp("all_reduce", one, one),
            CommOp("all_reduce", two, two, "backward")]
