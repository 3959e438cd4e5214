"""One rank's block of each graph operator of a grid3d layer, from the prepared pattern.

Shapes: the pattern block [rows, cols] (rows: this layer's output nodes over role c, in its
output order; cols: its input nodes over role a, in its input order), the degrees of both
sides, the original ids of both sides -> the operator's block [rows, cols] (scipy CSR,
float64; :class:`~plexgt.parallel.plexus3d.BlockedAdjacency` pads it).

Why derived at load rather than stored: prep stores one pattern and the degrees (its row
counts), and every normalisation of :data:`plexgt.models.spec.OPERATORS` is a function of
them: GCN's D^-1/2 A D^-1/2 needs both sides' degrees, the mean D^-1 A the rows' only, and
the identity only which output row is which input column (the node ids the dropout masks
already read). So one prepared directory serves every model, and each rank derives exactly
its blocks with no communication.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from plexgt.ops.gcn import inv_degrees, inv_sqrt_degrees


def gcn_block_values(adj: sp.csr_matrix, deg_rows: np.ndarray, deg_cols: np.ndarray
                     ) -> sp.csr_matrix:
    """The block of Â = D^-1/2 A D^-1/2 given the pattern block and both sides' degrees."""
    a = adj.tocsr().astype(np.float64)
    r = np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))
    a.data = (inv_sqrt_degrees(deg_rows)[r] * inv_sqrt_degrees(deg_cols)[a.indices]).numpy()
    return a


def mean_block_values(adj: sp.csr_matrix, deg_rows: np.ndarray) -> sp.csr_matrix:
    """The block of M = D^-1 A: each stored entry 1 / (its row's degree). The degree is the
    whole row's, not the block's: the all-reduce over a sums the row's blocks into its mean."""
    a = adj.tocsr().astype(np.float64)
    r = np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))
    a.data = inv_degrees(deg_rows)[r].numpy()
    return a


def identity_block(out_ids: np.ndarray, in_ids: np.ndarray) -> sp.csr_matrix:
    """[len(out_ids), len(in_ids)] block of the identity I: 1 where an output row and an
    input column are the same node (at most one per row and column: ids are distinct on
    each side). A rank whose blocks share no node holds an empty block."""
    out_ids, in_ids = np.asarray(out_ids, np.int64), np.asarray(in_ids, np.int64)
    order = np.argsort(in_ids, kind="stable")
    ids = in_ids[order]
    pos = np.minimum(np.searchsorted(ids, out_ids), max(0, ids.size - 1))
    hit = (ids[pos] == out_ids) if ids.size else np.zeros(out_ids.size, dtype=bool)
    rows = np.flatnonzero(hit)
    cols = order[pos[hit]]
    return sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(out_ids.size, in_ids.size))


def operator_block(op: str, adj: sp.csr_matrix, deg_rows: np.ndarray, deg_cols: np.ndarray,
                   out_ids: np.ndarray | None = None, in_ids: np.ndarray | None = None
                   ) -> sp.csr_matrix:
    """This rank's block of operator ``op`` ('gcn', 'mean' or 'self'); ``out_ids`` /
    ``in_ids``: the original ids of the block's rows and columns (at least as many as it
    has; 'self' reads them)."""
    if op == "gcn":
        return gcn_block_values(adj, deg_rows, deg_cols)
    if op == "mean":
        return mean_block_values(adj, deg_rows)
    if op == "self":
        if out_ids is None or in_ids is None:
            raise ValueError("the identity block needs the node ids of its rows and columns")
        rows, cols = adj.shape
        return identity_block(out_ids[:rows], in_ids[:cols])
    raise ValueError(f"unknown graph operator {op!r} (gcn, mean, self)")
