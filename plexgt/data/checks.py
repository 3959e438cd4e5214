"""The consistency rules of a prepared directory's arrays, defined once for both their users.

``plexgt verify`` applies them to every array of a directory and collects what fails; the
per-rank reader (:mod:`plexgt.data.loader`) applies them to what a rank reads and stops at the
first failure. Checksums only say the bytes are the ones prep wrote (or that someone rewrote
with valid checksums): a label past C, a column index outside its tile or row counts past the
indices would otherwise be trained on, dropped or end in an IndexError. Each rule raises
:class:`DataError` ``"{where}: {problem}"``, where ``where`` names the file and the tile or
dataset; each is a few vectorised passes over arrays already in memory.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from plexgt.errors import DataError


def check_counts_layout(where: str, shape: tuple[int, ...], dtype: np.dtype, rows: int) -> None:
    """A tile's row counts dataset: [rows] of an unsigned type (what prep writes)."""
    if tuple(shape) != (rows,) or np.dtype(dtype).kind != "u":
        raise DataError(f"{where}: counts have shape {tuple(shape)} dtype {dtype}, expected "
                        f"({rows},) unsigned")


def tile_indptr(where: str, counts: np.ndarray, anchors: np.ndarray, k: int, stride: int,
                rows: int, nnz: int) -> np.ndarray:
    """[len(counts) + 1] int64 offsets of rows [k·stride, k·stride + len(counts)) of a tile of
    ``rows`` rows and ``nnz`` indices, from those rows' counts and anchors k.. (the stored
    offset of every stride-th row, the last one the tile's end).

    The window must end at a stride-th row or at the tile's end, so that each anchor read can
    be recomputed from the counts: anchor 0 is 0, anchor j is anchor k plus the counts between,
    the last is ``nnz``, and no row reaches past the indices."""
    ip = np.empty(counts.size + 1, dtype=np.int64)
    ip[0] = 0 if k == 0 else (int(anchors[0]) if anchors.size else 0)
    np.cumsum(counts, out=ip[1:])
    ip[1:] += ip[0]
    end = k * stride + counts.size
    if end == rows and ip[-1] != nnz:
        raise DataError(f"{where}: row counts end at index {ip[-1]}, but the tile holds {nnz} "
                        "indices")
    if ip[0] < 0 or ip[-1] > nnz:
        raise DataError(f"{where}: row counts reach index {ip[-1]}, past the tile's {nnz} "
                        "indices")
    if not np.array_equal(anchors, np.append(ip[:-1:stride], ip[-1])):
        raise DataError(f"{where}: anchors disagree with the row counts (indptr not monotone)")
    return ip


def check_indices(where: str, indices: np.ndarray, rows: np.ndarray, cols: int) -> None:
    """Column indices of a tile's rows (``rows``: the row of each, non-decreasing): inside the
    tile's ``cols`` columns and strictly increasing within a row (no duplicate entries)."""
    if not indices.size:
        return
    lo, hi = int(indices.min()), int(indices.max())
    if lo < 0 or hi >= cols:
        raise DataError(f"{where}: column index {lo if lo < 0 else hi} outside [0, {cols})")
    if indices.size > 1 and np.any((rows[1:] == rows[:-1]) & (indices[1:] <= indices[:-1])):
        raise DataError(f"{where}: indices not strictly increasing within a row (duplicates?)")


def check_edge_features(where: str, shape: tuple[int, ...], nnz: int, fe: int) -> None:
    """A tile's edge features: one row of F_e per index."""
    if tuple(shape) != (nnz, fe):
        raise DataError(f"{where}: edge features {tuple(shape)} are not {nnz} rows of FE={fe}")


def check_finite(where: str, values: np.ndarray, row0: int = 0, unit: str = "row") -> None:
    """Features (node or edge rows, or CSR values: ``unit`` 'entry') hold no NaN or
    infinity."""
    ok = np.isfinite(values)
    if not ok.all():
        first = int(np.argmin(ok.reshape(ok.shape[0], -1).all(axis=1)))
        raise DataError(f"{where}: non-finite value in {unit} {row0 + first}")


def check_labels(where: str, labels: np.ndarray, rows: int, num_classes: int,
                 multilabel: bool) -> None:
    """Class ids in [-1, C) (-1: unlabelled), or multi-label [rows, C] of -1/0/1."""
    if multilabel:
        if labels.shape != (rows, num_classes) or (labels.size and (labels.min() < -1
                                                                    or labels.max() > 1)):
            raise DataError(f"{where}: multi-label labels are not [{rows}, C={num_classes}] of "
                            "-1/0/1")
        return
    if labels.shape != (rows,):
        raise DataError(f"{where}: labels have shape {labels.shape}, expected ({rows},)")
    if labels.size:
        lo, hi = int(labels.min()), int(labels.max())
        if lo < -1 or hi >= num_classes:
            raise DataError(f"{where}: label {lo if lo < -1 else hi} outside [-1, "
                            f"C={num_classes})")


def check_masks(where: str, masks: Mapping[str, np.ndarray], rows: int) -> None:
    """Split masks of the same rows: [rows] bool each, no node in two splits."""
    seen = np.zeros(rows, dtype=bool)
    for split, m in masks.items():
        if m.shape != (rows,) or m.dtype != np.bool_:
            raise DataError(f"{where}: mask of split {split} has shape {m.shape} dtype "
                            f"{m.dtype}, expected ({rows},) bool")
        if np.any(seen & m):
            raise DataError(f"{where}: split {split} overlaps an earlier split")
        seen |= m


def check_ids(where: str, ids: np.ndarray, n: int) -> None:
    """Node ids (a permutation's entries) inside [0, N): anything else indexes another node
    or past the arrays."""
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise DataError(f"{where}: node id outside [0, N={n})")


def check_csr(where: str, indptr: np.ndarray, indices: np.ndarray, values: np.ndarray,
              cols: int, first: bool, last: bool, stored: int) -> None:
    """CSR feature rows of a block that stores ``stored`` entries: ``indptr`` (from 0 when it
    starts at the block's first row, ending at ``stored`` when it reaches its last)
    non-decreasing inside the entries, as many indices and values as it spans, column indices
    in [0, F), finite values."""
    if (not indptr.size or np.any(np.diff(indptr) < 0) or indptr[0] < 0
            or (first and indptr[0] != 0) or indptr[-1] > stored
            or (last and indptr[-1] != stored)
            or not indices.size == values.size == indptr[-1] - indptr[0]):
        span = f"{indptr[0]} to {indptr[-1]}" if indptr.size else "empty"
        raise DataError(f"{where}: CSR features are inconsistent (indptr {span}, "
                        f"{indices.size} indices, {values.size} values, {stored} stored)")
    if indices.size and (indices.min() < 0 or indices.max() >= cols):
        raise DataError(f"{where}: a feature column index is outside [0, F={cols})")
    check_finite(where, values, unit="entry")


def check_degrees(where: str, deg: np.ndarray, counts: np.ndarray, complete: bool) -> None:
    """Stored degrees of some rows against those rows' counts in a block of the matrix: equal
    when the block holds every column (``complete``), else at least the counts."""
    if deg.shape != counts.shape or (np.any(deg != counts) if complete
                                     else np.any(deg < counts)):
        raise DataError(f"{where}: degrees disagree with the tiles' row counts")
