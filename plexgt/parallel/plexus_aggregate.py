"""The aggregation of a 3D tensor-parallel GCN layer (:mod:`plexgt.parallel.plexus3d`): a
rank's Â block cut in row blocks, and Â·H with its all-reduce over a (aggregate_first) or
Â·T with its reduce-scatter over a (gemm_first) as autograd Functions whose row blocks'
collectives overlap the next block's SpMM.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from plexgt.distributed.collectives import (
    Comm,
    all_gather_async,
    all_reduce_async,
    reduce_scatter_async,
    wait,
)
from plexgt.distributed.layout3d import row_blocks
from plexgt.ops.csr import sparse_csr
from plexgt.ops.precision import full_precision


def _torch_csr(m: sp.csr_matrix, dtype: torch.dtype) -> torch.Tensor:
    m = m.tocsr()
    return sparse_csr(  # indices come sorted and in range from scipy
        torch.from_numpy(m.indptr.astype(np.int64)),
        torch.from_numpy(m.indices.astype(np.int64)),
        torch.from_numpy(m.data).to(dtype),
        m.shape,
    )


class BlockedAdjacency:
    """One rank's Â block [rows_pad, cols_pad] cut in row blocks, with each block's transpose.

    The blocks bound how much of the aggregate waits for its all-reduce: block k's all-reduce
    runs while block k+1 is multiplied.
    """

    def __init__(self, block: sp.csr_matrix, shape: tuple[int, int], block_rows: int | None,
                 dtype: torch.dtype) -> None:
        full = sp.csr_matrix(shape, dtype=np.float64)
        if block.shape[0] and block.shape[1]:
            full = sp.csr_matrix(
                (block.data, block.indices, np.concatenate(
                    [block.indptr, np.full(shape[0] - block.shape[0], block.indptr[-1])])),
                shape=shape,
            )
        self.shape = shape
        self.bounds = row_blocks(shape[0], block_rows)
        self.fwd = [_torch_csr(full[r0:r1], dtype) for r0, r1 in self.bounds]
        self.bwd = [_torch_csr(full[r0:r1].T.tocsr(), dtype) for r0, r1 in self.bounds]
        self.nnz = int(full.nnz)


def _spmm(blk: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Â_block · H. Half-precision H (bfloat16 runs) is multiplied in the block's float32, sums
    over each row's neighbours included, and rounded once: CPU sparse kernels have no half
    types, and autocast is off so its mm does not cast the operands back."""
    with full_precision(h.device):
        if h.dtype == blk.dtype:
            return torch.sparse.mm(blk, h)
        return torch.sparse.mm(blk, h.to(blk.dtype)).to(h.dtype)


class _AggregateAllReduce(torch.autograd.Function):
    """Z = all-reduce over a of (Â_block · H), blocked so communication overlaps the SpMM."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, adj: BlockedAdjacency, comm: Comm) -> torch.Tensor:
        ctx.adj, ctx.comm = adj, comm
        out = torch.empty((adj.shape[0], h.shape[1]), dtype=h.dtype, device=h.device)
        handles = []
        for (r0, r1), blk in zip(adj.bounds, adj.fwd):
            out[r0:r1] = _spmm(blk, h) if r1 > r0 else out[r0:r1]
            handles.append(all_reduce_async(out[r0:r1], comm))
        for hd in handles:
            wait(hd, comm)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        adj, comm = ctx.adj, ctx.comm
        g = g.contiguous().clone()
        handles = [all_reduce_async(g[r0:r1], comm) for r0, r1 in adj.bounds]
        dh = torch.zeros((adj.shape[1], g.shape[1]), dtype=g.dtype, device=g.device)
        for (r0, r1), blk_t, hd in zip(adj.bounds, adj.bwd, handles):
            wait(hd, comm)
            if r1 > r0:
                dh += _spmm(blk_t, g[r0:r1])
        return dh, None, None


class _AggregateReduceScatter(torch.autograd.Function):
    """[cols_pad, Ga·w] -> [rows_pad, w]: reduce-scatter over a (dim 1) of (Â_block · T).

    The gemm_first aggregation: T = H·W is already reduced over b, so the partial sums over a
    only need each rank's own column block, half the bytes of an all-reduce. Row block k's
    reduce-scatter runs while block k+1 is multiplied; in backward the all-gathers of all
    blocks are issued first and each block's Âᵀ product starts as soon as its block arrives.
    """

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, adj: BlockedAdjacency, comm: Comm) -> torch.Tensor:
        ctx.adj, ctx.comm = adj, comm
        g = comm.size
        w = t.shape[1] // g
        out = torch.empty((adj.shape[0], w), dtype=t.dtype, device=t.device)
        pending = []
        for (r0, r1), blk in zip(adj.bounds, adj.fwd):
            z = _spmm(blk, t) if r1 > r0 else t.new_zeros(0, g * w)
            # [rb, G·w] -> [G, rb, w]: rank i's chunk is its column block, contiguous
            zt = z.view(r1 - r0, g, w).transpose(0, 1).contiguous()
            pending.append((zt, reduce_scatter_async(zt.view(g * (r1 - r0), w), out[r0:r1],
                                                     comm)))
        for _, hd in pending:
            wait(hd, comm)
        return out

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        adj, comm = ctx.adj, ctx.comm
        g = comm.size
        dy = dy.contiguous()
        w = dy.shape[1]
        pending = []
        for r0, r1 in adj.bounds:
            full = dy.new_empty(g * (r1 - r0), w)
            pending.append((full, all_gather_async(dy[r0:r1], full, comm)))
        dt = dy.new_zeros(adj.shape[1], g * w)
        for (r0, r1), blk_t, (full, hd) in zip(adj.bounds, adj.bwd, pending):
            wait(hd, comm)
            if r1 > r0:
                zb = full.view(g, r1 - r0, w).transpose(0, 1).reshape(r1 - r0, g * w)
                dt += _spmm(blk_t, zb)
        return dt, None, None
