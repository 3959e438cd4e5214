"""GP-AG: graph attention over a node partition, K and V all-gathered.

Rank r of p holds rows [N/p] (block r in Q order, double-permuted so every block has about
E/p edges) and computes its own q, k, v [N/p, h, d'] with replicated projections. Then

forward
    K [N/p, h, d'] --all-gather--> [N, h, d']      before the SDDMM (scores of local rows)
    V [N/p, h, d'] --all-gather--> [N, h, d']      before the SpMM
    y [N/p, h, d'] = softmax_rows(q Kᵀ ⊙ A[rows, :]) V   the single-rank kernel, all heads
backward (the adjoints of the collectives; nothing hand-written)
    dK, dV [N, h, d'] partial sums of every rank --reduce-scatter--> [N/p, h, d']

Why: communication is 4·N·d per rank whatever p is (no strong scaling of traffic), but the
graph is stored once in total (N/p + E/p per rank) and every rank computes all heads, so it
wins when heads are few or the graph is too big to replicate.
"""

from __future__ import annotations

import torch

from plexgt.distributed.collectives import (
    CommOp,
    all_gather,
    all_gather_bytes,
    reduce_scatter_bytes,
)
from plexgt.ops.attention import sparse_attention
from plexgt.parallel.attention.strategy import (
    AttentionProblem,
    AttentionShard,
    AttentionStrategy,
    KernelWork,
    MemoryEstimate,
    SuperKV,
    graph_bytes,
    score_terms,
)

Tensor = torch.Tensor


def gp_ag_forward(shard: AttentionShard, q: Tensor, k: Tensor, v: Tensor,
                  block_rows: int | None = None, kv_super: SuperKV | None = None,
                  bias: Tensor | None = None) -> Tensor:
    """q, k, v [N/p, h, d'] (rows over the group) -> y [N/p, h, d'] (rows over the group).

    The local pattern is [N/p, p·N/p (+S)]; gathered K and V rows are in group-rank order,
    which is Q order, so the pattern's global column ids index them directly (the super
    nodes' K/V follow them).
    """
    k_all = all_gather(k, shard.comm, dim=0)
    v_all = all_gather(v, shard.comm, dim=0)
    if kv_super is not None:
        k_all, v_all = torch.cat([k_all, kv_super[0]]), torch.cat([v_all, kv_super[1]])
    return sparse_attention(shard.graph, q, k_all, v_all, block_rows=block_rows, bias=bias)


def gp_ag_comm(problem: AttentionProblem, rank: int, p: int) -> list[CommOp]:
    """GP-AG: all-gather K and V [N/p, d] (forward), reduce-scatter dK and dV (backward)."""
    if p == 1:
        return []
    shard = problem.rows(p) * problem.d * problem.esize
    ag = all_gather_bytes(shard, p)
    rs = reduce_scatter_bytes(p * shard, p)
    return [CommOp("all_gather", ag, ag), CommOp("all_gather", ag, ag),
            CommOp("reduce_scatter", rs, rs, "backward"),
            CommOp("reduce_scatter", rs, rs, "backward")]


def gp_ag_memory(problem: AttentionProblem, p: int) -> MemoryEstimate:
    """4·N·d (gathered K, V and their full-size gradients) + E·h/p (scores of local rows;
    blocked: the [h, N/p] log-sum-exp, :func:`score_terms`): Table 1's elements. Of its
    bytes a layer keeps the gathered K, V and the scores until its backward; the gradients
    [N, d] twice exist during that backward only (``transient_bytes``: one layer's at a time,
    which a model of L layers counts once, not L times)."""
    n_pad = p * problem.rows(p)
    e_loc = -(-problem.e // p)
    kept, scores, _ = score_terms(problem, problem.rows(p), e_loc, problem.heads)
    act = 4 * n_pad * problem.d + kept
    grads = 2 * n_pad * problem.d
    return MemoryEstimate(act, (act - grads) * problem.esize,
                          graph_bytes(problem.rows(p), n_pad, e_loc), scores,
                          grads * problem.esize)


def gp_ag_work(problem: AttentionProblem, p: int) -> KernelWork:
    """Every head on E/p edges; the kernel streams all N gathered columns (N/p of them its
    own); blocked, a launch per block and head and the SDDMM redone in backward."""
    n_loc = problem.rows(p)
    blocks = score_terms(problem, n_loc, -(-problem.e // p), problem.heads)[2]
    return KernelWork(problem.heads, problem.e / p, n_loc, p * n_loc, n_loc, launches=blocks,
                      recompute=int(blocks > 1))


GP_AG = AttentionStrategy(
    name="gp_ag",
    description="node partition; all-gather K, V; reduce-scatter dK, dV",
    forward=gp_ag_forward,
    comm=gp_ag_comm,
    memory=gp_ag_memory,
    work=gp_ag_work,
    full_graph=False,
)
