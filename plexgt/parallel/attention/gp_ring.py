"""GP-Ring: graph attention over a node partition, K and V rotated around a ring of the p ranks.

Rank r of p holds rows [N/p] (block r in Q order, double-permuted, about E/p edges) and its own
q, k, v [N/p, h, d'] from replicated projections, like GP-AG. Its pattern rows [N/p, p·N/p] are
cut into p column blocks, one per source rank (and each into ``ring_chunks`` pieces). Then
(:mod:`plexgt.parallel.attention.ring`)

forward, t = 0 … p-1
    attend the rows to the K/V block of rank r-t (SDDMM on that column block, online softmax)
    while that block moves on to rank r+1 (non-blocking point-to-point, overlapped)
backward
    K/V rotate again, scores recomputed from the saved log-sum-exp; each block's dK/dV
    accumulator follows one step behind and reaches its owner after p-1 steps

Why: GP-AG's all-gather puts 2·N·d of K and V (and 2·N·d of their gradients) on every rank,
57 GB at papers100M's size and hidden 128: no number of ranks makes it fit. The ring holds
2·(N/p)·d of its own plus the pieces in flight, for the same forward bytes as the all-gather
and twice them in backward. ``block_rows`` does not apply: the column blocks already bound
the kernel's temporaries to one block's edges.
"""

from __future__ import annotations

import torch

from plexgt.distributed.collectives import CommOp
from plexgt.parallel.attention.ring import (
    Ring,
    chunk_bounds,
    ring_attention,
    ring_comm,
    ring_graph_bytes,
    ring_memory_elems,
    ring_shard,
)
from plexgt.parallel.attention.strategy import (
    AttentionProblem,
    AttentionShard,
    AttentionStrategy,
    KernelWork,
    MemoryEstimate,
    SuperKV,
)

Tensor = torch.Tensor


def _prepare(shard: AttentionShard) -> AttentionShard:
    return ring_shard(shard, shard.comm.size, shard.n_loc)


def gp_ring_forward(shard: AttentionShard, q: Tensor, k: Tensor, v: Tensor,
                    block_rows: int | None = None, kv_super: SuperKV | None = None,
                    bias: Tensor | None = None) -> Tensor:
    """q, k, v [N/p, h, d'] (rows over the group) -> y [N/p, h, d'] (rows over the group);
    the super nodes' K/V stay put (one local column block)."""
    ring = Ring(shard.comm, shard.blocks, shard.chunk_bounds, shard.super_block)
    return ring_attention(q, k, v, ring, kv_super, bias)


def gp_ring_comm(problem: AttentionProblem, rank: int, p: int) -> list[CommOp]:
    """p-1 K/V sends per chunk forward; p-1 K/V and p-1 dK/dV accumulator sends backward."""
    return ring_comm(problem.rows(p), problem.heads, problem.head_dim, p, problem.ring_chunks,
                     problem.esize)


def gp_ring_memory(problem: AttentionProblem, p: int) -> MemoryEstimate:
    """Kept a layer: own K, V, the output and its lse; transient: their gradients and the
    pieces in flight (:func:`~plexgt.parallel.attention.ring.ring_memory_elems`), plus one
    column block's [h, E/p²] scores."""
    n_loc = problem.rows(p)
    c = len(chunk_bounds(n_loc, problem.ring_chunks)) or 1
    e_loc = -(-problem.e // p)
    e_blk = -(-e_loc // (p * c))
    kept, transient = ring_memory_elems(n_loc, n_loc, problem.heads, problem.head_dim, p,
                                        problem.ring_chunks)
    return MemoryEstimate(kept, kept * problem.esize,
                          ring_graph_bytes(n_loc, p, n_loc, problem.ring_chunks, e_loc),
                          e_blk * problem.heads, transient * problem.esize)


def gp_ring_work(problem: AttentionProblem, p: int) -> KernelWork:
    """Every head on E/p edges over p·c column blocks; scores rebuilt in backward; a merge
    of [N/p, h, d'] per block after the first."""
    n_loc = problem.rows(p)
    blocks = p * (len(chunk_bounds(n_loc, problem.ring_chunks)) or 1)
    return KernelWork(problem.heads, problem.e / p, n_loc, p * n_loc, n_loc, launches=blocks,
                      recompute=1, merge_elems=(blocks - 1) * n_loc * problem.d)


GP_RING = AttentionStrategy(
    name="gp_ring",
    description="node partition; K, V rotated around a ring, online softmax",
    forward=gp_ring_forward,
    comm=gp_ring_comm,
    memory=gp_ring_memory,
    work=gp_ring_work,
    full_graph=False,
    prepare=_prepare,
    rings=True,
)
