"""Explicit redistribution between the 1D node layout and the 3D (Plexus) layouts, and the 3D
GCN path of GPS built on it.

A *layout* says, for every rank of a group, which global block [rows) x [cols) of an [N, d]
matrix it holds and in what padded local shape (data top-left, zeros elsewhere):

=================  =====================================  ====================================
layout             block of rank (ia, ib, ic)             local shape
=================  =====================================  ====================================
rows (1D)          rows block r of p, all d columns       [ceil(N/p), d]
3D input           rows block ia of Ga, columns flat      [ceil(N/Ga), d_in/(Gb·Gc)]
                   block ib·Gc+ic of Gb·Gc
3D output          rows block ic of Gc, columns flat      [ceil(N/Gc), d_out/(Ga·Gb)]
                   block ia·Gb+ib of Ga·Gb
=================  =====================================  ====================================

:func:`redistribute` moves a matrix from one layout to another with one all-to-all over the
group (uneven splits: each rank sends every other rank the intersection of their blocks), so
its bytes are in the ledger and its adjoint (the reverse all-to-all) is the backward.
:func:`gcn3d_comm` prices the same intersections for the cost model (which,
for the layouts here, each a partition of the matrix, needs only a rank's own two blocks).

The 3D GCN path (:func:`gcn3d_conv`): X [N/p, d] (1D) -> 3D input layout -> Plexus layer
(all-gather over c, Â block SpMM with all-reduce over a, GEMM with the W block, reduce-scatter
over b) -> 3D output layout -> 1D, + bias. W and b stay replicated (the attention path keeps
them so): each rank slices the W block it needs, so no weight collective runs, and the one
gradient all-reduce of the step sums the blocks' partial gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from plexgt.distributed.collectives import (
    Comm,
    CommOp,
    all_gather,
    all_gather_bytes,
    all_reduce_bytes,
    all_to_all,
    reduce_scatter,
    reduce_scatter_bytes,
)
from plexgt.distributed.grid import Grid3D, block_bounds
from plexgt.distributed.layout3d import layer_layouts, row_blocks
from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import gcn_norm
from plexgt.parallel.plexus_aggregate import BlockedAdjacency, _AggregateAllReduce

Tensor = torch.Tensor
Range = tuple[int, int]


@dataclass(frozen=True)
class Block:
    """Global rows and columns held by one rank (true extents) and its padded local shape."""

    rows: Range
    cols: Range
    shape: tuple[int, int]


Layout = Callable[[int], Block]


def row_layout(n: int, d: int, p: int) -> Layout:
    """1D: rank r holds rows block r of p (ceil(N/p) padded), all d columns."""
    return lambda r: Block(block_bounds(n, p, r), (0, d), (-(-n // p), d))


def plexus_in_layout(grid: Grid3D, n: int, d: int) -> Layout:
    """Input of a layer-0 (roles x, y, z) 3D GCN layer of width d -> d."""
    def f(r: int) -> Block:
        lay = layer_layouts(grid, r, n, [d, d])[0]
        return Block(lay.cols, _clip(lay.in_cols, d), (lay.cols_pad, _width(lay.in_cols)))
    return f


def plexus_out_layout(grid: Grid3D, n: int, d: int) -> Layout:
    """Output of a layer-0 (roles x, y, z) 3D GCN layer of width d -> d."""
    def f(r: int) -> Block:
        lay = layer_layouts(grid, r, n, [d, d])[0]
        return Block(lay.rows, _clip(lay.out_cols, d), (lay.rows_pad, _width(lay.out_cols)))
    return f


def _clip(r: Range, n: int) -> Range:
    return min(r[0], n), min(r[1], n)


def _width(r: Range) -> int:
    return r[1] - r[0]


def _overlap(a: Block, b: Block) -> tuple[Range, Range] | None:
    r0, r1 = max(a.rows[0], b.rows[0]), min(a.rows[1], b.rows[1])
    c0, c1 = max(a.cols[0], b.cols[0]), min(a.cols[1], b.cols[1])
    if r1 <= r0 or c1 <= c0:
        return None
    return (r0, r1), (c0, c1)


def _pieces(mine: Block, others: Sequence[Block]) -> list[tuple[Range, Range] | None]:
    return [_overlap(mine, o) for o in others]


def _size(piece: tuple[Range, Range] | None) -> int:
    return 0 if piece is None else _width(piece[0]) * _width(piece[1])


def redistribute(x: Tensor, src: Layout, dst: Layout, comm: Comm) -> Tensor:
    """x [src shape] on this rank -> [dst shape]: one all-to-all over ``comm``."""
    p, me = comm.size, comm.rank
    srcs = [src(r) for r in range(p)]
    dsts = [dst(r) for r in range(p)]
    send = _pieces(srcs[me], dsts)
    recv = _pieces(dsts[me], srcs)
    b = srcs[me]
    parts = [x[q[0][0] - b.rows[0]: q[0][1] - b.rows[0],
               q[1][0] - b.cols[0]: q[1][1] - b.cols[0]].reshape(-1)
             for q in send if q is not None]
    # Every rank must keep both all-to-alls (this one and its adjoint) in its autograd graph,
    # even one that sends or receives nothing (a block of padding only): an empty view of x
    # feeds the exchange and an empty slice of its result feeds the output, else that rank's
    # backward would skip the adjoint and the others would wait for it.
    flat = torch.cat([x.reshape(-1)[:0], *parts])
    got = all_to_all(flat, comm, [_size(q) for q in send], [_size(q) for q in recv], dim=0)
    out_b = dsts[me]
    out = x.new_zeros(out_b.shape) + got[:0].sum()
    off = 0
    for q in recv:
        if q is None:
            continue
        (r0, r1), (c0, c1) = q
        k = (r1 - r0) * (c1 - c0)
        out[r0 - out_b.rows[0]: r1 - out_b.rows[0], c0 - out_b.cols[0]: c1 - out_b.cols[0]] = (
            got[off: off + k].view(r1 - r0, c1 - c0))
        off += k
    return out


def _partition_bytes(src: Block, dst: Block, esize: int) -> tuple[int, int]:
    """(sent, received) bytes of :func:`redistribute` on the rank holding ``src`` before and
    ``dst`` after, when
    both layouts partition the matrix (the row and 3D layouts do): it sends all of its block
    but what it keeps and receives all of its new block but that, so no other rank's block
    is needed (O(1) a rank, not O(p))."""
    own = _size(_overlap(src, dst))
    return ((_size((src.rows, src.cols)) - own) * esize,
            (_size((dst.rows, dst.cols)) - own) * esize)


# -- the 3D GCN path of GPS -----------------------------------------------------------------
@dataclass
class Plexus3DPath:
    """What one rank needs for the 3D GCN path: grid, comms, its Â block, the layouts."""

    grid: Grid3D
    comms: dict[str, Comm]
    """'x', 'y', 'z' axis comms and 'rows' (the whole group, in grid rank order)."""
    adj: Any
    """:class:`plexgt.parallel.plexus3d.BlockedAdjacency` of Â[rows over z, cols over x]."""
    n: int


def gcn3d_rows(grid: Grid3D, rank: int, n: int) -> Range:
    """The rows of Q A Qᵀ whose pattern ``rank``'s 3D Â block needs (block over z, all
    columns): what the loader reads for :func:`build_gcn3d_path`. Width independent."""
    return layer_layouts(grid, rank, n, [1, 1])[0].rows


def gcn3d_block(adj_rows: sp.csr_matrix, cols: Range, row0: int, deg: np.ndarray
                ) -> sp.csr_matrix:
    """Â[rows, cols] from the pattern's rows [row0, row0+r) x all N columns (Q order):
    :func:`~plexgt.ops.gcn.gcn_norm` of the rows (self loops merged, ``deg`` [N] the global
    row counts of A + I), columns restricted to ``cols``."""
    g = CSRGraph.from_scipy(adj_rows, keep_values=False)
    norm = gcn_norm(g, self_loops=True, row_offset=row0, col_degrees=torch.from_numpy(deg),
                    dtype=torch.float64).to_scipy()
    a = norm[:, cols[0]:cols[1]].tocsr()
    a.sort_indices()
    return a


def build_gcn3d_path(rows: sp.csr_matrix, n: int, grid: Grid3D, comms: dict[str, Comm],
                     deg: np.ndarray, dtype: torch.dtype, block_rows: int | None = None
                     ) -> Plexus3DPath:
    """This rank's 3D path: its Â block [rows over z, cols over x] (Q order both sides) from
    ``rows``, its pattern rows :func:`gcn3d_rows` x all N columns of Q A Qᵀ, with ``deg`` [N]
    the row counts of A + I (Q order).

    ``comms``: 'x', 'y', 'z' (axes of ``grid``; absent axes of extent 1 are fine) and 'rows'
    (the whole group; its rank is the grid rank). The block does not depend on the width."""
    rank = comms["rows"].rank
    if comms["rows"].size != grid.size:
        raise ValueError(f"grid {grid} has {grid.size} ranks, the group {comms['rows'].size}")
    full = {a: comms.get(a) or Comm.single(a, comms["rows"].ledger) for a in ("x", "y", "z")}
    full["rows"] = comms["rows"]
    lay = layer_layouts(grid, rank, n, [1, 1])[0]
    if rows.shape != (lay.rows[1] - lay.rows[0], n):
        raise ValueError(f"rank {rank}'s 3D block needs pattern rows {lay.rows} x {n}, got "
                         f"{rows.shape[0]}x{rows.shape[1]}")
    ahat = gcn3d_block(rows, lay.cols, lay.rows[0], deg.astype(np.float64))
    adj = BlockedAdjacency(ahat, (lay.rows_pad, lay.cols_pad), block_rows, dtype)
    return Plexus3DPath(grid, full, adj, n)


def gcn3d_conv(path: Plexus3DPath, x: Tensor, lin: nn.Linear) -> Tensor:
    """Â X W + b for this rank's rows: x [N/p, d] (1D) -> [N/p, d] (1D), via the 3D layout."""

    n, d = path.n, x.shape[1]
    lay = layer_layouts(path.grid, path.comms["rows"].rank, n, [d, d])[0]
    c = path.comms
    a, b, cc = lay.roles
    p = path.grid.size
    h = redistribute(x, row_layout(n, d, p), plexus_in_layout(path.grid, n, d), c["rows"])
    hg = all_gather(h, c[cc], dim=1)
    z = _AggregateAllReduce.apply(hg, path.adj, c[a])
    wt = F.pad(lin.weight.t(), (0, lay.d_out - d, 0, lay.d_in - d))
    wblk = wt[slice(*lay.gathered_cols), slice(*lay.w_cols)]
    y = reduce_scatter(z @ wblk, c[b], dim=1)
    y1 = redistribute(y, plexus_out_layout(path.grid, n, d), row_layout(n, d, p), c["rows"])
    return y1 if lin.bias is None else y1 + lin.bias


def gcn3d_copy_elems(grid: Grid3D, rank: int, n: int, d: int) -> int:
    """Elements the layout code of one :func:`gcn3d_conv` call writes on ``rank``, forward
    and backward, beyond the 1D path's (its bias add and SpMM are the same): copies, not
    arithmetic, so a cost model prices them as memory passes.

    Forward, with A the 1D row block [ceil(N/p), d], I and O the 3D input and output blocks:
    each :func:`redistribute` concatenates what it sends (A, resp. O), zero-fills its
    destination, adds the exchange's empty sum to it and copies the received pieces in
    (3·I, resp. 3·A); the aggregation zero-fills its [rows, w] output and copies each SpMM
    block into it (2·Z); an all-gather over c or a reduce-scatter over b on dim 1 makes its
    operand and result contiguous (2·H of the gathered [cols, w] input, 2·Y of the
    [rows, d_out/Ga] product). Backward, autograd's adjoints of those slices and copies write
    a zero-filled full-size gradient per piece and sum them: about twice the forward.
    Measured (a dispatch-mode count of one call, 2 ranks, d = 64): 37, 50 and 42 A on
    2x1x1, 1x2x1 and 1x1x2 (the 1D path's own 2 A taken off); this count gives 36, 42, 42.
    """
    lay = layer_layouts(grid, rank, n, [d, d])[0]
    ga, gb, gc = lay.g
    p = grid.size
    a = -(-n // p) * d
    i = int(np.prod(plexus_in_layout(grid, n, d)(rank).shape))
    o = int(np.prod(plexus_out_layout(grid, n, d)(rank).shape))
    w = lay.d_in // gb
    fwd = (a + 3 * i) + (o + 3 * a) + 2 * lay.rows_pad * w
    if gb > 1:
        fwd += 2 * lay.rows_pad * (lay.d_out // ga)
    if gc > 1:
        fwd += 2 * lay.cols_pad * w
    return 3 * fwd


def gcn3d_comm(grid: Grid3D, rank: int, n: int, d: int, esize: int,
               block_rows: int | None = None) -> list[tuple[str, CommOp]]:
    """(comm name, op) of one 3D GCN path call, forward and backward, on ``rank``.

    Every collective :func:`gcn3d_conv` issues, with the bytes the ledger records: the four
    redistribution all-to-alls over 'rows' (1D -> 3D input forward, 3D output -> 1D forward,
    and their adjoints backward; issued on every rank when p > 1, even one that exchanges
    nothing) and the Plexus layer's collectives over the grid axes ('x', 'y', 'z')."""
    lay = layer_layouts(grid, rank, n, [d, d])[0]
    ga, gb, gc = lay.g
    a, b, c = lay.roles
    p = grid.size
    din_b, dout_a = lay.d_in // gb, lay.d_out // ga
    row = row_layout(n, d, p)(rank)
    rin = _partition_bytes(row, plexus_in_layout(grid, n, d)(rank), esize) if p > 1 else (0, 0)
    rout = _partition_bytes(plexus_out_layout(grid, n, d)(rank), row, esize) if p > 1 else (0, 0)
    row_blks = row_blocks(lay.rows_pad, block_rows)
    ag_c = all_gather_bytes(lay.cols_pad * (din_b // gc) * esize, gc)
    rs_b = reduce_scatter_bytes(lay.rows_pad * dout_a * esize, gb)
    ag_b = all_gather_bytes(lay.rows_pad * (dout_a // gb) * esize, gb)
    rs_c = reduce_scatter_bytes(lay.cols_pad * din_b * esize, gc)
    ops: list[tuple[str, CommOp]] = []

    def add(name: str, op: str, sent: int, recv: int, phase: str = "forward") -> None:
        if name != "rows" or p > 1:
            ops.append((name, CommOp(op, sent, recv, phase)))

    add("rows", "all_to_all", *rin)
    if gc > 1:
        add(c, "all_gather", ag_c, ag_c)
    if ga > 1:
        for r0, r1 in row_blks:
            ar = all_reduce_bytes((r1 - r0) * din_b * esize, ga)
            add(a, "all_reduce", ar, ar)
    if gb > 1:
        add(b, "reduce_scatter", rs_b, rs_b)
    add("rows", "all_to_all", *rout)
    add("rows", "all_to_all", rout[1], rout[0], "backward")
    if gb > 1:
        add(b, "all_gather", ag_b, ag_b, "backward")
    if ga > 1:
        for r0, r1 in row_blks:
            ar = all_reduce_bytes((r1 - r0) * din_b * esize, ga)
            add(a, "all_reduce", ar, ar, "backward")
    if gc > 1:
        add(c, "reduce_scatter", rs_c, rs_c, "backward")
    add("rows", "all_to_all", rin[1], rin[0], "backward")
    return ops
