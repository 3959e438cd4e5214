"""Ring attention over a sparse pattern: query rows stay, K/V blocks travel, softmax merged online.

Shapes on member r of a ring of b (``comm``), each member holding m key rows:

    q [n, h, d'] this rank's query rows          k, v [m, h, d'] this member's key rows
    pattern [n, b·m] split into b·c column blocks ``blocks[j][i]``: member j's chunk i
    y [n, h, d'] = softmax_rows(q Kᵀ/sqrt(d') ⊙ A) V over all b·m columns, exactly

forward, per chunk i and step t = 0 … b-1 (block j = r - t mod b)
    K/V chunk of member j: attended (SDDMM on its column block, softmax inside the block,
    SpMM), merged into the running (y, lse) by the log-sum-exp rule; meanwhile the chunk moves
    on to member r+1 (non-blocking send/receive), so the next one is here when it is needed
backward, the same rotation of K/V again, scores recomputed from the saved lse
    dS = P ⊙ (dP - delta) with delta = rowsum(dY ⊙ Y) (FlashAttention's identity: no row of P
    needs to be whole); dQ accumulates here; each chunk's dK/dV accumulator travels one step
    behind its K/V and arrives home after b-1 steps

Why: per rank, K/V memory is its own block plus the chunks in flight (2·m·d + 4·m·d/c) instead
of the 2·b·m·d an all-gather holds, and the traffic is an all-gather's bytes, forward, and
twice that in backward (K/V again, and the accumulators). Blocks without edges on this rank
cost no compute, but the rank still relays them.

Kernels: on a GPU the fused Triton kernel (:func:`~plexgt.ops.attention_triton.block_attention`
returns a block's normalised output and lse, the merge stays here; its backward takes the
whole rows' lse and delta), so no ring reaches torch's SDDMM there (ROCm has none); on the
CPU the compiled kernels, or torch's sparse ones with an edge bias.

Communication is point-to-point (:func:`~plexgt.distributed.collectives.shift_async`), one
'send_recv' per step, recorded in the ledger; :func:`ring_comm` gives the same bytes.
Low-precision inputs travel in their dtype and are computed on, and accumulated, in float32.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from plexgt.distributed.collectives import Comm, CommOp, shift_async, wait
from plexgt.distributed.grid import block_bounds
from plexgt.ops import attention_triton, native
from plexgt.ops.attention import probs_from_lse, row_softmax_, sddmm, spmm
from plexgt.ops.csr import CSRGraph
from plexgt.ops.precision import LOW_PRECISION, full_precision
from plexgt.parallel.attention.strategy import AttentionShard

Tensor = torch.Tensor
Range = tuple[int, int]


def chunk_bounds(m: int, chunks: int) -> tuple[Range, ...]:
    """Row ranges of the non-empty chunks of an m-row K/V block cut into ``chunks`` pieces of
    ceil(m/chunks) (the same on every member, so every step moves equal messages)."""
    return tuple(r for r in (block_bounds(m, chunks, i) for i in range(chunks)) if r[1] > r[0])


@dataclass(frozen=True)
class ColumnBlock:
    """One column block of a rank's pattern, compacted to the rows that have an entry in it.

    ``graph`` [R, chunk rows] holds only those R rows (``rows`` [R], their positions among the
    rank's rows): the block's row pointers and its work scale with its edges, not with the
    rank's rows, which at p·c blocks a rank would otherwise pay p·c times."""

    graph: CSRGraph
    rows: Tensor
    edges: Tensor
    """[E_block] positions of the block's edges in the rank's whole pattern (CSR order): where
    its per-edge data (the edge bias) is sliced from."""

    @property
    def num_edges(self) -> int:
        return self.graph.num_edges

    def to(self, device: torch.device | str) -> ColumnBlock:
        return ColumnBlock(self.graph.to(device), self.rows.to(device), self.edges.to(device))


def column_blocks(graph: CSRGraph, members: int, m: int, chunks: tuple[Range, ...]
                  ) -> tuple[tuple[ColumnBlock, ...], ...]:
    """[rows, members·m] pattern -> ``out[j][i]``: the columns of member j's chunk i,
    re-indexed from 0, on the rows that have any (one stable sort of the edges by block: rows
    and columns stay sorted inside every block), each with its transpose built."""
    if graph.num_cols != members * m:
        raise ValueError(f"pattern has {graph.num_cols} columns, not {members} x {m}")
    col, row = graph.indices.cpu(), graph.row.cpu()
    starts = torch.tensor([c0 for c0, _ in chunks], dtype=torch.int64)
    j = torch.div(col, m, rounding_mode="floor")
    off = col - j * m
    i = torch.bucketize(off, starts, right=True) - 1
    key = j * len(chunks) + i
    order = torch.sort(key, stable=True).indices
    counts = torch.bincount(key, minlength=members * len(chunks)).tolist()
    rows_sorted, off_sorted = row[order], off[order]
    out, e0 = [], 0
    for jj in range(members):
        per = []
        for ii, (c0, c1) in enumerate(chunks):
            e1 = e0 + counts[jj * len(chunks) + ii]
            present, per_row = torch.unique_consecutive(rows_sorted[e0:e1], return_counts=True)
            indptr = torch.zeros(present.numel() + 1, dtype=torch.int64)
            torch.cumsum(per_row, 0, out=indptr[1:])
            g = CSRGraph(indptr, off_sorted[e0:e1] - c0, present.numel(), c1 - c0)
            g.transpose()
            _ = g.row
            per.append(ColumnBlock(g, present, order[e0:e1]).to(graph.device))
            e0 = e1
        out.append(tuple(per))
    return tuple(out)


def split_columns(graph: CSRGraph, c: int) -> list[tuple[CSRGraph, Tensor]]:
    """[R, C] -> [([R, c] columns below c, their edges' positions in ``graph``),
    ([R, C - c] the rest re-indexed from 0, positions)]."""
    low = graph.indices < c
    row = graph.row
    parts = []
    for keep, base, width in ((low, 0, c), (~low, c, graph.num_cols - c)):
        counts = torch.bincount(row[keep], minlength=graph.num_rows)
        indptr = torch.zeros(graph.num_rows + 1, dtype=torch.int64, device=graph.device)
        torch.cumsum(counts, 0, out=indptr[1:])
        parts.append((CSRGraph(indptr, graph.indices[keep] - base, graph.num_rows, width),
                      torch.nonzero(keep).flatten()))
    return parts


def ring_shard(shard: AttentionShard, members: int, m: int) -> AttentionShard:
    """``shard`` with its pattern cut into column blocks of ``members`` key blocks of m rows
    (in ``shard.ring_chunks`` pieces each), and its super columns (if any) into one more;
    the whole pattern is kept without its transpose and caches (only its sizes are read).
    The ``prepare`` of both ring strategies."""
    chunks = chunk_bounds(m, shard.ring_chunks)
    g, sup = shard.graph, None
    blocks = column_blocks(g, members, m, chunks) if not shard.super_nodes else ()
    if shard.super_nodes:  # block edge positions are the parts'; mapped back to the pattern's
        (ring_part, low), (extra, high) = split_columns(g, members * m)
        s = shard.super_nodes
        sb = column_blocks(extra, 1, s, ((0, s),))[0][0]
        sup = dataclasses.replace(sb, edges=high[sb.edges.to(high.device)].to(sb.edges.device))
        blocks = tuple(tuple(dataclasses.replace(b, edges=low[b.edges.to(low.device)].to(
            b.edges.device)) for b in row) for row in column_blocks(ring_part, members, m,
                                                                    chunks))
    bare = CSRGraph(g.indptr, g.indices, g.num_rows, g.num_cols)
    return dataclasses.replace(shard, graph=bare, blocks=blocks, chunk_bounds=chunks,
                               super_block=sup)


@dataclass(frozen=True)
class Ring:
    """What one rank's ring attention runs on: the ring group, the column blocks, the chunks."""

    comm: Comm
    """The b ring members (rank r's K/V goes to r+1, arrives from r-1)."""
    blocks: tuple[tuple[ColumnBlock, ...], ...]
    """[b][c] column blocks of this rank's pattern (:func:`column_blocks`)."""
    chunks: tuple[Range, ...]
    """Row ranges of the chunks inside a member's m-row K/V block."""
    super_block: ColumnBlock | None = None
    """The pattern's super-node columns (rows against the S super keys every rank holds)."""


# --------------------------------------------------------------------------- block kernels
def _head_major(x: Tensor) -> Tensor:
    return x.transpose(0, 1).contiguous()


def _merge_(y: Tensor, lse: Tensor, rows: Tensor, yb: Tensor, lb: Tensor) -> None:
    """In place on ``rows`` of (y [n, h, d'], lse [h, n]): the softmax over both column sets,
    from the block's normalised output [R, h, d'] and log-sum-exp [h, R] (rows with no entry
    yet hold y = 0, lse = -inf, and every row of a block has one)."""
    old = lse.index_select(1, rows)
    new = torch.logaddexp(old, lb)
    w_old = torch.exp(old - new).nan_to_num_(0.0).t().unsqueeze(-1)
    w_new = torch.exp(lb - new).t().unsqueeze(-1)
    y.index_copy_(0, rows, y.index_select(0, rows).mul_(w_old).add_(yb.mul_(w_new)))
    lse.index_copy_(1, rows, new)


def _add_rows_(out: Tensor, rows: Tensor, x: Tensor) -> None:
    """out[rows] += x for distinct ``rows`` (a block's rows): index_add_ on the CPU (one
    sequential pass); on a GPU a gather, an add and a copy, no atomics, so the same bits on
    every run whether or not torch's deterministic mode is on (which would swap index_add_
    for a sorted index_put_)."""
    if out.device.type == "cpu":
        out.index_add_(0, rows, x)
    else:
        out.index_copy_(0, rows, out.index_select(0, rows).add_(x))


def _native(x: Tensor) -> Any | None:
    """The compiled CPU kernels (:mod:`plexgt.ops.native`) when they serve x's head width and
    device, else None (torch's sparse kernels: GPUs, other widths)."""
    if x.device.type != "cpu" or x.shape[-1] not in native.WIDTHS:
        return None
    return native.load()


def _block_forward(blk: ColumnBlock, q: Tensor, kh: Tensor, vh: Tensor, scale: float,
                   bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One column block, K/V head-major [h, m_i, d']: (softmax-within-block output [R, h, d'],
    its lse [h, R]) of the block's rows; ``bias`` [h, E_block] added to its scores. On a GPU
    the fused kernel (K/V read through node-major views of the head-major pieces, no copy);
    on the CPU the compiled kernels, or torch's with a bias."""
    g, qr = blk.graph, q.index_select(0, blk.rows)
    if attention_triton.gpu_default(q):
        return attention_triton.block_attention(g, qr, kh.transpose(0, 1), vh.transpose(0, 1),
                                                scale, bias)
    nat = _native(q) if bias is None else None  # the compiled scores fuse the softmax
    if nat is not None:
        ip, ix = g.compact_index()
        p, lb = nat.scores(ip, ix, _head_major(qr), kh, scale)
        return nat.spmm(ip, ix, None, p, vh, None), lb
    s = sddmm(g, qr, kh.transpose(0, 1), scale)
    if bias is not None:
        s.add_(bias)
    _, lb = row_softmax_(g, s)
    return spmm(g, s, vh), lb


def _block_backward(blk: ColumnBlock, q: Tensor, kh: Tensor, vh: Tensor, lse: Tensor,
                    dy: Tensor, delta: Tensor, scale: float, dq: Tensor, acc: Tensor,
                    bias: Tensor | None = None, dbias: Tensor | None = None) -> None:
    """One column block's gradients, K/V head-major [h, m_i, d']: dQ += dS K_b (in ``dq``, on
    its rows), dK_b += dSᵀ Q and dV_b += Pᵀ dY (in ``acc`` [2, m_i, h, d']); with a
    ``bias`` [h, E_block], its gradient (the logits', unscaled) into the block's edges of
    ``dbias`` [h, E]. On a GPU the fused kernel's backward, with the whole rows' lse and
    delta (so P and dS are the block's share of the whole row's, FlashAttention-2 style) and
    dK/dV added into ``acc`` in the kernel."""
    g, rows = blk.graph, blk.rows
    qr, dyr = q.index_select(0, rows), dy.index_select(0, rows)
    if attention_triton.gpu_default(q):
        dqb, _, _, db = attention_triton.fused_backward(
            g, qr, kh.transpose(0, 1), vh.transpose(0, 1), lse.index_select(1, rows),
            delta.index_select(1, rows), dyr, scale, (True, True, True), bias,
            dbias is not None, dkv=(acc[0], acc[1]))
        _add_rows_(dq, rows, dqb)
        if dbias is not None:
            dbias.index_copy_(1, blk.edges, db)
        return
    qrh, dyrh = _head_major(qr), _head_major(dyr)
    nat = _native(q) if bias is None else None
    if nat is not None:  # P from the block's own softmax, rescaled to the whole row's
        ip, ix = g.compact_index()
        pb, lb = nat.scores(ip, ix, qrh, kh, scale)
        p = pb.mul_(torch.exp(lb - lse.index_select(1, rows)).index_select(1, g.row))
    else:
        s = sddmm(g, qr, kh.transpose(0, 1), scale)
        if bias is not None:
            s.add_(bias)
        p = probs_from_lse(g, s, lse.index_select(1, rows))
    ds = sddmm(g, dyr, vh.transpose(0, 1))
    ds.sub_(delta.index_select(1, rows).index_select(1, g.row)).mul_(p)
    if dbias is not None:
        dbias.index_copy_(1, blk.edges, ds)
    if scale != 1.0:
        ds.mul_(scale)
    gt = g.transpose()
    if nat is not None:
        _add_rows_(dq, rows, nat.spmm(ip, ix, None, ds, kh, None))
        tip, tix = gt.compact_index()
        perm = g.compact_transpose_perm()
        nat.spmm(tip, tix, perm, ds, qrh, acc[0])
        nat.spmm(tip, tix, perm, p, dyrh, acc[1])
        return
    _add_rows_(dq, rows, spmm(g, ds, kh))
    perm = g.transpose_perm
    spmm(gt, ds.index_select(1, perm), qrh, out=acc[0], accumulate=True)
    spmm(gt, p.index_select(1, perm), dyrh, out=acc[1], accumulate=True)


def _kv_chunk(k: Tensor, v: Tensor, c0: int, c1: int) -> Tensor:
    """Rows [c0, c1) of k and v [m, h, d'] as one head-major [2, h, c1-c0, d'] message: the
    layout the kernels read K and V in, so no block copies them again."""
    return torch.stack((k[c0:c1].transpose(0, 1), v[c0:c1].transpose(0, 1)))


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in LOW_PRECISION else x.dtype


class RingAttentionFunction(torch.autograd.Function):
    """y = softmax_rows(Q Kᵀ·scale ⊙ A) V with K, V rotating around ``ring`` (module doc)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, ks: Tensor | None,
                vs: Tensor | None, bias: Tensor | None, ring: Ring, scale: float) -> Tensor:
        comm, me = ring.comm, ring.comm.rank
        # no head here (gp_2d with fewer heads than its head axis): neither has any member
        # of this ring, so nothing travels; the empty result still joins the autograd graph
        b = ring.comm.size if q.shape[1] else 0
        dt = _compute_dtype(q)
        n, h, dh = q.shape
        with full_precision(q.device):
            qc = q.to(dt).contiguous()
            bc = None if bias is None else bias.to(dt)
            y = torch.zeros(n, h, dh, dtype=dt, device=q.device)
            lse = torch.full((h, n), -math.inf, dtype=dt, device=q.device)
            sup = _super_block(ring, ks, h)
            if sup is not None:  # the super keys: here on every rank, attended first
                assert ks is not None and vs is not None
                yb, lb = _block_forward(sup, qc, _head_major(ks.to(dt)), _head_major(vs.to(dt)),
                                        scale, _slice(bc, sup))
                _merge_(y, lse, sup.rows, yb, lb)
                del yb, lb
            for i, (c0, c1) in enumerate(ring.chunks if b else ()):
                cur = _kv_chunk(k, v, c0, c1)
                for t in range(b):
                    handle = nxt = None
                    if t + 1 < b:  # the chunk moves on while this rank computes on it
                        nxt = torch.empty_like(cur)
                        handle = shift_async(cur, nxt, comm)
                    g = ring.blocks[(me - t) % b][i]
                    if g.num_edges:
                        yb, lb = _block_forward(g, qc, cur[0].to(dt), cur[1].to(dt), scale,
                                                _slice(bc, g))
                        _merge_(y, lse, g.rows, yb, lb)
                        del yb, lb
                    if nxt is not None:
                        wait(handle, comm)
                        cur = nxt
        ctx.ring, ctx.scale, ctx.q_dtype = ring, scale, q.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.save_for_backward(qc, k, v, y, lse, ks, vs, bc)
        return y.to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        qc, k, v, y, lse, ks, vs, bc = ctx.saved_tensors
        ring: Ring = ctx.ring
        comm, me = ring.comm, ring.comm.rank
        b = ring.comm.size if qc.shape[1] else 0
        scale, dt = ctx.scale, qc.dtype
        with full_precision(qc.device):
            dy = grad.to(dt).contiguous()
            delta = (dy * y).sum(-1).t().contiguous()  # [h, n]
            dq = torch.zeros_like(qc)
            dkv = torch.zeros((2, *k.shape), dtype=dt, device=k.device)
            # every edge is in exactly one block: each block writes its own entries
            dbias = None if bc is None else torch.zeros_like(bc)
            dks = dvs = None
            if ks is not None:
                assert vs is not None
                dsup = torch.zeros((2, *ks.shape), dtype=dt, device=ks.device)
                sup = _super_block(ring, ks, qc.shape[1])
                if sup is not None:
                    _block_backward(sup, qc, _head_major(ks.to(dt)), _head_major(vs.to(dt)),
                                    lse, dy, delta, scale, dq, dsup, _slice(bc, sup), dbias)
                dks, dvs = dsup[0].to(ks.dtype), dsup[1].to(vs.dtype)
            for i, (c0, c1) in enumerate(ring.chunks if b else ()):
                cur = _kv_chunk(k, v, c0, c1)
                acc = acc_in = acc_handle = None
                for t in range(b):
                    handle = nxt = None
                    if t + 1 < b:
                        nxt = torch.empty_like(cur)
                        handle = shift_async(cur, nxt, comm)
                    g = ring.blocks[(me - t) % b][i]
                    if t == 0:  # this rank's own chunk: into its own gradient directly
                        target = dkv[:, c0:c1]
                    else:  # the accumulator of block (me - t), one step behind its K/V
                        if acc_handle is None:
                            acc = torch.zeros((2, c1 - c0, *k.shape[1:]), dtype=dt,
                                              device=k.device)
                        else:
                            wait(acc_handle, comm)
                            acc = acc_in
                        assert acc is not None
                        target = acc
                    if g.num_edges:
                        _block_backward(g, qc, cur[0].to(dt), cur[1].to(dt), lse, dy, delta,
                                        scale, dq, target, _slice(bc, g), dbias)
                    if t > 0:
                        acc_in = torch.empty_like(acc)
                        acc_handle = shift_async(acc, acc_in, comm)
                    if nxt is not None:
                        wait(handle, comm)
                        cur = nxt
                if acc_handle is not None:  # the own chunk's accumulator, home after b-1 hops
                    wait(acc_handle, comm)
                    assert acc_in is not None
                    dkv[:, c0:c1] += acc_in
        db = None if dbias is None or not ctx.needs_input_grad[5] else dbias.to(ctx.bias_dtype)
        return (dq.to(ctx.q_dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), dks, dvs, db, None,
                None)


def _slice(bias: Tensor | None, blk: ColumnBlock) -> Tensor | None:
    """A block's [h, E_block] bias out of the rank's [h, E] (its edges' columns)."""
    return None if bias is None else bias.index_select(1, blk.edges)


def _super_block(ring: Ring, ks: Tensor | None, heads: int) -> ColumnBlock | None:
    """The super keys' column block when there is work on it (keys, heads and edges)."""
    if ks is None or ring.super_block is None or not heads or not ring.super_block.num_edges:
        return None
    return ring.super_block


def ring_attention(q: Tensor, k: Tensor, v: Tensor, ring: Ring,
                   kv_super: tuple[Tensor, Tensor] | None = None, bias: Tensor | None = None
                   ) -> Tensor:
    """q [n, h, d'] rows of this rank, k, v [m, h, d'] this member's key rows -> y [n, h, d']
    (scale 1/sqrt(d'); rows with no neighbours give zeros). ``kv_super``: the super keys
    [S, h, d'] the ring's super block indexes (local, never sent). ``bias`` [h, E]: the edge
    bias of the rank's whole pattern, sliced per block (MegaGraph's bias slicing)."""
    if (kv_super is None) != (ring.super_block is None):
        raise ValueError("ring attention: super K/V and the super column block go together")
    ks, vs = kv_super if kv_super is not None else (None, None)
    return RingAttentionFunction.apply(q, k, v, ks, vs, bias, ring,
                                       1.0 / math.sqrt(q.shape[-1]))


# --------------------------------------------------------------------------- cost and memory
def ring_comm(m: int, heads: int, head_dim: int, members: int, chunks: int, esize: int
              ) -> list[CommOp]:
    """One ring attention's point-to-point steps on a member, forward then backward: per
    non-empty chunk of r rows, b-1 K/V sends of 2·r·h·d' elements forward, and in backward
    b-1 again plus b-1 of the dK/dV accumulators (float32 at least, like the sums); each
    b-1 repeated sends as one op of ``count`` b-1."""
    if members == 1 or heads == 0:
        return []
    ops: list[CommOp] = []
    acc_esize = max(esize, 4)
    for c0, c1 in chunk_bounds(m, chunks):
        kv = 2 * (c1 - c0) * heads * head_dim * esize
        acc = 2 * (c1 - c0) * heads * head_dim * acc_esize
        k = members - 1
        ops += [CommOp("send_recv", kv, kv, count=k),
                CommOp("send_recv", kv, kv, "backward", count=k),
                CommOp("send_recv", acc, acc, "backward", count=k)]
    return ops


INDEX_BYTES = 8
GRAPH_BYTES_PER_EDGE = 48
"""As :mod:`plexgt.parallel.attention.strategy` counts them (int64 indices, the transpose's,
the row ids, the permutations, the int32 copies the compiled and the fused kernels read)."""


def ring_graph_bytes(rows: int, members: int, m: int, chunks: int, edges: int) -> int:
    """A ring rank's pattern: the kept whole pattern's index arrays and its column blocks,
    each with row pointers and row ids over its present rows (at most its edges) and its
    transpose's pointers over the chunk's key rows, plus the per-edge arrays of them all."""
    blocks = members * len(chunk_bounds(m, chunks))
    present = min(edges, blocks * rows)
    pointers = blocks + 2 * present + members * m + blocks
    return (rows + 1 + edges + pointers) * INDEX_BYTES + edges * GRAPH_BYTES_PER_EDGE


def ring_memory_elems(n: int, m: int, heads: int, head_dim: int, members: int,
                      chunks: int) -> tuple[int, int]:
    """(kept, transient) elements of one ring attention beyond the row-local layers'.

    Kept until the layer's backward: its own K, V (2·m·h·d'), the output (n·h·d') and the lse
    ([h, n]). Transient, one layer at a time: its K, V gradients (2·m·h·d'), two K/V pieces
    and two accumulators in flight (8·ceil(m/c)·h·d', none on one member) and delta [h, n].
    The all-gather it replaces keeps 2·b·m·h·d' a layer and adds as much in backward."""
    dhw = heads * head_dim
    piece = -(-m // chunks) if members > 1 else 0
    return (2 * m + n) * dhw + heads * n, (2 * m + 8 * piece) * dhw + heads * n
