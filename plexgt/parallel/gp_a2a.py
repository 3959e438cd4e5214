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

import torch

from plexgt.dist.collectives import all_to_all
from plexgt.ops.attention import sparse_attention
from plexgt.parallel.attention_cost import gp_a2a_comm, gp_a2a_memory
from plexgt.parallel.strategies import AttentionShard, AttentionStrategy

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


GP_A2A = AttentionStrategy(
    name="gp_a2a",
    description="head partition; all-to-all Q, K, V to heads and Y back",
    forward=gp_a2a_forward,
    comm=gp_a2a_comm,
    memory=gp_a2a_memory,
    full_graph=True,
)
