"""Per-rank reader of a prepared directory: each rank reads only the tiles covering its blocks.

Through :class:`~plexgt.data.prepared_graph.PreparedGraph` (the directory opened for checked
hyperslab reads; importable from here, where every reader of the package takes it).

:func:`read_rank_blocks` gives one rank of a Gx x Gy x Gz grid exactly what 3D tensor
parallelism needs (see :func:`plexgt.distributed.grid.layer_roles`): at layer l with roles
(a, b, c),
the adjacency block [rows over c, columns over a] of A1 (l even) or A2 (l odd); the layer-0
features [rows over x, feature dims over y then z]; labels and masks of the final layer's output
rows in its order (P when the number of layers is odd, Q when even). :func:`read_row_block` is
the 1D partition of graph transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from plexgt.data.checks import check_degrees
from plexgt.data.prepared import (
    A1,
    A2,
    COL_ORDER,
    NODES,
    ROW_ORDER,
    deg_ds,
)
from plexgt.data.prepared_graph import PreparedGraph, Range, csr_from_rows
from plexgt.distributed.grid import Grid3D, block_bounds
from plexgt.distributed.layout3d import LayerLayout, layer_layouts
from plexgt.errors import DataError


@dataclass
class LayerBlock:
    """One layer's adjacency block on one rank (3D tensor parallelism)."""

    layer: int
    matrix: str
    """'A1' (even layers: Q order in, P order out) or 'A2' (odd layers: P in, Q out)."""
    rows: Range
    """Output node range (over role c), in the output order."""
    cols: Range
    """Input node range (over role a), in the input order."""
    adj: sp.csr_matrix
    """[rows, cols] pattern, local indices."""
    deg_rows: np.ndarray
    """[rows] degrees of the output nodes (GCN normalisation)."""
    deg_cols: np.ndarray
    """[cols] degrees of the input nodes."""


@dataclass
class RankBlocks:
    """Everything one rank of a 3D grid reads for an ``num_layers``-layer model."""

    grid: Grid3D
    rank: int
    num_layers: int
    layers: list[LayerBlock]
    feature_rows: Range
    """Layer-0 input rows (over x), Q order."""
    feature_cols: Range
    """Feature columns: flat block y*Gz + z of Gy*Gz equal blocks (dims over y, then z)."""
    features: np.ndarray
    """[feature_rows, feature_cols]."""
    output_rows: Range
    """Final layer's output rows (over its role c)."""
    output_order: str
    """'P' (odd layer count) or 'Q' (even)."""
    labels: np.ndarray
    masks: dict[str, np.ndarray] = field(default_factory=dict)
    bytes_read: int = 0


def read_block_degrees(pg: PreparedGraph, adj: sp.csr_matrix, rows: Range,
                       cols: Range | None, order: str) -> np.ndarray:
    """[rows] degrees of a block's rows (order: theirs), checked against the block's row
    counts: equal when it spans every column, at least them otherwise (the rest of a row
    lies in other ranks' blocks)."""
    deg = pg.read_degrees(rows, order)
    complete = cols is None or (cols[0], cols[1]) == (0, pg.N)
    check_degrees(f"{pg.path / NODES}[{deg_ds(order)}]", deg, np.diff(adj.indptr), complete)
    return deg


def check_grid(pg: PreparedGraph, grid: Grid3D, num_layers: int = 1) -> None:
    """Raise :class:`DataError` when this prepared graph cannot serve ``grid``.

    Tiles are grid independent, so any grid is served by hyperslabs, except one that cuts the
    N nodes into more row blocks than there are nodes along some axis (every such split would
    leave whole ranks with nothing on every layer) or a model without layers.
    """
    if num_layers < 1:
        raise DataError(f"{pg.path}: a model needs at least one layer (got {num_layers})")
    for axis in ("x", "y", "z"):
        g = grid.dim(axis)
        if g > pg.N:
            raise DataError(f"{pg.path}: grid {grid} splits N={pg.N} nodes into {g} blocks along "
                            f"{axis}: more blocks than nodes; use a smaller grid")


def read_rank_blocks(pg: PreparedGraph, grid: Grid3D, rank: int, num_layers: int
                     ) -> RankBlocks:
    """Read the blocks ``rank`` of ``grid`` needs for ``num_layers`` layers (module docstring),
    at the ranges of its :func:`~plexgt.distributed.layout3d.layer_layouts` (widths do not
    move node blocks; the feature columns are layer 0's input columns, unpadded)."""
    check_grid(pg, grid, num_layers)
    before = pg.bytes_read
    lays = layer_layouts(grid, rank, pg.N, [pg.F] + [1] * num_layers)
    layers = []
    for lay in lays:
        out_o, in_o = ROW_ORDER[lay.matrix], COL_ORDER[lay.matrix]
        adj = pg.read_adjacency(lay.matrix, lay.rows, lay.cols)
        layers.append(LayerBlock(lay.layer, lay.matrix, lay.rows, lay.cols, adj,
                                 read_block_degrees(pg, adj, lay.rows, lay.cols, out_o),
                                 pg.read_degrees(lay.cols, in_o)))
    first, last = lays[0], lays[-1]
    frows = first.cols
    fcols = (min(first.in_cols[0], pg.F), min(first.in_cols[1], pg.F))
    feats = pg.read_features(frows, fcols)
    orows, order = last.rows, last.out_order
    labels = pg.read_labels(orows, order)
    masks = pg.read_masks(orows, order)
    return RankBlocks(grid, rank, num_layers, layers, frows, fcols, feats, orows, order, labels,
                      masks, pg.bytes_read - before)


@dataclass
class RowBlock:
    """Rows block i of p in Q order (1D node partition of graph transformers)."""

    rows: Range
    adj: sp.csr_matrix
    """[rows, N]: Q A Q^T rows (one permutation on both sides, so residuals line up)."""
    features: np.ndarray
    """[rows, F] (Q order: contiguous)."""
    labels: np.ndarray
    masks: dict[str, np.ndarray]
    deg: np.ndarray
    """[rows] deg_Q of the block's nodes."""
    bytes_read: int = 0


def read_adjacency_q(pg: PreparedGraph, rows: Range | None = None) -> sp.csr_matrix:
    """Rows ``rows`` of Q A Qᵀ against all N columns, CSR with sorted column indices.

    Why Q order and A2: an attention layer needs rows and columns in one order (residuals),
    A2 = Q A P^T has Q-ordered rows, and relabelling its columns P -> Q (via perm_p and the
    inverse of perm_q, 16 N bytes) gives Q A Q^T; features and labels are then contiguous.
    """
    lo, hi = pg._range(rows, pg.N, "row")
    a2 = pg.read_adjacency(A2, (lo, hi), None).tocoo()
    perm_p, perm_q = pg.read_perm("P"), pg.read_perm("Q")
    qinv = np.empty_like(perm_q)
    qinv[perm_q] = np.arange(pg.N, dtype=perm_q.dtype)
    adj = csr_from_rows([a2.row.astype(np.int64)], [qinv[perm_p[a2.col]]], (hi - lo, pg.N))
    adj.has_sorted_indices = False  # relabelled columns: _csr's promise no longer holds
    adj.sort_indices()
    return adj


def read_adjacency_q_edges(pg: PreparedGraph, rows: Range | None = None
                           ) -> tuple[sp.csr_matrix, np.ndarray]:
    """:func:`read_adjacency_q` and the [nnz, F_e] features of its edges in its CSR order
    (the edge bias's input, aligned with the attention pattern a rank holds)."""
    lo, hi = pg._range(rows, pg.N, "row")
    a2, ef = pg.read_adjacency_edges(A2, (lo, hi), None)
    a2 = a2.tocoo()
    perm_p, perm_q = pg.read_perm("P"), pg.read_perm("Q")
    qinv = np.empty_like(perm_q)
    qinv[perm_q] = np.arange(pg.N, dtype=perm_q.dtype)
    r, c = a2.row.astype(np.int64), qinv[perm_p[a2.col]].astype(np.int64)
    order = np.lexsort((c, r))
    adj = csr_from_rows([r[order]], [c[order]], (hi - lo, pg.N))
    return adj, ef[order]


def read_row_block(pg: PreparedGraph, i: int, p: int) -> RowBlock:
    """Block i of p of the nodes in Q order, with their adjacency rows over all N nodes
    (:func:`read_adjacency_q`)."""
    before = pg.bytes_read
    rows = block_bounds(pg.N, p, i)
    adj = read_adjacency_q(pg, rows)
    return RowBlock(rows, adj, pg.read_features(rows), pg.read_labels(rows, "Q"),
                    pg.read_masks(rows, "Q"), read_block_degrees(pg, adj, rows, None, "Q"),
                    pg.bytes_read - before)


@dataclass
class NodeTargets:
    """Labels and split masks of one rank's rows, padded to the rank's padded row count."""

    labels: np.ndarray
    """[rows_pad] int64 class ids or, multi-label, [rows_pad, T] (-1: unlabelled or
    padding)."""
    masks: dict[str, np.ndarray]
    """'train' / 'valid' / 'test' -> [rows_pad] bool (False on padding)."""


def read_targets(pg: PreparedGraph, rows: Range, order: str, rows_pad: int) -> NodeTargets:
    """Labels and masks of nodes ``rows`` (in P or Q ``order``), padded to ``rows_pad``."""
    pad = rows_pad - (rows[1] - rows[0])
    if pad < 0:
        raise ValueError(f"rows {rows} do not fit in {rows_pad} padded rows")
    mine = pg.read_labels(rows, order).astype(np.int64)
    labels = np.concatenate([mine, np.full((pad, *mine.shape[1:]), -1, dtype=np.int64)])
    masks = {s: np.concatenate([m, np.zeros(pad, dtype=bool)])
             for s, m in pg.read_masks(rows, order).items()}
    return NodeTargets(labels, masks)


def read_feature_block(pg: PreparedGraph, rows: Range, cols: Range, shape: tuple[int, int]
                       ) -> np.ndarray:
    """[shape] float64 features of nodes ``rows`` (Q order) and feature columns ``cols``,
    zero-padded (columns past F are padding, so ``cols`` may reach beyond F)."""
    out = np.zeros(shape, dtype=np.float64)
    c0, c1 = min(cols[0], pg.F), min(cols[1], pg.F)
    if c1 > c0 and rows[1] > rows[0]:
        out[: rows[1] - rows[0], : c1 - c0] = pg.read_features(rows, (c0, c1))
    return out


@dataclass
class PlexusArrays:
    """What one rank of a 3D grid reads for an L-layer GCN, driven by its layer layouts.

    Per layer the pattern block [rows over c, cols over a] of A1 (even layers) or A2 (odd)
    with both sides' degrees (GCN normalisation); the layer-0 input features
    [rows over x, feature dims over y·z], padded; labels and masks of the last layer's
    output rows in its output order, padded.
    """

    blocks: list[tuple[sp.csr_matrix, np.ndarray, np.ndarray] | None]
    """(pattern, deg of rows, deg of columns) per layer; None for a node-wise ('linear')
    layer, which reads no adjacency."""
    features: np.ndarray | sp.csr_matrix
    """Dense [cols_pad, d_0/(Gb·Gc)], or CSR [cols_pad, d_0/Gb] (gathered over c)."""
    targets: NodeTargets
    rows: Range
    """The last layer's output rows (over its role c) that the targets cover."""
    order: str
    """Their order: 'P' (odd layer count) or 'Q' (even)."""
    bytes_read: int
    node_ids: list[np.ndarray] = field(default_factory=list)
    """Per layer, the original node id of each input row (padded, :func:`read_node_ids`):
    the key of that layer's dropout masks."""
    out_ids: np.ndarray | None = None
    """[rows_pad] original node id of each of the last layer's output rows (padded): with
    the next layers' input ids, what places node-wise layers' and residuals' rows."""


def read_node_ids(pg: PreparedGraph, order: str, rows: Range, length: int) -> np.ndarray:
    """[length] int64 original node id of positions ``rows`` of the P or Q order, padded with
    distinct ids >= N (padding rows draw dropout masks too; none reaches a real node)."""
    ids = pg.read_perm(order, rows)
    pad = np.arange(pg.N + rows[0] + len(ids), pg.N + rows[0] + length, dtype=np.int64)
    return np.concatenate([ids.astype(np.int64, copy=False), pad])


def read_plexus_arrays(pg: PreparedGraph, layouts: Sequence[LayerLayout]) -> PlexusArrays:
    """Read :class:`PlexusArrays` for this rank's ``layouts`` (one per layer). CSR-stored
    features are read sparse and already gathered over layer 0's role c (its
    ``gathered_cols``, [cols_pad, d_0/Gb]): a constant input needs no all-gather."""
    before = pg.bytes_read
    blocks, ids = [], []
    for lay in layouts:
        out_o, in_o = ("P", "Q") if lay.matrix == A1 else ("Q", "P")
        if lay.kind == "conv":
            adj = pg.read_adjacency(lay.matrix, lay.rows, lay.cols)
            blocks.append((adj, read_block_degrees(pg, adj, lay.rows, lay.cols, out_o),
                           pg.read_degrees(lay.cols, in_o)))
        else:
            blocks.append(None)
        ids.append(read_node_ids(pg, in_o, lay.cols, lay.cols_pad))
    first, last = layouts[0], layouts[-1]
    feats: np.ndarray | sp.csr_matrix
    if pg.sparse_features:
        g0, g1 = first.gathered_cols
        feats = pg.read_features_csr(first.cols, (min(g0, pg.F), min(g1, pg.F)))
        feats.resize((first.cols_pad, g1 - g0))  # padding rows and columns: empty
    else:
        width = first.in_cols[1] - first.in_cols[0]
        feats = read_feature_block(pg, first.cols, first.in_cols, (first.cols_pad, width))
    targets = read_targets(pg, last.rows, last.out_order, last.rows_pad)
    out_ids = read_node_ids(pg, last.out_order, last.rows, last.rows_pad)
    return PlexusArrays(blocks, feats, targets, last.rows, last.out_order,
                        pg.bytes_read - before, ids, out_ids)
