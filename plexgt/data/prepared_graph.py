"""A prepared directory opened for reading: checked hyperslabs of its tiles and node arrays.

:class:`PreparedGraph` opens the manifest (a directory without one is refused: it is an
interrupted prep) and reads hyperslabs: adjacency blocks from the tiles that intersect them,
feature rows x columns, node arrays. Every read is checked by the rules verify applies
(:mod:`plexgt.data.checks`), on what it read. ``bytes_read`` counts the payload bytes of every
hyperslab read, so benchmarks compare a rank's I/O with its ideal share. What each rank of a
grid reads through it is :mod:`plexgt.data.loader`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import scipy.sparse as sp

from plexgt.data.checks import (
    check_counts_layout,
    check_csr,
    check_edge_features,
    check_finite,
    check_ids,
    check_indices,
    check_labels,
    check_masks,
    tile_indptr,
)
from plexgt.data.prepared import (
    ANCHORS,
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
    P2Q_DS,
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
from plexgt.errors import ConfigError, DataError
from plexgt.util.files import read_json

Range = tuple[int, int]


class PreparedGraph:
    """A prepared directory opened for reading (see :mod:`plexgt.data.prepared` for the layout)."""

    def __init__(self, path: str | Path, split: int | str | None = None) -> None:
        """``split``: which stored split the masks are read of (:meth:`select_split`; None:
        the directory's default)."""
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
        rec = m.get("split") if isinstance(m.get("split"), dict) else {}
        try:
            stored = int(rec.get("num_splits", 0))
        except (TypeError, ValueError) as e:
            raise DataError(f"{mpath}: bad field split.num_splits ({e})") from None
        k = rec.get("split_index", 0)
        self.split_indices = (list(range(stored)) if stored else
                              [k if isinstance(k, int) and not isinstance(k, bool) else 0])
        """The source's split indices whose masks the directory holds: 0..K-1 when prep kept
        them all (``--split-index all``), else the one it kept (0 for a random split or an
        external split file). The first is the default, stored under the plain names."""
        self.split = self.split_indices[0]
        """The split :meth:`read_mask` reads."""
        if split is not None:
            self.select_split(split)

    def select_split(self, split: int | str) -> None:
        """Read the masks of the source's stored split ``split`` (an index the directory
        holds; 'default': its first) from now on. A split it does not hold is a DataError
        naming the ones it does; 'all' (several runs) is the train command's to expand."""
        if split == "default":
            split = self.split_indices[0]
        if not isinstance(split, int) or isinstance(split, bool):
            raise ConfigError(f"config key 'split_index': {split!r} names no one split of "
                              f"{self.path} (its splits: {_listed(self.split_indices)}); "
                              "'all' is plexgt train's, one run per split")
        if split not in self.split_indices:
            several = len(self.split_indices) > 1
            again = ("" if several else
                     "; plexgt prep --split-index all keeps every split the source stores")
            raise DataError(f"{self.path}: holds split{'s' if several else ''} "
                            f"{_listed(self.split_indices)}; split_index {split} is not one "
                            f"of them{again}")
        self.split = split

    def _split_slot(self) -> int | None:
        """The :func:`mask_ds` index of the selected split (None: the plain names)."""
        return None if self.split == self.split_indices[0] else self.split

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
            return csr_from_rows(rr, cc, shape), None
        order = np.argsort(np.concatenate(rr) if rr else np.empty(0, np.int64), kind="stable")
        feats = np.concatenate(ff) if ff else np.empty((0, self.FE), np.float32)
        return csr_from_rows(rr, cc, shape), feats[order]

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
        """[rows] bool mask of split 'train' | 'valid' | 'test' in P or Q order, of the
        selected stored split (:attr:`split`); only ``rows`` are read (a rank's share)."""
        if split not in SPLITS:
            raise DataError(f"split {split!r}: expected train, valid or test")
        lo, hi = self._range(rows, self.N, "mask row")
        return self._read(NODES, mask_ds(split, self._order(order), self._split_slot()),
                          np.s_[lo:hi])

    def read_masks(self, rows: Range | None = None, order: str = "P") -> dict[str, np.ndarray]:
        """Every split's [rows] mask in P or Q order, checked to put no node in two splits."""
        masks = {s: self.read_mask(s, rows, order) for s in SPLITS}
        lo, hi = self._range(rows, self.N, "mask row")
        slot = self._split_slot()
        check_masks(f"{self.path / NODES}[{mask_ds('{train,valid,test}', order, slot)}]", masks,
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

    @property
    def has_p2q(self) -> bool:
        """Whether nodes.h5 holds the P -> Q position map (prep writes it since it exists)."""
        return P2Q_DS in self._file(NODES)

    def read_p2q(self, rows: Range | None = None) -> np.ndarray:
        """[rows] Q position of each P position in ``rows`` (:data:`P2Q_DS`)."""
        lo, hi = self._range(rows, self.N, "P -> Q row")
        pos = self._read(NODES, P2Q_DS, np.s_[lo:hi])
        check_ids(f"{self.path / NODES}[{P2Q_DS}]", pos, self.N)
        return pos

    def to_original(self, values: np.ndarray, order: str = "P") -> np.ndarray:
        """[N, ...] values in P or Q order -> the same values in original node order."""
        perm = self.read_perm(order)
        out = np.empty_like(values)
        out[perm] = values
        return out


def _listed(indices: list[int]) -> str:
    """0..9 for a run of indices, else them listed."""
    if len(indices) > 2 and indices == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}..{indices[-1]}"
    return ", ".join(map(str, indices))


def csr_from_rows(rr: list[np.ndarray], cc: list[np.ndarray], shape: tuple[int, int]
                  ) -> sp.csr_matrix:
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
