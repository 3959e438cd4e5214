"""Global super nodes: S virtual nodes every node attends to and that attend to every node.

Shapes: real rows x [N, d] (q, k, v [N, h, d']), super states z [S, d] (qs, ks, vs [S, h, d']).

* A real row attends to its graph neighbours **and** to the S super nodes: its pattern gains S
  dense columns after the real ones (:func:`super_columns`), and K/V gain the S super rows, so
  every attention kernel and strategy computes the exact softmax over both with no change.
* A super row attends to all N real nodes and the S super nodes: dense, [h, S, N + S] scores.
  Distributed, each rank holds a slice of the real rows and computes the partial softmax state
  of its slice (:func:`partial_state`); the states of all ranks merge into the exact softmax by
  the log-sum-exp rule: a max over ranks, then sums of exp(s - max) and exp(s - max)·v.

Why these and not an all-gather of the graph: a super row's N scores never exist on one rank,
and the real rows' S extra columns cost S·N edges in all, spread with the rows.
"""

from __future__ import annotations

import torch

from plexgt.ops.csr import CSRGraph

Tensor = torch.Tensor


def super_positions(graph: CSRGraph, s: int, rows: int) -> Tensor:
    """[E] where each edge of ``graph`` lands in :func:`super_columns`' pattern (per-edge data
    such as an edge bias moves with it; the super entries take none)."""
    rows = max(0, min(rows, graph.num_rows))
    old = torch.arange(graph.num_edges, dtype=torch.int64, device=graph.indptr.device)
    return old + max(s, 0) * torch.clamp(graph.row, max=rows)


def super_columns(graph: CSRGraph, s: int, rows: int) -> CSRGraph:
    """[R, C] pattern -> [R, C + S]: each of the first ``rows`` rows gains the S columns
    C … C+S-1 (after its own, so columns stay sorted); the other rows (padding) gain none."""
    if s <= 0:
        return graph
    n, dev = graph.num_rows, graph.indptr.device
    rows = max(0, min(rows, n))
    deg = graph.indptr[1:] - graph.indptr[:-1]
    extra = torch.zeros(n, dtype=torch.int64, device=dev)
    extra[:rows] = s
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    torch.cumsum(deg + extra, 0, out=indptr[1:])
    indices = torch.empty(int(indptr[-1]), dtype=torch.int64, device=dev)
    old = super_positions(graph, s, rows)
    indices[old] = graph.indices
    cols = graph.num_cols + torch.arange(s, dtype=torch.int64, device=dev)
    if rows:
        pos = (indptr[1:rows + 1] - s).unsqueeze(1) + torch.arange(s, device=dev)
        indices[pos.reshape(-1)] = cols.repeat(rows)
    values = None
    if graph.values is not None:
        values = torch.ones(indices.numel(), dtype=graph.values.dtype, device=dev)
        values[old] = graph.values
    return CSRGraph(indptr, indices, n, graph.num_cols + s, values)


def edge_bias_with_super(bias: Tensor, graph: CSRGraph, s: int, rows: int) -> Tensor:
    """[h, E] bias of ``graph``'s edges -> [h, E + rows·S] on :func:`super_columns`' pattern,
    zero on the super entries (differentiable)."""
    if s <= 0:
        return bias
    out = bias.new_zeros(bias.shape[0], graph.num_edges + s * max(0, min(rows, graph.num_rows)))
    return out.index_copy(1, super_positions(graph, s, rows), bias)


def scores(qs: Tensor, k: Tensor, scale: float) -> Tensor:
    """qs [S, h, d'], k [n, h, d'] -> [h, S, n] scaled dot products."""
    return torch.einsum("shd,nhd->hsn", qs, k) * scale


def row_max(qs: Tensor, k: Tensor, scale: float) -> Tensor:
    """[h, S] maxima of :func:`scores` (-inf where k has no rows); no gradient (a shift the
    softmax does not depend on)."""
    with torch.no_grad():
        if k.shape[0] == 0:
            return torch.full((qs.shape[1], qs.shape[0]), float("-inf"), dtype=qs.dtype,
                              device=qs.device)
        return scores(qs, k, scale).amax(-1)


def partial_state(qs: Tensor, k: Tensor, v: Tensor, scale: float, shift: Tensor
                  ) -> tuple[Tensor, Tensor]:
    """The unnormalised softmax state of super rows over keys k, v [n, h, d']: (l [h, S] =
    Σ exp(s - shift), o [S, h, d'] = Σ exp(s - shift)·v), differentiable in qs, k and v.
    States over disjoint key sets with the same shift add; y = o / l."""
    w = torch.exp(scores(qs, k, scale) - shift.unsqueeze(-1))
    return w.sum(-1), torch.einsum("hsn,nhd->shd", w, v)


def super_attention(qs: Tensor, k: Tensor, v: Tensor, ks: Tensor, vs: Tensor, scale: float
                    ) -> Tensor:
    """Super rows over every real key k, v [N, h, d'] and every super key ks, vs [S, h, d']:
    [S, h, d'] (one process; the distributed merge gives the same)."""
    kk, vv = torch.cat([k, ks]), torch.cat([v, vs])
    p = torch.softmax(scores(qs, kk, scale), dim=-1)
    return torch.einsum("hsn,nhd->shd", p, vv)
