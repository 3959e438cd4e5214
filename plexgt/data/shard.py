"""``plexgt prep``: stream a source into a prepared directory of tiles, out of core and in parallel.

Layout of a prepared directory (format version 1; the manifest describes it fully)::

    manifest.json          written last: its presence means the directory is complete
    nodes.h5               perm_p, perm_q [N] (new position -> original id); labels_P/_Q [N];
                           mask_{train,valid,test}_P/_Q [N] bool; deg_P, deg_Q [N]
    A1/rows_00000.h5       tile row-block ti of A1 = P A Q^T; per tile a group t00000..:
    A2/rows_00000.h5       counts [rows] (uint8/16/32: nonzeros per row), anchors [rows/1024+1]
                           int64 (offset of every 1024th row; the last = nnz), indices [nnz]
                           int32 local to the tile (columns ascending per row); deg [rows] int64
    features/rows_00000.h5 x [rows, F], rows of the Q order, chunked for hyperslab reads

Tiles are a T x T grid of ceil(N/T)-sized blocks, independent of any training grid.

Pipeline: (1) every rank streams its share of the input edges, permutes them to (row, col) in
A1 and A2 and appends them to bucket files keyed by tile (buckets.py), and likewise feature rows
keyed by row block (then the source checks what only the whole pass can show, e.g. a header's
claimed edge count: :meth:`GraphSource.check_edge_pass`); (2) each unit (a row block of A1, of
A2, or of features) is owned by one rank (round robin) and built tile by tile from the buckets:
duplicate edges merged, CSR formed, degrees summed; (3) rank 0 writes nodes.h5 and, last, the
manifest. Memory: O(N) node arrays + a parse block and a bucket buffer (both O(chunk_edges)) +
one tile; never O(E). Every file is written under a temporary name and
renamed when complete; a completion record per unit lets ``--resume`` skip finished work.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from plexgt import __version__
from plexgt.data.buckets import BucketReader, BucketWriter
from plexgt.data.graph import DataError, random_split
from plexgt.data.permute import (
    balanced_permutations,
    degree_permutations,
    inverse,
    permutations,
    process_edges,
)
from plexgt.data.runtime import Comm, Progress, read_json, sha256_file, write_json_atomic
from plexgt.data.source import GraphSource, check_finite, collect_edges, parts_of

FORMAT_VERSION = 1
SPLITS = ("train", "valid", "test")
#: target nonzeros per tile when --tiles is not given (bounds the memory of one tile build)
TILE_TARGET_NNZ = 8 << 20
#: a tile stores the indptr of every ANCHOR-th row (see encode_counts)
ANCHOR = 1024


@dataclass
class PrepOptions:
    """Options of one prep run (command-line flags of ``plexgt prep``)."""

    out: Path
    tiles: int | None = None
    symmetrize: bool = False
    self_loops: bool = True
    features_dtype: str | None = None
    """'float16' | 'float32' | None (float16 sources stay float16, others become float32)."""
    seed: int = 0
    permutation: str = "random"
    """'random' (uniform, as in Plexus) | 'degree' (stratified by degree: permute.py) |
    'balanced' (degree, then refined on the edges: equal nnz per block; O(E) memory on rank 0)."""
    balance_blocks: int | None = None
    """'balanced' only: balance the split of N into this many blocks (default
    :func:`default_balance_blocks`: lcm(T, 8), so the T x T tiles and an 8 x 8 grid both)."""
    overwrite: bool = False
    resume: bool = False
    chunk_edges: int = 1 << 21
    flush_items: int | None = None
    """Records a bucket writer buffers before it flushes (default 4 * chunk_edges = 8M)."""
    feature_block_bytes: int = 1 << 28
    progress: bool = True
    source_desc: dict[str, Any] = field(default_factory=dict)
    """How the source was specified (format, input, sizes): recorded, and checked on resume."""

    def __post_init__(self) -> None:
        """Refuse a bad ``balance_blocks`` here: before the CLI opens (maybe counts) the input."""
        if self.balance_blocks is not None and self.balance_blocks < 1:
            raise DataError(f"--balance-blocks {self.balance_blocks}: must be at least 1")


def choose_tiles(n: int, e_hint: int, symmetrize: bool) -> int:
    """Default T: tiles of about TILE_TARGET_NNZ nonzeros, at least 1, at most N."""
    nnz = e_hint * (2 if symmetrize else 1) + n
    return int(min(n, max(1, math.ceil(math.sqrt(nnz / TILE_TARGET_NNZ)))))


def default_balance_blocks(t: int) -> int:
    """The split ``balanced`` targets by default: lcm(T, 8) (T when that exceeds 64).

    Why: the tiles (T) and the common 8-way grids both consist of whole blocks of it, up to a
    row at each boundary; the refinement costs ~blocks^2 per node, hence the cap.
    """
    m = t * 8 // math.gcd(t, 8)
    return m if m <= 64 else t


def encode_counts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row counts of a tile -> (counts in the narrowest unsigned dtype, anchors).

    Why not an int64 indptr: a tile of a sparse graph has ~deg/T nonzeros per row, so an
    indptr (8 B a row, per tile) would cost as much I/O as the indices themselves (T/deg
    overhead per read). Counts take 1 B a row for most tiles; anchors (the indptr of every
    ANCHOR-th row) let a reader start anywhere after summing fewer than ANCHOR counts.
    """
    mx = int(counts.max()) if counts.size else 0
    dtype = np.uint8 if mx < 1 << 8 else np.uint16 if mx < 1 << 16 else np.uint32
    indptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    anchors = np.append(indptr[:-1:ANCHOR], indptr[-1])
    return counts.astype(dtype), anchors


def _sorted_unique(key: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique's hash path is ~10x slower on int64 keys)."""
    key.sort()
    if key.size < 2:
        return key
    keep = np.empty(key.size, dtype=bool)
    keep[0] = True
    np.not_equal(key[1:], key[:-1], out=keep[1:])
    return key[keep]


def _physical_memory() -> int | None:
    """Bytes of RAM on this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _check_node_memory(n: int, name: str) -> None:
    """Refuse an N whose node arrays (~40 bytes a node) exceed this machine's memory.

    Why: N can come from a header (.mtx sizes, OGB num-node-list) whose claim no edge can
    confirm (isolated nodes are legal); allocating from it unchecked would end in a crash.
    """
    phys = _physical_memory()
    if phys is not None and 40 * n > phys:
        raise DataError(f"{name}: N={n} nodes need ~{40 * n / 2**30:.0f} GiB of node arrays, "
                        f"more than this machine's {phys / 2**30:.0f} GiB (bad header?)")


def _rows(n: int, size: int, i: int) -> tuple[int, int]:
    lo = min(n, i * size)
    return lo, min(n, lo + size)


def _h5_write_atomic(path: Path, fill: Any) -> dict[str, Any]:
    """Create ``path`` via ``fill(h5file)`` under a temporary name; return its record."""
    tmp = path.with_name(path.name + ".tmp")
    with h5py.File(tmp, "w", libver="v108", track_order=False) as f:
        fill(f)
    out = {"bytes": tmp.stat().st_size, "sha256": sha256_file(tmp)}
    tmp.replace(path)
    return out


def _ds(f: h5py.Group, name: str, data: np.ndarray, **kw: Any) -> None:
    f.create_dataset(name, data=data, track_times=False, **kw)


class _Prep:
    """State shared by the stages of one run on one rank."""

    def __init__(self, source: GraphSource, opts: PrepOptions, comm: Comm) -> None:
        self.src, self.o, self.comm = source, opts, comm
        self.out = Path(opts.out)
        self.stage = self.out / ".staging"
        n = self.n = source.num_nodes
        if n <= 0:
            raise DataError(f"{source.name}: empty graph (0 nodes)")
        _check_node_memory(n, source.name)
        t = opts.tiles if opts.tiles is not None else choose_tiles(
            n, source.num_edges_hint(), opts.symmetrize)
        if t < 1 or t > n:
            raise DataError(f"--tiles {t}: must be in [1, N={n}]")
        self.t = t
        self.size = math.ceil(n / t)
        self.idx_dtype = np.dtype(np.int32 if n < 2**31 else np.int64)
        self.f = source.num_features
        if opts.features_dtype not in (None, "float16", "float32"):
            raise DataError(f"--features-dtype {opts.features_dtype}: expected float16|float32")
        fd = opts.features_dtype or (
            "float16" if source.feature_dtype == np.dtype(np.float16) else "float32")
        self.fdtype = np.dtype(fd)
        row_bytes = max(1, self.f * self.fdtype.itemsize)
        self.fb = max(1, min(self.size, opts.feature_block_bytes // row_bytes))
        self.nfb = math.ceil(n / self.fb) if self.f else 0
        if opts.permutation not in ("random", "degree", "balanced"):
            raise DataError(f"--permutation {opts.permutation}: expected random|degree|balanced")
        self.balance_blocks = 0
        if opts.permutation == "balanced":
            b = opts.balance_blocks if opts.balance_blocks is not None else \
                default_balance_blocks(t)
            self.balance_blocks = min(b, n)  # the split actually balanced (recorded in params)
        self.balance_info: dict[str, Any] = {}
        self.pinv = self.qinv = np.empty(0, dtype=self.idx_dtype)
        if opts.permutation == "random":
            self.set_perms(*permutations(n, opts.seed))
        self._q: np.ndarray | None = None
        self.params = {
            "format_version": FORMAT_VERSION, "source": opts.source_desc, "N": n, "T": t,
            "symmetrized": opts.symmetrize, "self_loops": opts.self_loops,
            "features_dtype": fd, "seed": opts.seed, "F": self.f, "feature_block_rows": self.fb,
            "permutation": opts.permutation,
        }
        if self.balance_blocks:
            self.params["balance_blocks"] = self.balance_blocks
        self.units = ([("A1", i) for i in range(t)] + [("A2", i) for i in range(t)]
                      + [("X", i) for i in range(self.nfb)])

    def set_perms(self, p: np.ndarray, q: np.ndarray) -> None:
        self.pinv, self.qinv = inverse(p).astype(self.idx_dtype), inverse(q).astype(self.idx_dtype)

    def count_degrees(self) -> np.ndarray:
        """[N] int64 in + out degree over this rank's share of the edges (before the sum):
        from the source's earlier pass where it counted them, else from a pass of our own."""
        deg = self.src.counted_degrees(self.comm.rank, self.comm.size)
        if deg is not None:
            return deg
        deg = np.zeros(self.n, dtype=np.int64)
        for src, dst in self.src.edge_chunks(self.comm.rank, self.comm.size, self.o.chunk_edges):
            deg += np.bincount(src, minlength=self.n)
            deg += np.bincount(dst, minlength=self.n)
        return deg

    def balance(self) -> tuple[np.ndarray, np.ndarray]:
        """(perm_p, perm_q) of ``--permutation balanced``, from all the edges (rank 0 alone).

        Unlike the other stages this holds every processed edge in memory (~50 bytes an edge):
        the refinement needs each node's nonzeros per block exactly, duplicates merged.
        """
        t0 = time.monotonic()
        n, o = self.n, self.o
        e = self.src.num_edges_hint() * (2 if o.symmetrize else 1) + n
        phys = _physical_memory()
        need = 56 * e + 48 * n * self.balance_blocks
        if phys is not None and need > phys:
            raise DataError(f"{self.src.name}: --permutation balanced needs ~{need / 2**30:.0f} "
                            f"GiB for {e} edges, more than this machine's {phys / 2**30:.0f} "
                            "GiB (use --permutation degree or random)")
        src, dst = process_edges(*collect_edges(self.src.edge_chunks(0, 1, o.chunk_edges)),
                                 n, o.symmetrize, o.self_loops)
        p, q, info = balanced_permutations(src, dst, n, self.balance_blocks, o.seed)
        info["seconds"] = round(time.monotonic() - t0, 3)
        self.balance_info = info
        return p, q

    # -- stage 1: route edges and feature rows to buckets -------------------------------
    def _edge_streams(self) -> dict[str, tuple[np.dtype, int | None]]:
        return {"r": (self.idx_dtype, None), "c": (self.idx_dtype, None)}

    def _feat_streams(self) -> dict[str, tuple[np.dtype, int | None]]:
        return {"pos": (np.dtype(np.int64), None), "x": (self.fdtype, self.f)}

    def bucket(self) -> None:
        rank, w = self.comm.rank, self.comm.size
        bdir = self.stage / "buckets"
        bdir.mkdir(parents=True, exist_ok=True)
        nk = self.t * self.t
        fl = self.o.flush_items or 4 * self.o.chunk_edges
        w1 = BucketWriter(bdir / f"A1.p{rank}", nk, self._edge_streams(), fl)
        w2 = BucketWriter(bdir / f"A2.p{rank}", nk, self._edge_streams(), fl)
        ehint = self.src.num_edges_hint() * (2 if self.o.symmetrize else 1)
        prog = Progress("prep: routing edges", ehint / w, self.o.progress and rank == 0)
        s, t = self.size, self.t

        def route(src: np.ndarray, dst: np.ndarray) -> None:
            r1, c1 = self.pinv[dst], self.qinv[src]
            w1.add((r1 // s).astype(np.int64) * t + c1 // s, r=r1, c=c1)
            r2, c2 = self.qinv[dst], self.pinv[src]
            w2.add((r2 // s).astype(np.int64) * t + c2 // s, r=r2, c=c2)
            prog.update(src.size)

        for src, dst in self.src.edge_chunks(rank, w, self.o.chunk_edges):
            route(src, dst)
            if self.o.symmetrize:
                route(dst, src)
        if self.o.self_loops:
            for lo, hi in parts_of(self.n, self.o.chunk_edges, rank, w):
                ids = np.arange(lo, hi, dtype=np.int64)
                route(ids, ids)
        w1.close()
        w2.close()
        prog.close()
        if self.f and not self.src.random_access_features:
            row_bytes = self.f * self.fdtype.itemsize + 8
            wf = BucketWriter(bdir / f"X.p{rank}", self.nfb, self._feat_streams(),
                              max(1, (128 << 20) // row_bytes))
            rows = max(1, (64 << 20) // max(1, self.f * 4))
            for row0, x in self.src.feature_chunks(rank, w, rows):
                xs = np.asarray(x).astype(self.fdtype, copy=False)
                if xs.dtype != x.dtype:
                    check_finite(xs, row0, f"{self.src.name}: features cast to {self.fdtype}")
                pos = self.qinv[row0 : row0 + x.shape[0]].astype(np.int64)
                wf.add(pos // self.fb, pos=pos, x=xs)
            wf.close()

    # -- stage 2: build units ---------------------------------------------------------
    def unit_path(self, kind: str, i: int) -> Path:
        sub = {"A1": "A1", "A2": "A2", "X": "features"}[kind]
        return self.out / sub / f"rows_{i:05d}.h5"

    def done_path(self, kind: str, i: int) -> Path:
        return self.stage / "done" / f"{kind}_{i:05d}.json"

    def is_done(self, kind: str, i: int) -> bool:
        d, p = self.done_path(kind, i), self.unit_path(kind, i)
        if not (d.exists() and p.exists()):
            return False
        try:
            rec = read_json(d)
        except DataError:
            return False
        return rec.get("bytes") == p.stat().st_size

    def build_edges(self, kind: str, ti: int, readers: BucketReader) -> dict[str, Any]:
        n, s, t = self.n, self.size, self.t
        r0, r1 = _rows(n, s, ti)
        nrows = r1 - r0
        deg = np.zeros(nrows, dtype=np.int64)
        nnz: list[int] = []

        def fill(f: h5py.File) -> None:
            f.attrs.update({"matrix": kind, "ti": ti, "row_lo": r0, "row_hi": r1})
            for tj in range(t):
                c0, c1 = _rows(n, s, tj)
                rec = readers.read(ti * t + tj)
                key = (rec["r"].astype(np.int64) - r0) * (c1 - c0) + (rec["c"] - c0)
                key = _sorted_unique(key)
                counts = np.bincount(key // max(1, c1 - c0), minlength=nrows)
                indices = (key % max(1, c1 - c0)).astype(self.idx_dtype)
                g = f.create_group(f"t{tj:05d}")
                stored, anchors = encode_counts(counts)
                _ds(g, "counts", stored)
                _ds(g, "anchors", anchors)
                _ds(g, "indices", indices)
                deg[:] += counts
                nnz.append(int(key.size))
            _ds(f, "deg", deg)

        rec = _h5_write_atomic(self.unit_path(kind, ti), fill)
        rec["nnz"] = nnz
        return rec

    def build_features(self, b: int, reader: BucketReader | None) -> dict[str, Any]:
        lo, hi = _rows(self.n, self.fb, b)
        if reader is None:  # the source reads rows by id: gather, no buckets
            if self._q is None:
                self._q = inverse(self.qinv)
            x = self.src.feature_rows(self._q[lo:hi].astype(np.int64))
            rec = {"pos": np.arange(lo, hi, dtype=np.int64), "x": x.astype(self.fdtype)}
            if rec["x"].dtype != x.dtype:
                check_finite(rec["x"], lo, f"{self.src.name}: features (Q order) cast to "
                             f"{self.fdtype}")
        else:
            rec = reader.read(b)
        pos, x = rec["pos"], rec["x"]
        have = np.zeros(hi - lo, dtype=bool)
        have[pos - lo] = True
        if not have.all() or pos.size != hi - lo:
            missing = int(np.nonzero(~have)[0][0]) + lo if not have.all() else -1
            raise DataError(f"{self.src.name}: feature rows do not cover every node once "
                            f"(Q position {missing} missing or rows duplicated)")
        out = np.empty((hi - lo, self.f), dtype=self.fdtype)
        out[pos - lo] = x
        cr = max(1, min(hi - lo, (256 << 10) // (min(self.f, 64) * self.fdtype.itemsize)))

        def fill(f: h5py.File) -> None:
            f.attrs.update({"row_lo": lo, "row_hi": hi})
            _ds(f, "x", out, chunks=(cr, min(self.f, 64)))

        return _h5_write_atomic(self.unit_path("X", b), fill)

    def build_units(self, fail_after: int | None) -> None:
        rank, w = self.comm.rank, self.comm.size
        nb = read_json(self.stage / "bucketed.json")["nparts"]
        bdir = self.stage / "buckets"
        mine = [u for k, u in enumerate(self.units) if k % w == rank and not self.is_done(*u)]
        readers: dict[str, BucketReader | None] = {}
        prog = Progress("prep: building tiles", len(mine), self.o.progress and rank == 0,
                        every_s=5.0)
        for built, (kind, i) in enumerate(mine):
            if fail_after is not None and built >= fail_after:
                raise RuntimeError(f"simulated interruption after {built} units")
            if kind == "X" and self.src.random_access_features:
                readers[kind] = None
            if kind not in readers:
                streams = self._feat_streams() if kind == "X" else self._edge_streams()
                readers[kind] = BucketReader([bdir / f"{kind}.p{p}" for p in range(nb)], streams)
            for sub in ("A1", "A2", "features", ".staging/done"):
                (self.out / sub).mkdir(exist_ok=True)
            if kind == "X":
                rec = self.build_features(i, readers[kind])
            else:
                rec = self.build_edges(kind, i, readers[kind])
            rec["file"] = str(self.unit_path(kind, i).relative_to(self.out))
            write_json_atomic(self.done_path(kind, i), rec)
            prog.update(1)
        prog.close()

    # -- stage 3: node arrays and the manifest (rank 0) --------------------------------
    def node_arrays(self) -> tuple[dict[str, Any], dict[str, int], int]:
        n = self.n
        labels = self.src.labels()
        if labels is None:
            labels = np.full(n, -1, dtype=np.int64)
        labels = np.asarray(labels, dtype=np.int64)
        if labels.shape != (n,):
            raise DataError(f"{self.src.name}: {labels.shape[0]} labels disagree with N={n}")
        if labels.size and labels.min() < -1:
            raise DataError(f"{self.src.name}: label {int(labels.min())} is below -1")
        c = int(labels.max()) + 1 if labels.size else 0
        splits = self.src.splits() or random_split(n, self.o.seed)
        sizes = {k: int(np.asarray(splits.get(k, [])).size) for k in SPLITS}
        degs = {}
        for kind, order in (("A1", "P"), ("A2", "Q")):
            parts = []
            for ti in range(self.t):
                with h5py.File(self.unit_path(kind, ti), "r") as f:
                    parts.append(f["deg"][()])
            degs[order] = np.concatenate(parts)

        p, q = inverse(self.pinv).astype(np.int64), inverse(self.qinv).astype(np.int64)

        def fill(f: h5py.File) -> None:
            _ds(f, "perm_p", p)
            _ds(f, "perm_q", q)
            for order, perm in (("P", p), ("Q", q)):
                _ds(f, f"labels_{order}", labels[perm])
                _ds(f, f"deg_{order}", degs[order])
                for k in SPLITS:
                    m = np.zeros(n, dtype=bool)
                    idx = np.asarray(splits.get(k, []), dtype=np.int64)
                    if idx.size and (idx.min() < 0 or idx.max() >= n):
                        raise DataError(f"{self.src.name}: split '{k}' holds an id outside "
                                        f"[0, {n})")
                    m[idx] = True
                    _ds(f, f"mask_{k}_{order}", m[perm])

        rec = _h5_write_atomic(self.out / "nodes.h5", fill)
        return rec, sizes, c

    def finish(self, t_start: float) -> dict[str, Any]:
        nodes_rec, split_sizes, c = self.node_arrays()
        files = {"nodes.h5": nodes_rec}
        tile_nnz: dict[str, list[list[int]]] = {"A1": [], "A2": []}
        for kind, i in self.units:
            rec = read_json(self.done_path(kind, i))
            files[rec["file"]] = {"bytes": rec["bytes"], "sha256": rec["sha256"]}
            if kind != "X":
                tile_nnz[kind].append(rec["nnz"])
        e1 = int(np.sum(tile_nnz["A1"]))
        e2 = int(np.sum(tile_nnz["A2"]))
        if e1 != e2:
            raise RuntimeError(f"internal error: A1 holds {e1} nonzeros, A2 {e2}")
        nnz = np.asarray(tile_nnz["A1"], dtype=np.float64)
        imbalance = float(nnz.max() / nnz.mean()) if nnz.mean() > 0 else 1.0
        rnd = self.o.permutation == "random"
        sources = [{"path": str(p), "bytes": p.stat().st_size, "sha256": sha256_file(p)}
                   for p in self.src.files]
        manifest = {
            "format": "plexgt-prepared", "format_version": FORMAT_VERSION,
            "plexgt_version": __version__, "name": self.src.name,
            "N": self.n, "E": e1, "F": self.f, "C": c,
            "dtypes": {"features": str(self.fdtype), "indices": str(self.idx_dtype),
                       "anchors": "int64", "labels": "int64", "deg": "int64", "perm": "int64",
                       "mask": "bool"},
            "T": self.t, "tile_size": self.size, "feature_block_rows": self.fb,
            "tile_format": "counts+anchors", "anchor_stride": ANCHOR,
            "num_feature_blocks": self.nfb,
            "self_loops": self.o.self_loops, "symmetrized": self.o.symmetrize,
            "permutation": {"method": self.o.permutation, "seed": self.o.seed,
                            "perm_p_rng": [self.o.seed, 1 if rnd else 3],
                            "perm_q_rng": [self.o.seed, 2 if rnd else 4],
                            **({"balance": self.balance_info} if self.balance_blocks else {})},
            "splits": split_sizes, "tile_nnz": tile_nnz, "tile_imbalance": imbalance,
            "source": self.o.source_desc, "source_files": sources, "files": files,
            "prep_seconds": round(time.monotonic() - t_start, 3), "prep_ranks": self.comm.size,
            "params": self.params,
        }
        for sub in ("A1", "A2", "features"):  # leftovers of interrupted writes
            for tmp in (self.out / sub).glob("*.tmp"):
                tmp.unlink()
        write_json_atomic(self.out / "manifest.json", manifest)
        shutil.rmtree(self.stage, ignore_errors=True)
        return manifest


def _looks_prepared(d: Path) -> bool:
    return (d / "manifest.json").exists() or (d / ".staging").exists() or not any(d.iterdir())


def _setup_dir(o: PrepOptions, params: dict[str, Any]) -> bool:
    """Rank 0: create or reuse the output dir. Returns whether this run created it."""
    out = Path(o.out)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory")
    if out.exists() and o.resume:
        pfile = out / ".staging" / "params.json"
        if pfile.exists() and read_json(pfile) != params:
            raise DataError(f"{out}: --resume with different options or input than the "
                            "interrupted run (use --overwrite to start again)")
        if not pfile.exists() and any(out.iterdir()):
            raise DataError(f"{out}: nothing to resume (no .staging/params.json)")
        (out / ".staging").mkdir(exist_ok=True)
        write_json_atomic(out / ".staging" / "params.json", params)
        return False
    if out.exists():
        if not o.overwrite:
            raise DataError(f"{out}: output directory exists (pass --overwrite to replace it or "
                            "--resume to complete an interrupted run)")
        if not _looks_prepared(out):
            raise DataError(f"{out}: refusing to overwrite a non-empty directory that is not a "
                            "plexgt prepared directory")
        shutil.rmtree(out)
    (out / ".staging").mkdir(parents=True)
    write_json_atomic(out / ".staging" / "params.json", params)
    return True


def prepare(source: GraphSource, opts: PrepOptions, comm: Comm | None = None,
            fail_after: int | None = None) -> dict[str, Any]:
    """Run prep on every rank of ``comm``; returns the manifest (identical on every rank).

    ``fail_after`` (tests only) interrupts this rank after it has built that many units.
    A :class:`DataError` on any rank stops all of them and removes the output (unless it was a
    resumed directory); any other interruption leaves a directory ``--resume`` completes.
    """
    comm = comm or Comm(None)
    t_start = time.monotonic()
    out = Path(opts.out)
    err: BaseException | None = None
    created = False
    try:
        st = _Prep(source, opts, comm)
    except DataError as e:
        err, st = e, None
    comm.agree(err)
    assert st is not None
    if opts.resume and (out / "manifest.json").exists():
        m = read_json(out / "manifest.json")
        if m.get("params") != st.params:
            raise DataError(f"{out}: already complete, but prepared with different options or "
                            "input (use --overwrite to prepare again)")
        return m
    if comm.rank == 0:
        try:
            created = _setup_dir(opts, st.params)
        except DataError as e:
            err = e
    comm.agree(err)
    created = comm.bcast(created)
    try:
        if opts.permutation == "degree":
            deg = comm.run(st.count_degrees)
            st.set_perms(*degree_permutations(comm.sum(deg), opts.seed))
        elif opts.permutation == "balanced":
            perms = comm.run(st.balance if comm.rank == 0 else lambda: None)
            st.set_perms(*comm.bcast(perms))
        marker = st.stage / "bucketed.json"
        redo = True
        if marker.exists():
            redo = read_json(marker).get("nparts") != comm.size
        comm.agree(None)
        if redo:
            if comm.rank == 0 and marker.exists():
                marker.unlink()
            comm.run(lambda: st.bucket())
            # counts a split pass could not check (a header's claimed edges): summed, checked
            stats = source.edge_pass_stats()
            if stats.size:
                totals = comm.sum(np.array(stats, dtype=np.int64))
                comm.run(lambda: source.check_edge_pass(totals))
            if comm.rank == 0:
                write_json_atomic(marker, {"nparts": comm.size})
            comm.agree(None)
        comm.run(lambda: st.build_units(fail_after))
        manifest = None
        if comm.rank == 0:
            manifest = comm.run(lambda: st.finish(t_start))
        else:
            comm.run(lambda: None)
        manifest = comm.bcast(manifest)
    except DataError:
        if comm.rank == 0 and created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        source.close()
    return manifest

