"""Bytes and memory of distributed graph attention: Table 1 of Lin, Madduri & Kandemir, exact.

Per attention block and rank, with n = ceil(N/p) padded rows per rank, d = h·d', element size e:

============  =========================================  =====================================
strategy      communication (per rank, forward+backward)  memory (per rank)
============  =========================================  =====================================
GP-AG         2 all-gather (K, V) + 2 reduce-scatter       activations 4·N·d + E·h/p;
              (dK, dV): 4·(p-1)·n·d·e ≈ 4·N·d elements     graph N/p + E/p
GP-A2A        8 all-to-all (Q, K, V, Y and their           activations 4·N·d/p + E·h/p;
              gradients): 8·(p-1)·n·d·e/p ≈ 8·N·d/p        graph N + E
============  =========================================  =====================================

The byte functions call the collectives' own per-rank formulas (:mod:`plexgt.dist.collectives`),
so a run's :class:`~plexgt.dist.collectives.CommLedger` equals them to the byte; with h not
divisible by p, GP-A2A's per-rank bytes follow the uneven head split (sent and received then
differ per rank). Model-level functions add the parts outside attention: the GCN path of GPS
(1D layout, or 3D on a grid with its redistribution), the loss statistics and the gradient
all-reduce of the replicated parameters.
"""

from __future__ import annotations

import functools
from collections import defaultdict

from plexgt.dist.collectives import all_gather_bytes, all_reduce_bytes, reduce_scatter_bytes
from plexgt.dist.grid import Grid3D
from plexgt.parallel.strategies import (
    AttentionProblem,
    AttentionStrategy,
    CommOp,
    MemoryEstimate,
    head_splits,
)

INDEX_BYTES = 8
"""int64 row pointers."""
GRAPH_BYTES_PER_EDGE = 48
"""What a :class:`~plexgt.ops.csr.CSRGraph` keeps per edge once attention has run on it:
indices and row ids (int64), the transpose's indices and the two edge permutations (int64),
and the int32 index copies torch's CPU sparse kernels use for the matrix and its transpose."""

_head_splits = functools.lru_cache(maxsize=64)(head_splits)
"""head_splits, kept: the cost model asks each of p ranks for its share (O(p) to build)."""


# -- Table 1: communication -------------------------------------------------------------------
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


# -- Table 1: memory --------------------------------------------------------------------------
def graph_bytes(rows: int, cols: int, edges: int) -> int:
    """Bytes of a stored [rows, cols] pattern of ``edges`` entries and its transpose."""
    return (rows + 1 + cols + 1) * INDEX_BYTES + edges * GRAPH_BYTES_PER_EDGE


def gp_ag_memory(problem: AttentionProblem, p: int) -> MemoryEstimate:
    """4·N·d (gathered K, V and their full-size gradients) + E·h/p (scores of local rows)."""
    n_pad = p * problem.rows(p)
    e_loc = -(-problem.e // p)
    act = 4 * n_pad * problem.d + e_loc * problem.heads
    return MemoryEstimate(act, act * problem.esize, graph_bytes(problem.rows(p), n_pad, e_loc),
                          e_loc * problem.heads)


def gp_a2a_memory(problem: AttentionProblem, p: int) -> MemoryEstimate:
    """4·N·d/p (Q, K, V, Y of this rank's heads over all nodes) + E·h/p (its heads' scores)."""
    n_pad = p * problem.rows(p)
    h_max = head_splits(problem.heads, p)[0]
    act = 4 * n_pad * h_max * problem.head_dim + problem.e * h_max
    return MemoryEstimate(act, act * problem.esize, graph_bytes(n_pad, n_pad, problem.e),
                          problem.e * h_max)


def table1(problem: AttentionProblem, p: int) -> dict[str, dict[str, float]]:
    """The paper's closed forms in elements (for printing next to the exact functions)."""
    n, e, d, h = problem.n, problem.e, problem.d, problem.heads
    return {
        "gp_ag": {"calls": 4, "comm_elems": 4 * n * d, "act_elems": 4 * n * d + e * h / p,
                  "graph": n / p + e / p},
        "gp_a2a": {"calls": 8, "comm_elems": 8 * n * d / p,
                   "act_elems": 4 * n * d / p + e * h / p, "graph": n + e},
    }


# -- whole models -----------------------------------------------------------------------------
def gcn1d_comm(problem: AttentionProblem, p: int) -> list[CommOp]:
    """GPS local path in the 1D layout: all-gather X·W [N/p, d], reduce-scatter its gradient."""
    if p == 1:
        return []
    shard = problem.rows(p) * problem.d * problem.esize
    ag = all_gather_bytes(shard, p)
    rs = reduce_scatter_bytes(p * shard, p)
    return [CommOp("all_gather", ag, ag), CommOp("reduce_scatter", rs, rs, "backward")]


def step_comm_named(strategy: AttentionStrategy, problem: AttentionProblem, rank: int,
                    p: int, layers: int, num_params: int, gcn: bool = False,
                    gcn_grid: Grid3D | None = None, block_rows: int | None = None
                    ) -> list[tuple[str, CommOp]]:
    """Every collective of one training step on ``rank``, with the name of the group it runs
    over (the ledger's view): 'rows' (all p ranks) or a grid axis 'x', 'y', 'z'.

    Per layer the attention block's collectives and, for gps (gcn=True), the GCN path's: the
    1D layout's (:func:`gcn1d_comm`) or, given ``gcn_grid`` (p ranks; ``block_rows``: the
    blocked aggregation's rows), the 3D path's with its redistribution all-to-alls
    (:func:`~plexgt.parallel.redistribute.gcn3d_comm`); then the loss statistics (sum, count:
    2 elements) and one all-reduce of every parameter gradient, over 'rows'.
    """
    gcn3: list[tuple[str, CommOp]] = []
    if gcn and gcn_grid is not None:
        if gcn_grid.size != p:
            raise ValueError(f"GCN grid {gcn_grid} has {gcn_grid.size} ranks, not {p}")
        from plexgt.parallel.redistribute import gcn3d_comm

        gcn3 = gcn3d_comm(gcn_grid, rank, problem.n, problem.d, problem.esize, block_rows)
    ops: list[tuple[str, CommOp]] = []
    for _ in range(layers):
        ops += [("rows", o) for o in strategy.comm(problem, rank, p)]
        if gcn and gcn_grid is None:
            ops += [("rows", o) for o in gcn1d_comm(problem, p)]
        ops += gcn3
    if p > 1:
        b = all_reduce_bytes(2 * problem.esize, p)
        ops.append(("rows", CommOp("all_reduce", b, b)))
        b = all_reduce_bytes(num_params * problem.esize, p)
        ops.append(("rows", CommOp("all_reduce", b, b, "backward")))
    return ops


def step_comm(strategy: AttentionStrategy, problem: AttentionProblem, rank: int, p: int,
              layers: int, num_params: int, gcn: bool = False,
              gcn_grid: Grid3D | None = None, block_rows: int | None = None) -> list[CommOp]:
    """Every collective of one training step of a distributed gt (gcn=False) or gps model
    (:func:`step_comm_named` without the group names)."""
    return [o for _, o in step_comm_named(strategy, problem, rank, p, layers, num_params, gcn,
                                          gcn_grid, block_rows)]


def step_bytes(strategy: AttentionStrategy, problem: AttentionProblem, rank: int, p: int,
               layers: int, num_params: int, gcn: bool = False, kind: str = "sent",
               gcn_grid: Grid3D | None = None, block_rows: int | None = None
               ) -> dict[str, int]:
    """Bytes ``kind`` ('sent' or 'recv') per operation name in one step (ledger's view):
    :func:`step_bytes_named` summed over the groups, operations of 0 bytes kept."""
    out: dict[str, int] = defaultdict(int)
    for (_, op), b in step_bytes_named(strategy, problem, rank, p, layers, num_params, gcn,
                                       kind, gcn_grid, block_rows, keep_zero=True).items():
        out[op] += b
    return dict(out)


def step_bytes_named(strategy: AttentionStrategy, problem: AttentionProblem, rank: int, p: int,
                     layers: int, num_params: int, gcn: bool = False, kind: str = "sent",
                     gcn_grid: Grid3D | None = None, block_rows: int | None = None,
                     keep_zero: bool = False) -> dict[tuple[str, str], int]:
    """Bytes ``kind`` per (group name, operation) in one step: the keys of a
    :class:`~plexgt.dist.collectives.CommLedger` (entries of 0 bytes left out unless
    ``keep_zero``)."""
    out: dict[tuple[str, str], int] = defaultdict(int)
    for name, op in step_comm_named(strategy, problem, rank, p, layers, num_params, gcn,
                                    gcn_grid, block_rows):
        out[name, op.op] += op.sent if kind == "sent" else op.recv
    return {k: v for k, v in out.items() if v or keep_zero}


def dense_activation_elems(n_rows: int, d: int, ffn_mult: int, gcn: bool) -> int:
    """Elements a block keeps for backward outside Table 1's attention terms, ``n_rows`` rows.

    The block input (saved by the Q, K, V, O projections), this rank's head-major Q, the first
    residual sum and its LayerNorm output, the FFN's ReLU output [n, m·d] and the second
    residual sum: (5 + m)·d a row. GPS adds the GCN path's sum and LayerNorm output, the
    attention path's LayerNorm output and the sum of both paths: 4·d.
    """
    return n_rows * (5 + ffn_mult + (4 if gcn else 0)) * d


def model_memory(strategy: AttentionStrategy, problem: AttentionProblem, p: int, layers: int,
                 features: int, classes: int, num_params: int, ffn_mult: int = 2,
                 gcn: bool = False, gcn_grid: Grid3D | None = None) -> dict[str, int]:
    """Per-rank bytes of a training step: attention (Table 1 per layer, plus the backward's
    three [h, E/p] temporaries of one layer), dense activations, graphs, features, and
    parameters with gradients and two AdamW moments (4 copies).

    For gps the GCN operator is this rank's Â rows [N/p, N] (1D) or, on ``gcn_grid``, its Â
    block [N/Gz, N/Gx] of E/(Gx·Gz) entries, whose layer also keeps the aggregate
    [N/Gz, d/Gy] for the weight gradient."""
    e = problem.esize
    att = strategy.memory(problem, p)
    n_loc = problem.rows(p)
    dense = layers * dense_activation_elems(n_loc, problem.d, ffn_mult, gcn) * e
    # input projection and classifier (2·d), logits and their gradient (2·C), and the
    # gradients of one block in flight during backward (4·d)
    dense += n_loc * (6 * problem.d + 2 * classes) * e
    graphs = att.graph_bytes
    if gcn and gcn_grid is not None:
        from plexgt.parallel.layout3d import layer_layouts

        lay = layer_layouts(gcn_grid, 0, problem.n, [problem.d, problem.d])[0]
        nnz = -(-problem.e // (lay.g[0] * lay.g[2]))
        graphs += graph_bytes(lay.rows_pad, lay.cols_pad, nnz) + nnz * e
        dense += layers * lay.rows_pad * (lay.d_in // lay.g[1]) * e
    elif gcn:
        graphs += graph_bytes(n_loc, p * n_loc, -(-problem.e // p)) + (
            -(-problem.e // p)) * e
    out = {
        "attention_activations": layers * att.activation_bytes + 3 * att.score_elems * e,
        "dense_activations": dense,
        "graph": graphs,
        "features": n_loc * features * e,
        "parameters": 4 * num_params * e,
    }
    out["total"] = sum(out.values())
    return out
