"""GP-A2A: graph attention over a head partition, reached and left by all-to-all.

Rank r of p computes q, k, v [N/p, h, d'] for its rows (node partition, like every other layer),
then

forward
    Q, K, V [N/p, h, d'] --all-to-all--> [N, h_r, d']   node partition -> head partition
    y = softmax_rows(Q Kᵀ ⊙ A) V over the whole graph for its h_r heads (single-rank kernel)
    Y [N, h_r, d'] --all-to-all--> [N/p, h, d']          back to the node partition
backward (the adjoint all-to-alls: splits swapped)
    dY to heads; the kernel's dQ, dK, dV back to nodes

h_r = h//p (+1 on the first h%p ranks): uneven splits when p does not divide h, and ranks
without a head when h < p; they still take part in every exchange.

Why: 8 all-to-alls move 8·N·d/p per rank, shrinking with p, and activations are 4·N·d/p +
E·h/p; the price is the whole graph (N + E) on every rank.
"""

from __future__ import annotations

import functools

import torch

from plexgt.distributed.collectives import CommOp, all_to_all
from plexgt.ops.attention import sparse_attention
from plexgt.parallel.attention.strategy import (
    AttentionProblem,
    AttentionShard,
    AttentionStrategy,
    MemoryEstimate,
    graph_bytes,
    head_splits,
)

Tensor = torch.Tensor


def nodes_to_heads(x: Tensor, shard: AttentionShard) -> Tensor:
    """[N/p, h, d'] rows over the group -> [p·N/p, h_r, d'] (a view of head-major memory).

    Head-major rows [h, N/p, d'] are cut by head blocks (h_j·N/p rows to rank j); rank r
    receives [p, h_r, N/p, d'], which reordered is [h_r, N, d'] in Q order.
    """
    comm, n_loc = shard.comm, shard.n_loc
    hs = shard.head_splits
    h_me, p = hs[comm.rank], comm.size
    d = x.shape[2]
    flat = x.transpose(0, 1).reshape(-1, d)
    got = all_to_all(flat, comm, [hj * n_loc for hj in hs], [h_me * n_loc] * p, dim=0)
    heads = got.view(p, h_me, n_loc, d).transpose(0, 1).reshape(h_me, p * n_loc, d)
    return heads.transpose(0, 1)


def heads_to_nodes(y: Tensor, shard: AttentionShard) -> Tensor:
    """[p·N/p, h_r, d'] (head partition) -> [N/p, h, d'] this rank's rows of every head."""
    comm, n_loc = shard.comm, shard.n_loc
    hs = shard.head_splits
    h_me, p = hs[comm.rank], comm.size
    d = y.shape[2]
    blocks = y.transpose(0, 1).reshape(h_me, p, n_loc, d).transpose(0, 1).reshape(-1, d)
    got = all_to_all(blocks, comm, [h_me * n_loc] * p, [hj * n_loc for hj in hs], dim=0)
    return got.view(sum(hs), n_loc, d).transpose(0, 1)


def gp_a2a_forward(shard: AttentionShard, q: Tensor, k: Tensor, v: Tensor,
                   block_rows: int | None = None) -> Tensor:
    """q, k, v [N/p, h, d'] (rows over the group) -> y [N/p, h, d'] (rows over the group)."""
    qh, kh, vh = (nodes_to_heads(t, shard) for t in (q, k, v))
    y = sparse_attention(shard.graph, qh, kh, vh, block_rows=block_rows)
    return heads_to_nodes(y, shard)


_head_splits = functools.lru_cache(maxsize=64)(head_splits)
"""head_splits, kept: the cost model asks each of p ranks for its share (O(p) to build)."""


def gp_a2a_comm(problem: AttentionProblem, rank: int, p: int) -> list[CommOp]:
    """GP-A2A: Q, K, V node -> head partition, Y back (forward); the adjoints (backward).

    A rank holding h_j of the h heads sends (h - h_j) heads of its n rows and receives its
    h_j heads of the other p-1 ranks' rows on every node->head exchange; head->node is the
    reverse. Each of the 8 calls moves (p-1)/p·n·d elements when p divides h.
    """
    if p == 1:
        return []
    hj = _head_splits(problem.heads, p)[rank]
    row = problem.rows(p) * problem.head_dim * problem.esize
    to_heads = ((problem.heads - hj) * row, (p - 1) * hj * row)
    to_nodes = (to_heads[1], to_heads[0])
    fwd = [to_heads] * 3 + [to_nodes]
    bwd = [to_heads] + [to_nodes] * 3
    return ([CommOp("all_to_all", s, r) for s, r in fwd]
            + [CommOp("all_to_all", s, r, "backward") for s, r in bwd])


def gp_a2a_memory(problem: AttentionProblem, p: int) -> MemoryEstimate:
    """4·N·d/p (Q, K, V, Y of this rank's heads over all nodes) + E·h/p (its heads' scores)."""
    n_pad = p * problem.rows(p)
    h_max = head_splits(problem.heads, p)[0]
    act = 4 * n_pad * h_max * problem.head_dim + problem.e * h_max
    return MemoryEstimate(act, act * problem.esize, graph_bytes(n_pad, n_pad, problem.e),
                          problem.e * h_max)


GP_A2A = AttentionStrategy(
    name="gp_a2a",
    description="head partition; all-to-all Q, K, V to heads and Y back",
    forward=gp_a2a_forward,
    comm=gp_a2a_comm,
    memory=gp_a2a_memory,
    full_graph=True,
)
