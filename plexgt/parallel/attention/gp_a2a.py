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

from plexgt.distributed.collectives import CommOp
from plexgt.ops.attention import sparse_attention
from plexgt.parallel.attention.heads import heads_to_nodes, my_heads, nodes_to_heads
from plexgt.parallel.attention.strategy import (
    AttentionProblem,
    AttentionShard,
    AttentionStrategy,
    KernelWork,
    MemoryEstimate,
    SuperKV,
    graph_bytes,
    heads_of,
    score_terms,
)

Tensor = torch.Tensor


def gp_a2a_forward(shard: AttentionShard, q: Tensor, k: Tensor, v: Tensor,
                   block_rows: int | None = None, kv_super: SuperKV | None = None,
                   bias: Tensor | None = None) -> Tensor:
    """q, k, v [N/p, h, d'] (rows over the group) -> y [N/p, h, d'] (rows over the group);
    the super nodes' K/V (this rank's heads) follow the N rows' after the exchange."""
    comm, n_loc, h = shard.comm, shard.n_loc, shard.heads
    qh, kh, vh = (nodes_to_heads(t, comm, n_loc, h) for t in (q, k, v))
    h0, h1 = my_heads(h, comm)
    if kv_super is not None:
        kh = torch.cat([kh, kv_super[0][:, h0:h1]])
        vh = torch.cat([vh, kv_super[1][:, h0:h1]])
    b = None if bias is None else bias[h0:h1]
    y = sparse_attention(shard.graph, qh, kh, vh, block_rows=block_rows, bias=b)
    return heads_to_nodes(y, comm, n_loc, h)




def gp_a2a_comm(problem: AttentionProblem, rank: int, p: int) -> list[CommOp]:
    """GP-A2A: Q, K, V node -> head partition, Y back (forward); the adjoints (backward).

    A rank holding h_j of the h heads sends (h - h_j) heads of its n rows and receives its
    h_j heads of the other p-1 ranks' rows on every node->head exchange; head->node is the
    reverse. Each of the 8 calls moves (p-1)/p·n·d elements when p divides h.
    """
    if p == 1:
        return []
    hj = heads_of(problem.heads, p, rank)
    row = problem.rows(p) * problem.head_dim * problem.esize
    to_heads = ((problem.heads - hj) * row, (p - 1) * hj * row)
    to_nodes = (to_heads[1], to_heads[0])
    fwd = [to_heads] * 3 + [to_nodes]
    bwd = [to_heads] + [to_nodes] * 3
    return ([CommOp("all_to_all", s, r) for s, r in fwd]
            + [CommOp("all_to_all", s, r, "backward") for s, r in bwd]
           )


def gp_a2a_memory(problem: AttentionProblem, p: int) -> MemoryEstimate:
    """4·N·d/p (Table 1: Q, K, V, Y of this rank's heads over all nodes) + E·h/p (its
    heads' scores; blocked: their [h/p, N] log-sum-exp, :func:`score_terms`). Of them a layer
    keeps K, V [N, h/p, d'] and the scores until its backward: its Q (N·d/p elements, as
    many as a node-partitioned rank's) is the dense activations' head-major Q
    (:func:`plexgt.plan.step_cost.dense_activation_elems`), and Y goes back to the nodes by
    an all-to-all that saves nothing. The backward's dK, dV of its heads (2·N·d/p) exist
    during one layer's backward only (``transient_bytes``). Measured (one training step's
    live tensors, 2 ranks, 4 heads): each layer kept 3·N·d/p of head-layout Q, K, V, not
    the 5·N·d/p that counting Table 1's four beside the dense Q made."""
    n_pad = p * problem.rows(p)
    h_max = heads_of(problem.heads, p, 0)
    kept, scores, _ = score_terms(problem, n_pad, problem.e, h_max)
    grads = 2 * n_pad * h_max * problem.head_dim
    act = 2 * grads + kept
    return MemoryEstimate(act, (act - grads) * problem.esize,
                          graph_bytes(n_pad, n_pad, problem.e), scores, grads * problem.esize)


def gp_a2a_work(problem: AttentionProblem, p: int) -> KernelWork:
    """ceil(h/p) heads on all E edges, N rows and columns, and the layout permutes; blocked,
    a launch per block and head and the SDDMM redone in backward."""
    n_pad = p * problem.rows(p)
    h_max = heads_of(problem.heads, p, 0)
    copies = n_pad * h_max * problem.head_dim if p > 1 else 0
    blocks = score_terms(problem, n_pad, problem.e, h_max)[2]
    return KernelWork(h_max, problem.e, n_pad, n_pad, n_pad, launches=blocks,
                      recompute=int(blocks > 1), copy_elems=copies)


GP_A2A = AttentionStrategy(
    name="gp_a2a",
    description="head partition; all-to-all Q, K, V to heads and Y back",
    forward=gp_a2a_forward,
    comm=gp_a2a_comm,
    memory=gp_a2a_memory,
    work=gp_a2a_work,
    full_graph=True,
)
