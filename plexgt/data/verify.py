"""``plexgt verify``: every checksum and invariant of a prepared directory, out of core.

Checked: the sha256 and size of every file the manifest lists (and that every expected file is
listed); perm_p and perm_q are permutations; per tile, the row counts sum to the indices' length
and the anchors equal the implied (monotone) indptr, indices are in range and strictly
increasing within a row, nnz
matches the manifest; degrees equal the row counts; the A1 and A2 nonzeros sum to E; A2 is the
partner of A1 (both encode the same original edge set: compared by an order-independent 64-bit
hash, one tile at a time); symmetry and self loops when the manifest claims them; labels and
masks agree between the P and Q orders; features have the right shape and are finite.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from plexgt.data.checks import (
    check_counts_layout,
    check_csr,
    check_degrees,
    check_edge_features,
    check_finite,
    check_indices,
    tile_indptr,
)
from plexgt.data.permute import edge_hash, is_permutation
from plexgt.data.prepared import (
    A1,
    A2,
    ANCHORS,
    COUNTS,
    EDGE_FEAT,
    FEATURES_DATA,
    FEATURES_INDICES,
    FEATURES_INDPTR,
    FEATURES_X,
    INDICES,
    MATRICES,
    NODES,
    ORDERS,
    ROW_ORDER,
    SPLITS,
    TILE_DEG,
    data_files,
    deg_ds,
    feature_file,
    labels_ds,
    mask_ds,
    perm_ds,
    tile_file,
    tile_group,
)
from plexgt.data.prepared_graph import PreparedGraph
from plexgt.errors import DataError
from plexgt.util.files import sha256_file


class _Problems(list):
    def add(self, msg: str) -> None:
        self.append(msg)


def _check_files(root: Path, m: dict[str, Any], bad: _Problems) -> int:
    files = m.get("files", {})
    for rel in data_files(int(m["T"]), int(m.get("num_feature_blocks", 0))):
        if rel not in files:
            bad.add(f"{root / rel}: not listed in the manifest")
    for rel, rec in files.items():
        p = root / rel
        if not p.exists():
            bad.add(f"{p}: missing")
            continue
        if p.stat().st_size != rec.get("bytes"):
            bad.add(f"{p}: size {p.stat().st_size} != manifest {rec.get('bytes')}")
        elif sha256_file(p) != rec.get("sha256"):
            bad.add(f"{p}: sha256 mismatch (corrupt or modified)")
    return len(files)


def _orig(values: np.ndarray, perm: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    out[perm] = values
    return out


def _check_nodes(pg: PreparedGraph, bad: _Problems) -> tuple[np.ndarray, np.ndarray] | None:
    n, where = pg.N, pg.path / NODES
    try:
        p, q = pg.read_perm("P"), pg.read_perm("Q")
    except DataError as e:
        bad.add(str(e))
        return None
    for name, perm in ((perm_ds("P"), p), (perm_ds("Q"), q)):
        if not is_permutation(perm, n):
            bad.add(f"{where}: {name} is not a permutation of 0..{n - 1}")
            return None
    labels = {}
    for o in ORDERS:  # each read checks the ranges and the splits the reader checks
        try:
            labels[o] = pg.read_labels(None, o)
        except DataError as e:
            bad.add(str(e))
    if len(labels) == 2 and not np.array_equal(_orig(labels["P"], p), _orig(labels["Q"], q)):
        bad.add(f"{where}: {labels_ds('P')} and {labels_ds('Q')} disagree on some node")
    rec = pg.manifest.get("split") if isinstance(pg.manifest.get("split"), dict) else {}
    sizes = rec.get("sizes") or [pg.manifest.get("splits", {})]
    for i, k in enumerate(pg.split_indices):  # every stored split (--split-index all)
        pg.select_split(k)
        slot = None if i == 0 else k
        masks = {}
        for o in ORDERS:
            try:
                masks[o] = pg.read_masks(None, o)
            except DataError as e:
                bad.add(str(e))
        if len(masks) < 2:
            continue
        want = sizes[i] if i < len(sizes) and isinstance(sizes[i], dict) else {}
        for s in SPLITS:
            op = _orig(masks["P"][s], p)
            if not np.array_equal(op, _orig(masks["Q"][s], q)):
                bad.add(f"{where}: {mask_ds(s, 'P', slot)} and {mask_ds(s, 'Q', slot)} "
                        "disagree on some node")
            if int(op.sum()) != want.get(s, -1):
                bad.add(f"{where}: split {s}{f' (stored split {k})' if slot else ''} holds "
                        f"{int(op.sum())} nodes, manifest says {want.get(s)}")
    pg.select_split(pg.split_indices[0])
    return p, q


def _check_tile(where: str, cnt: np.ndarray, anchors: np.ndarray, ind: np.ndarray,
                nrows: int, ncols: int, stride: int) -> np.ndarray:
    """The tile's indptr [nrows + 1]; DataError unless every invariant holds (the reader's
    rules, :mod:`plexgt.data.checks`, on the whole tile)."""
    check_counts_layout(where, cnt.shape, cnt.dtype, nrows)
    ip = tile_indptr(where, cnt, anchors, 0, stride, nrows, ind.shape[0])
    check_indices(where, ind, np.repeat(np.arange(nrows), np.diff(ip)), ncols)
    return ip


def _check_matrix(pg: PreparedGraph, which: str, p: np.ndarray, q: np.ndarray,
                  bad: _Problems) -> tuple[int, int, int, int, int]:
    """(nnz, hash of (dst, src), hash of (src, dst), self loops, hash of (dst, src, edge
    features) or 0 without them) of one matrix."""
    n, s, t = pg.N, pg.tile_size, pg.T
    rowmap, colmap = (p, q) if which == A1 else (q, p)
    order = ROW_ORDER[which]
    tile_nnz = pg.manifest.get("tile_nnz", {}).get(which)
    total = h_fwd = h_rev = loops = h_feat = 0
    deg_all = pg.read_degrees(None, order)
    for ti in range(t):
        r0, r1 = min(n, ti * s), min(n, ti * s + s)
        path = pg.path / tile_file(which, ti)
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            bad.add(f"{path}: unreadable HDF5 ({e})")
            continue
        with f:
            deg = np.zeros(r1 - r0, dtype=np.int64)
            for tj in range(t):
                c0, c1 = min(n, tj * s), min(n, tj * s + s)
                where = f"{path}[{tile_group(tj)}]"
                try:
                    g = f[tile_group(tj)]
                    cnt, anchors, ind = g[COUNTS][()], g[ANCHORS][()], g[INDICES][()]
                except (KeyError, OSError) as e:
                    bad.add(f"{where}: unreadable tile ({e})")
                    continue
                try:
                    ip = _check_tile(where, cnt, anchors, ind, r1 - r0, c1 - c0,
                                     pg.anchor_stride)
                except DataError as e:
                    bad.add(str(e))
                    continue
                if tile_nnz is not None and tile_nnz[ti][tj] != ind.size:
                    bad.add(f"{where}: {ind.size} nonzeros, manifest says {tile_nnz[ti][tj]}")
                cnt = np.diff(ip)
                deg += cnt
                dst = rowmap[np.repeat(np.arange(r0, r1), cnt)]
                src = colmap[ind.astype(np.int64) + c0]
                total += ind.size
                h_fwd = (h_fwd + edge_hash(dst, src, n)) % 2**64
                h_rev = (h_rev + edge_hash(src, dst, n)) % 2**64
                loops += int(np.count_nonzero(dst == src))
                if pg.FE:
                    try:
                        ef = g[EDGE_FEAT][()] if ind.size else np.zeros((0, pg.FE), np.float32)
                    except (KeyError, OSError) as e:
                        bad.add(f"{where}: unreadable edge features ({e})")
                        continue
                    try:
                        check_edge_features(where, ef.shape, ind.size, pg.FE)
                        check_finite(where, ef, 0, "entry")
                    except DataError as e:
                        bad.add(str(e))
                        continue
                    h_feat = (h_feat + edge_hash(dst, src, n, ef)) % 2**64
            try:
                stored = f[TILE_DEG][()]
            except KeyError:
                bad.add(f"{path}: missing dataset {TILE_DEG!r}")
                continue
            except OSError as e:  # a damaged chunk (its checksum), as for the tiles above
                bad.add(f"{path}: unreadable dataset {TILE_DEG!r} ({e})")
                continue
            try:
                check_degrees(f"{path}[{TILE_DEG}]", stored, deg, True)
                check_degrees(f"{pg.path / NODES}[{deg_ds(order)}]", deg_all[r0:r1], deg, True)
            except DataError as e:
                bad.add(str(e))
    return total, h_fwd, h_rev, loops, h_feat


def _check_features(pg: PreparedGraph, bad: _Problems) -> None:
    fb, nfb = pg.feature_block_rows, int(pg.manifest.get("num_feature_blocks", 0))
    if pg.F and nfb != -(-pg.N // fb):
        bad.add(f"{pg.path}: {nfb} feature blocks cannot hold N={pg.N} rows of {fb}")
    for b in range(nfb):
        path = pg.path / feature_file(b)
        lo, hi = b * fb, min(pg.N, b * fb + fb)
        try:
            with h5py.File(path, "r") as f:
                if pg.sparse_features:
                    _check_csr_block(f, path, hi - lo, pg.F, bad)
                    continue
                x = f[FEATURES_X]
                if x.shape != (hi - lo, pg.F):
                    bad.add(f"{path}: {FEATURES_X} has shape {x.shape}, expected {(hi - lo, pg.F)}")
                    continue
                step = max(1, (64 << 20) // max(1, pg.F * x.dtype.itemsize))
                for a in range(0, hi - lo, step):
                    check_finite(f"{path}[{FEATURES_X}]", x[a : a + step], a)
        except (OSError, KeyError) as e:
            bad.add(f"{path}: unreadable features ({e})")
        except DataError as e:
            bad.add(str(e))


def _check_csr_block(f: h5py.File, path: Path, rows: int, ncols: int, bad: _Problems) -> None:
    """A CSR feature block: indptr [rows + 1] from 0, non-decreasing, ending at nnz; column
    indices in [0, F); finite values (the reader's rule, on the whole block)."""
    ptr, idx, val = f[FEATURES_INDPTR][()], f[FEATURES_INDICES][()], f[FEATURES_DATA][()]
    if ptr.shape != (rows + 1,):
        bad.add(f"{path}: CSR features have an indptr of {ptr.shape[0]} entries for {rows} "
                "rows")
        return
    try:
        check_csr(str(path), ptr, idx, val, ncols, True, True, idx.size)
    except DataError as e:
        bad.add(str(e))


def verify(path: str | Path, checksums: bool = True) -> dict[str, Any]:
    """Check a prepared directory; returns {'ok', 'problems', 'files', 'seconds'}."""
    t0 = time.monotonic()
    bad = _Problems()
    with PreparedGraph(path) as pg:
        nfiles = _check_files(pg.path, pg.manifest, bad) if checksums else 0
        perms = _check_nodes(pg, bad)
        if perms is not None:
            p, q = perms
            res = {w: _check_matrix(pg, w, p, q, bad) for w in MATRICES}
            (e1, h1, r1, l1, f1), (e2, h2, _, _, f2) = res[A1], res[A2]
            if e1 != pg.E or e2 != pg.E:
                bad.add(f"{pg.path}: A1 holds {e1} and A2 {e2} nonzeros; manifest E={pg.E}")
            if h1 != h2:
                bad.add(f"{pg.path}: A2 is not the partner of A1 (they encode different edges)")
            elif f1 != f2:
                bad.add(f"{pg.path}: A1 and A2 give the same edges different edge features")
            if pg.symmetrized and h1 != r1:
                bad.add(f"{pg.path}: manifest claims a symmetric graph but it is not")
            if pg.self_loops and l1 != pg.N:
                bad.add(f"{pg.path}: manifest claims self loops but {l1} of {pg.N} nodes have "
                        "one")
        _check_features(pg, bad)
    return {"ok": not bad, "problems": list(bad), "files": nfiles,
            "seconds": round(time.monotonic() - t0, 3)}
