"""GCN propagation: ``Â = D^-1/2 (A + I) D^-1/2`` and ``y = Â x`` with a hand-written backward;
the mean aggregation ``M = D^-1 (A + I)`` (GraphSAGE's) is built the same way and multiplied
by the same product.

Shapes: graph [Nr, Nc] weighted, x [Nc, F] -> y [Nr, F]; backward dx = Âᵀ dy [Nc, F] through
the graph's cached transpose, so no sparse tensor ever needs autograd (torch's sparse autograd
would build Âᵀ on every call).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from plexgt.ops.csr import CSRGraph
from plexgt.ops.precision import LOW_PRECISION, full_precision

Tensor = torch.Tensor


def inv_sqrt_degrees(deg: Tensor | np.ndarray, dtype: torch.dtype = torch.float64) -> Tensor:
    """deg^-1/2 per node, 0 where the degree is 0 (a padding node or an empty row): the one
    place GCN normalisation's factors are computed, for every path (single-process, 1D, 3D)."""
    d = torch.as_tensor(deg).to(dtype)
    out = d.pow(-0.5)
    out[d == 0] = 0.0
    return out


def inv_degrees(deg: Tensor | np.ndarray, dtype: torch.dtype = torch.float64) -> Tensor:
    """1/deg per node, 0 where the degree is 0: the mean aggregation's row factor (every
    path computes it here, as :func:`inv_sqrt_degrees` GCN's)."""
    d = torch.as_tensor(deg).to(dtype)
    out = d.reciprocal()
    out[d == 0] = 0.0
    return out


def _with_self_loops(graph: CSRGraph, self_loops: bool, row_offset: int) -> CSRGraph:
    """The pattern of ``graph`` (+ I where ``self_loops``: local row i's loop is column
    ``row_offset + i``; a loop already present is kept once), on the CPU."""
    nr, nc = graph.num_rows, graph.num_cols
    dst, src = graph.row.cpu(), graph.indices.cpu()
    if self_loops:
        loop_rows = torch.arange(nr, dtype=torch.int64)
        loop_rows = loop_rows[row_offset + loop_rows < nc]
        dst = torch.cat([dst, loop_rows])
        src = torch.cat([src, loop_rows + row_offset])
    return CSRGraph.from_coo(dst, src, nr, nc)  # merges an existing self loop with the new one


def mean_norm(graph: CSRGraph, self_loops: bool = True, dtype: torch.dtype = torch.float32
              ) -> CSRGraph:
    """Row-normalised adjacency ``M = D^-1 (A + I)``: row r averages its in-neighbours (and
    itself with ``self_loops``, as the prepared graph stores by default), GraphSAGE's mean
    aggregator. deg[r] = the row counts of the pattern, as :func:`gcn_norm`'s; a row needs no
    column's degree, so a row block of a larger graph normalises on its own."""
    g = _with_self_loops(graph, self_loops, 0)
    values = inv_degrees(g.degrees(), dtype)[g.row]
    return CSRGraph(g.indptr, g.indices, g.num_rows, g.num_cols, values).to(graph.device)


def gcn_norm(
    graph: CSRGraph,
    self_loops: bool = True,
    row_offset: int = 0,
    col_degrees: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> CSRGraph:
    """Symmetrically normalised adjacency with self loops, as Kipf & Welling.

    deg[n] = number of in-edges of n including its self loop (the row counts of A + I), and
    ``Â[r, c] = deg[r]^-1/2 deg[c]^-1/2``. For a square graph deg of columns = deg of rows.
    For a rectangular row block (rows ``row_offset + i`` of a larger square graph, all
    columns) the self loop of local row i is column ``row_offset + i``, and the caller passes
    ``col_degrees`` [Nc] (the global counts including self loops) since a block can't see them.
    Self loops already present are kept once (not doubled).
    """
    nr, nc = graph.num_rows, graph.num_cols
    dev = graph.device
    g = _with_self_loops(graph, self_loops, row_offset)
    deg = g.degrees()
    if col_degrees is None:
        if nr != nc or row_offset != 0:
            raise ValueError("a rectangular graph needs col_degrees (global in-degrees + 1)")
        col_deg = deg
    else:
        col_deg = col_degrees.cpu()
        if col_deg.shape != (nc,):
            raise ValueError(f"col_degrees has shape {tuple(col_deg.shape)}, expected ({nc},)")
    values = inv_sqrt_degrees(deg, dtype)[g.row] * inv_sqrt_degrees(col_deg, dtype)[g.indices]
    return CSRGraph(g.indptr, g.indices, nr, nc, values).to(dev)


def spmm_forward(graph: CSRGraph, x: Tensor) -> Tensor:
    """[Nr, Nc] weighted x [Nc, F] -> [Nr, F] (no autograd). bfloat16 / float16 inputs are
    multiplied in float32 (the sums over a row's neighbours too) and rounded once at the end:
    CPU sparse kernels have no half types, and half-precision sums lose high-degree rows."""
    if graph.num_edges == 0:
        return x.new_zeros(graph.num_rows, x.shape[1])
    with full_precision(x.device):  # or autocast's mm would cast the operands to half
        if x.dtype in LOW_PRECISION:
            return torch.mm(graph.weighted_csr(torch.float32), x.float()).to(x.dtype)
        return torch.mm(graph.weighted_csr(x.dtype), x)


class GCNSpMMFunction(torch.autograd.Function):
    """y = Â x; dx = Âᵀ dy (values are constants: no gradient for the graph)."""

    @staticmethod
    def forward(ctx, graph: CSRGraph, x: Tensor) -> Tensor:
        ctx.graph = graph
        return spmm_forward(graph, x.contiguous())

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: Tensor):
        if not ctx.needs_input_grad[1]:
            return None, None
        return None, spmm_forward(ctx.graph.transpose(), dy.contiguous())


def gcn_spmm(graph: CSRGraph, x: Tensor) -> Tensor:
    """Sparse-dense product with a weighted graph: graph [Nr, Nc], x [Nc, F] -> [Nr, F]."""
    if graph.values is None:
        raise ValueError("gcn_spmm needs a weighted graph (see gcn_norm)")
    if x.dim() != 2 or x.shape[0] != graph.num_cols:
        raise ValueError(f"graph has {graph.num_cols} columns but x has shape {tuple(x.shape)}")
    return GCNSpMMFunction.apply(graph, x)
