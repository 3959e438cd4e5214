"""Distributed GraphGPS: :class:`plexgt.models.gps.GPS` over a 1D node partition of p ranks.

Shapes on a rank (n = ceil(N/p)): x [n, F] -> logits [n, C]. Each block sums

* the attention path, distributed by the graph's strategy (GP-AG or GP-A2A), and
* the GCN path, in one of two layouts:
  - 1D (``graph.gcn``): X·W [n, d] is row-local, all-gathered to [p·n, d] (the columns of the
    rank's Â rows), multiplied by Â[rows, :] [n, p·n] and biased; the backward reduce-scatters
    Âᵀ·dY. (p-1)·n·d elements each way per layer and rank, whatever p is.
  - 3D (``graph.gcn3d``, Plexus on a Gx x Gy x Gz grid of the same ranks): X is redistributed
    into the 3D layout by one all-to-all, aggregated and multiplied there, and brought back
    by another (:mod:`plexgt.parallel.redistribute`). Its traffic shrinks with the grid,
    O(N·d/p^(2/3)) plus O(N·d/p) of redistribution, so it wins at scale; at small p and the
    widths of graph transformers the 1D path's fewer, larger messages can be cheaper.

The class is the reference model with another ``forward`` (same modules and initialisation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from plexgt.distributed.collectives import (
    Comm,
    CommOp,
    all_gather,
    all_gather_bytes,
    reduce_scatter_bytes,
)
from plexgt.models.gps import GPS, GPSBlock
from plexgt.models.layers import NO_DROP, Drop, Features, NormFn, apply_norm
from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import gcn_spmm
from plexgt.parallel.attention.strategy import AttentionProblem
from plexgt.parallel.gt_dist import dist_attention, row_norm
from plexgt.parallel.redistribute import gcn3d_conv
from plexgt.parallel.rows1d import DistGraph

Tensor = torch.Tensor


def dist_gcn_conv(ahat_rows: CSRGraph, x: Tensor, lin: nn.Linear, comm: Comm) -> Tensor:
    """Â (X W) + b for this rank's rows: x [n, d] rows over ``comm`` -> [n, d_out].

    W before Â (d_out <= d), so the all-gather moves X·W [n, d_out]; its adjoint
    reduce-scatters the partial Âᵀ·dY of every rank.
    """
    xw = F.linear(x, lin.weight)
    y = gcn_spmm(ahat_rows, all_gather(xw, comm, dim=0))
    return y if lin.bias is None else y + lin.bias


def dist_gps_block(blk: GPSBlock, x: Tensor, graph: DistGraph, block_rows: int | None = None,
                   drop: Drop = NO_DROP, z: Tensor | None = None, update_super: bool = True,
                   nf: NormFn = apply_norm) -> tuple[Tensor, Tensor | None]:
    """One GPS block on rows [n, d] and super states [S, d]
    (:meth:`plexgt.models.gps.GPSBlock.forward`, same dropout sites)."""
    xl, xa = blk.path_inputs(x, nf)
    if graph.gcn3d is not None:
        g = gcn3d_conv(graph.gcn3d, xl, blk.local)
    elif graph.gcn is not None:
        g = dist_gcn_conv(graph.gcn, xl, blk.local, graph.comm)
    else:
        raise ValueError("a distributed GPS needs its GCN operator (build_dist_graph(gcn=True))")
    za = None if z is None else blk.path_inputs(z, nf)[1]
    a, az = dist_attention(blk.attn, xa, graph.attention, block_rows, za, update_super)
    zo = None if z is None or az is None else blk.tail(z, blk.super_local(z), az, nf=nf)
    return blk.tail(x, g, a, drop, nf), zo


class DistGPS(GPS):
    """GPS over a 1D node partition (constructor as the reference)."""

    def forward(self, x: Features, graph: DistGraph) -> Tensor:  # type: ignore[override]
        return self.run(x, graph, dist_gps_block, row_norm(graph))


def gcn1d_comm(problem: AttentionProblem, p: int) -> list[CommOp]:
    """GPS local path in the 1D layout: all-gather X·W [N/p, d], reduce-scatter its gradient."""
    if p == 1:
        return []
    shard = problem.rows(p) * problem.d * problem.esize
    ag = all_gather_bytes(shard, p)
    rs = reduce_scatter_bytes(p * shard, p)
    return [CommOp("all_gather", ag, ag), CommOp("reduce_scatter", rs, rs, "backward")]
