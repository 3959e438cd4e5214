"""Per-rank reader of a prepared directory: each rank reads only the tiles covering its blocks.

:class:`PreparedGraph` opens the manifest (a directory without one is refused: it is an
interrupted prep) and reads hyperslabs: adjacency blocks from the tiles that intersect them,
feature rows x columns, node arrays. ``bytes_read`` counts the payload bytes of every hyperslab
read, so benchmarks compare a rank's I/O with its ideal share.

:func:`read_rank_blocks` gives one rank of a Gx x Gy x Gz grid exactly what 3D tensor
parallelism needs (see :func:`plexgt.distributed.grid.layer_roles`): at layer l with roles
(a, b, c),
the adjacency block [rows over c, columns over a] of A1 (l even) or A2 (l odd); the layer-0
features [rows over x, feature dims over y then z]; labels and masks of the final layer's output
rows in its order (P when the number of layers is odd, Q when even). :func:`read_row_block` is
the 1D partition of graph transformers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import scipy.sparse as sp

from plexgt.data.checks import (
    check_counts_layout,
    check_csr,
    check_degrees,
    check_edge_features,
    check_finite,
    check_ids,
    check_indices,
    check_labels,
    check_masks,
    tile_indptr,
)
from plexgt.data.prepared import (
    A1,
    A2,
    ANCHORS,
    COL_ORDER,
    COUNTS,
    EDGE_FEAT,
    FEATURES_DATA,
    FEATURES_INDICES,
    FEATURES_INDPTR,
    FEATURES_X,
    FORMAT,
    FORMAT_VERSION,
    INDICES,
    MANIFEST,
    MATRICES,
    NODES,
    ORDERS,
    ROW_ORDER,
    SPLITS,
    STAGING,
    deg_ds,
    feature_file,
    labels_ds,
    mask_ds,
    perm_ds,
    tile_file,
    tile_group,
)
from plexgt.data.runtime import read_json
from plexgt.distributed.grid import Grid3D, block_bounds
from plexgt.distributed.layout3d import LayerLayout, layer_layouts
from plexgt.errors import DataError

Range = tuple[int, int]


class PreparedGraph:
    """A prepared directory opened for reading (see :mod:`plexgt.data.prepared` for the layout)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        mpath = self.path / MANIFEST
        if not mpath.exists():
            why = ("an interrupted prep: run plexgt prep --resume" if (self.path / STAGING)
                   .exists() else "not a prepared directory")
            raise DataError(f"{self.path}: no {MANIFEST} ({why})")
        m = self.manifest = read_json(mpath)
        if m.get("format") != FORMAT or m.get("format_version") != FORMAT_VERSION:
            raise DataError(f"{mpath}: unsupported format {m.get('format')!r} version "
                            f"{m.get('format_version')!r} (expected {FORMAT_VERSION})")
        try:
            self.N, self.E, self.F, self.C = (int(m[k]) for k in ("N", "E", "F", "C"))
            self.T, self.tile_size = int(m["T"]), int(m["tile_size"])
            self.feature_block_rows = int(m["feature_block_rows"])
            self.anchor_stride = int(m["anchor_stride"])
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{mpath}: missing or bad field ({e})") from None
        try:
            self.FE = int(m.get("FE", 0))
        except (TypeError, ValueError) as e:
            raise DataError(f"{mpath}: bad field FE ({e})") from None
        """F_e: edge feature columns kept beside every tile's indices (0: none)."""
        self.sparse_features = m.get("feature_layout", "dense") == "csr"
        """Feature blocks stored as CSR (bag-of-words inputs): read them with
        :meth:`read_features_csr` and train them sparse."""
        self.multilabel = bool(m.get("multilabel", False))
        """Labels [N, T=C] of 0/1 per task (-1 unlabelled) rather than [N] class ids."""
        self.self_loops = bool(m.get("self_loops"))
        self.symmetrized = bool(m.get("symmetrized"))
        self.bytes_read = 0
        """Payload bytes of every hyperslab read so far."""
        self._files: dict[str, h5py.File] = {}
        self._check_sizes(mpath)

    def _check_sizes(self, mpath: Path) -> None:
        """The manifest's N, F and C against what nodes.h5 records (prep writes both): an
        edited or mismatched manifest would otherwise train on a subset of the graph."""
        try:
            attrs = self._file(NODES).attrs
        except DataError:
            return  # missing or unreadable: reported by the read that needs it
        for key, mine in (("N", self.N), ("F", self.F), ("C", self.C)):
            if key in attrs and int(attrs[key]) != mine:
                raise DataError(f"{mpath}: {key}={mine} but {self.path / NODES} was written "
                                f"with {key}={int(attrs[key])}; the manifest does not belong "
                                "to these files")

    # -- files ------------------------------------------------------------------------
    def _file(self, rel: str) -> h5py.File:
        f = self._files.get(rel)
        if f is None:
            p = self.path / rel
            if not p.exists():
                raise DataError(f"{p}: missing file of the prepared directory")
            try:
                f = h5py.File(p, "r")
            except OSError as e:
                raise DataError(f"{p}: corrupt HDF5 file ({e})") from None
            self._files[rel] = f
        return f

    def _dataset(self, rel: str, name: str) -> h5py.Dataset:
        try:
            return self._file(rel)[name]
        except KeyError:
            raise DataError(f"{self.path / rel}: missing dataset {name!r}") from None

    def _read(self, rel: str, name: str, sel: Any = ()) -> np.ndarray:
        try:
            a = self._dataset(rel, name)[sel]
        except OSError as e:
            raise DataError(f"{self.path / rel}: corrupt dataset {name!r} ({e})") from None
        a = np.asarray(a)
        self.bytes_read += a.nbytes
        return a

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> PreparedGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- ranges -----------------------------------------------------------------------
    def _range(self, r: Range | None, n: int, what: str) -> Range:
        if r is None:
            return 0, n
        lo, hi = int(r[0]), int(r[1])
        if not 0 <= lo <= hi <= n:
            raise DataError(f"{self.path}: {what} range [{lo}, {hi}) is outside [0, {n}]")
        return lo, hi

    @staticmethod
    def _order(order: str) -> str:
        if order not in ORDERS:
            raise DataError(f"order {order!r}: expected 'P' or 'Q'")
        return order

    # -- adjacency --------------------------------------------------------------------
    def read_adjacency(self, which: str = "A1", rows: Range | None = None,
                       cols: Range | None = None) -> sp.csr_matrix:
        """[rows, cols] block of A1 or A2 as CSR with local indices (values: ones, float32).

        Reads exactly the tiles that intersect the block: per tile, the row counts of the
        block and the contiguous run of indices they cover (columns outside are dropped).
        """
        return self._read_block(which, rows, cols, False)[0]

    def read_adjacency_edges(self, which: str = "A1", rows: Range | None = None,
                             cols: Range | None = None) -> tuple[sp.csr_matrix, np.ndarray]:
        """:meth:`read_adjacency` and the [nnz, F_e] float32 features of its edges, in the
        CSR's order (read from the same hyperslabs of the same tiles)."""
        if not self.FE:
            raise DataError(f"{self.path}: the prepared graph has no edge features")
        m, ef = self._read_block(which, rows, cols, True)
        assert ef is not None
        return m, ef

    def _read_block(self, which: str, rows: Range | None, cols: Range | None,
                    edge_features: bool) -> tuple[sp.csr_matrix, np.ndarray | None]:
        if which not in MATRICES:
            raise DataError(f"matrix {which!r}: expected 'A1' or 'A2'")
        r0, r1 = self._range(rows, self.N, "row")
        c0, c1 = self._range(cols, self.N, "column")
        s = self.tile_size
        rr: list[np.ndarray] = []
        cc: list[np.ndarray] = []
        ff: list[np.ndarray] = []
        if r1 > r0 and c1 > c0:
            for ti in range(r0 // s, math.ceil(r1 / s)):
                rel = tile_file(which, ti)
                tr = ti * s
                a, b = max(r0, tr) - tr, min(r1, tr + s) - tr
                for tj in range(c0 // s, math.ceil(c1 / s)):
                    tc = tj * s
                    ca, cb = max(c0, tc) - tc, min(c1, tc + s) - tc
                    tile = tile_group(tj)
                    cnt, ind, start = self._tile_rows(rel, tile, a, b, self._tile_len(ti))
                    lr = np.repeat(np.arange(b - a, dtype=np.int64), cnt)
                    where = f"{self.path / rel}[{tile}]"
                    check_indices(where, ind, lr, self._tile_len(tj))
                    keep = (ind >= ca) & (ind < cb)
                    rr.append(lr[keep] + (tr + a - r0))
                    cc.append(ind[keep].astype(np.int64) + (tc - c0))
                    if edge_features:
                        ff.append(self._edge_features(rel, tile, start, ind.size)[keep])
        shape = (r1 - r0, c1 - c0)
        if not edge_features:
            return _csr(rr, cc, shape), None
        order = np.argsort(np.concatenate(rr) if rr else np.empty(0, np.int64), kind="stable")
        feats = np.concatenate(ff) if ff else np.empty((0, self.FE), np.float32)
        return _csr(rr, cc, shape), feats[order]

    def _tile_len(self, t: int) -> int:
        """Rows (or columns) of tile row (column) ``t``: the last is cut at N."""
        return max(0, min(self.N, (t + 1) * self.tile_size) - t * self.tile_size)

    def read_tile_rows(self, rel: str, tile: str, a: int, b: int
                       ) -> tuple[np.ndarray, np.ndarray]:
        """(counts [b-a] int64, indices) of local rows [a, b) of one tile (encoded by
        :func:`plexgt.data.prep_stages.encode_counts`), checked as :meth:`_tile_rows` says."""
        ti = int(Path(rel).stem.split("_")[-1])
        cnt, ind, _ = self._tile_rows(rel, tile, a, b, self._tile_len(ti))
        return cnt, ind

    def _tile_rows(self, rel: str, tile: str, a: int, b: int, rows: int
                   ) -> tuple[np.ndarray, np.ndarray, int]:
        """:meth:`read_tile_rows` of a tile of ``rows`` rows, and the offset of row a's first
        entry in the tile.

        Reads the anchors from row (a // stride) * stride to the first at or past row b and
        the counts between them (fewer than ``stride`` extra counts on each side), so every
        anchor read is checked against the counts (:func:`~plexgt.data.checks.tile_indptr`)
        before the indices are sliced by them.
        """
        if b <= a:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32), 0
        where = f"{self.path / rel}[{tile}]"
        counts = self._dataset(rel, f"{tile}/{COUNTS}")
        check_counts_layout(where, counts.shape, counts.dtype, rows)
        nnz = self._dataset(rel, f"{tile}/{INDICES}").shape[0]
        stride = self.anchor_stride
        k, kk = a // stride, -(-b // stride)
        anchors = self._read(rel, f"{tile}/{ANCHORS}", np.s_[k : kk + 1])
        cnt = self._read(rel, f"{tile}/{COUNTS}", np.s_[k * stride : min(rows, kk * stride)])
        ip = tile_indptr(where, cnt, anchors, k, stride, rows, nnz)
        start, end = int(ip[a - k * stride]), int(ip[b - k * stride])
        ind = self._read(rel, f"{tile}/{INDICES}", np.s_[start:end])
        return np.diff(ip[a - k * stride : b - k * stride + 1]), ind, start

    def _edge_features(self, rel: str, tile: str, start: int, n: int) -> np.ndarray:
        """[n, F_e] features of a tile's entries [start, start + n), the dataset checked to
        hold one row per index."""
        where = f"{self.path / rel}[{tile}]"
        ds = self._dataset(rel, f"{tile}/{EDGE_FEAT}")
        check_edge_features(where, ds.shape, self._dataset(rel, f"{tile}/{INDICES}").shape[0],
                            self.FE)
        ef = self._read(rel, f"{tile}/{EDGE_FEAT}", np.s_[start : start + n])
        check_finite(where, ef, start, "entry")
        return ef

    # -- node data --------------------------------------------------------------------
    def read_features(self, rows: Range | None = None, cols: Range | None = None) -> np.ndarray:
        """[rows, cols] of the features, rows in Q order (the order A1 consumes); dense
        whatever the stored layout."""
        if self.sparse_features:
            return self.read_features_csr(rows, cols).toarray()
        r0, r1 = self._range(rows, self.N, "feature row")
        c0, c1 = self._range(cols, self.F, "feature column")
        dtype = np.dtype(self.manifest["dtypes"]["features"])
        out = np.empty((r1 - r0, c1 - c0), dtype=dtype)
        if r1 == r0 or c1 == c0:
            return out
        fb = self.feature_block_rows
        for b in range(r0 // fb, math.ceil(r1 / fb)):
            lo = b * fb
            a, z = max(r0, lo) - lo, min(r1, lo + fb) - lo
            x = self._read(feature_file(b), FEATURES_X, np.s_[a:z, c0:c1])
            check_finite(f"{self.path / feature_file(b)}[{FEATURES_X}]", x, a)
            out[lo + a - r0 : lo + z - r0] = x
        return out

    def read_features_csr(self, rows: Range | None = None, cols: Range | None = None
                          ) -> sp.csr_matrix:
        """[rows, cols] of CSR-stored features (``feature_layout`` 'csr') as a scipy CSR
        matrix, rows in Q order: per block an indptr slice, then one range of indices and
        values (what a rank's rows hold, never the whole block)."""
        if not self.sparse_features:
            raise DataError(f"{self.path}: features are stored dense, not as CSR")
        r0, r1 = self._range(rows, self.N, "feature row")
        c0, c1 = self._range(cols, self.F, "feature column")
        dtype = np.dtype(self.manifest["dtypes"]["features"])
        fb = self.feature_block_rows
        parts = []
        for b in range(r0 // fb, math.ceil(r1 / fb)):
            lo = b * fb
            a, z = max(r0, lo) - lo, min(r1, lo + fb) - lo
            rel = feature_file(b)
            ptr = self._read(rel, FEATURES_INDPTR, np.s_[a:z + 1]).astype(np.int64)
            stored = self._dataset(rel, FEATURES_INDICES).shape[0]
            e0, e1 = (int(ptr[0]), int(ptr[-1])) if ptr.size else (0, 0)
            e0, e1 = min(max(e0, 0), stored), min(max(e1, 0), stored)
            idx = self._read(rel, FEATURES_INDICES, np.s_[e0:e1])
            val = self._read(rel, FEATURES_DATA, np.s_[e0:e1])
            check_csr(str(self.path / rel), ptr, idx, val, self.F, a == 0,
                      z == min(fb, self.N - lo), stored)
            if val.dtype == np.float16:  # scipy's sparse matrices have no float16
                val = val.astype(np.float32)
            parts.append(sp.csr_matrix((val, idx, ptr - e0), shape=(z - a, self.F)))
        if not parts:
            return sp.csr_matrix((r1 - r0, c1 - c0), dtype=np.promote_types(dtype, np.float32))
        m = sp.vstack(parts, format="csr") if len(parts) > 1 else parts[0]
        return m[:, c0:c1] if (c0, c1) != (0, self.F) else m

    def read_labels(self, rows: Range | None = None, order: str = "P") -> np.ndarray:
        """[rows] int64 class ids or, multi-label, [rows, C] int8 0/1 per task (-1
        unlabelled), in P or Q order."""
        lo, hi = self._range(rows, self.N, "label row")
        name = labels_ds(self._order(order))
        labels = self._read(NODES, name, np.s_[lo:hi])
        check_labels(f"{self.path / NODES}[{name}]", labels, hi - lo, self.C, self.multilabel)
        return labels

    def read_mask(self, split: str, rows: Range | None = None, order: str = "P") -> np.ndarray:
        """[rows] bool mask of split 'train' | 'valid' | 'test' in P or Q order."""
        if split not in SPLITS:
            raise DataError(f"split {split!r}: expected train, valid or test")
        lo, hi = self._range(rows, self.N, "mask row")
        return self._read(NODES, mask_ds(split, self._order(order)), np.s_[lo:hi])

    def read_masks(self, rows: Range | None = None, order: str = "P") -> dict[str, np.ndarray]:
        """Every split's [rows] mask in P or Q order, checked to put no node in two splits."""
        masks = {s: self.read_mask(s, rows, order) for s in SPLITS}
        lo, hi = self._range(rows, self.N, "mask row")
        check_masks(f"{self.path / NODES}[{mask_ds('{train,valid,test}', order)}]", masks,
                    hi - lo)
        return masks

    def read_degrees(self, rows: Range | None = None, order: str = "P") -> np.ndarray:
        """[rows] int64 row counts of A1 (order P) or A2 (order Q), self loops included.

        GCN normalisation of A1[i, j] is deg_P[i]^-1/2 * deg_Q[j]^-1/2 (A2: the reverse).
        """
        lo, hi = self._range(rows, self.N, "degree row")
        return self._read(NODES, deg_ds(self._order(order)), np.s_[lo:hi])

    def read_perm(self, order: str = "P", rows: Range | None = None) -> np.ndarray:
        """[rows] int64 original node id of each position of the P or Q order."""
        lo, hi = self._range(rows, self.N, "permutation row")
        name = perm_ds(self._order(order))
        perm = self._read(NODES, name, np.s_[lo:hi])
        check_ids(f"{self.path / NODES}[{name}]", perm, self.N)
        return perm

    def to_original(self, values: np.ndarray, order: str = "P") -> np.ndarray:
        """[N, ...] values in P or Q order -> the same values in original node order."""
        perm = self.read_perm(order)
        out = np.empty_like(values)
        out[perm] = values
        return out


def _csr(rr: list[np.ndarray], cc: list[np.ndarray], shape: tuple[int, int]) -> sp.csr_matrix:
    """CSR from row-major COO pieces (columns ascending within each row after a stable sort)."""
    r = np.concatenate(rr) if rr else np.empty(0, dtype=np.int64)
    c = np.concatenate(cc) if cc else np.empty(0, dtype=np.int64)
    order = np.argsort(r, kind="stable")
    idx_t = np.int32 if max(shape) < 2**31 and r.size < 2**31 else np.int64
    indptr = np.zeros(shape[0] + 1, dtype=idx_t)
    np.cumsum(np.bincount(r, minlength=shape[0]), out=indptr[1:])
    m = sp.csr_matrix((np.ones(r.size, dtype=np.float32), c[order].astype(idx_t), indptr),
                      shape=shape)
    m.has_sorted_indices = True
    return m


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
    adj = _csr([a2.row.astype(np.int64)], [qinv[perm_p[a2.col]]], (hi - lo, pg.N))
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
    adj = _csr([r[order]], [c[order]], (hi - lo, pg.N))
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

    blocks: list[tuple[sp.csr_matrix, np.ndarray, np.ndarray]]
    """(pattern, deg of rows, deg of columns) per layer."""
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
        adj = pg.read_adjacency(lay.matrix, lay.rows, lay.cols)
        blocks.append((adj, read_block_degrees(pg, adj, lay.rows, lay.cols, out_o),
                       pg.read_degrees(lay.cols, in_o)))
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
    return PlexusArrays(blocks, feats, targets, last.rows, last.out_order,
                        pg.bytes_read - before, ids)
