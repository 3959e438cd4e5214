"""The four stages of a prep run, in pipeline order, each a collective function of a PrepRun.

(1) :func:`permute_stage`: perm_p and perm_q (``random`` needs no edges and is set already);
(2) :func:`bucket_stage`: every rank routes its share of the edges to bucket files keyed by
tile of A1 and of A2 (buckets.py), and its feature rows keyed by row block; (3)
:func:`build_stage`: every unit (a row block of A1, of A2, or of features) is built by one rank
from the buckets; (4) :func:`~plexgt.data.prep_finish.finish_stage` (its own module): rank 0
writes nodes.h5 and, last, the manifest.
Each stage ends in an agreement of all ranks
(:class:`~plexgt.distributed.hostcomm.HostComm`), so an error anywhere stops every rank at the
same boundary. File names: prepared.py.
"""

from __future__ import annotations

import time
from typing import Any

import h5py
import numpy as np

from plexgt.data.buckets import BucketReader, BucketWriter
from plexgt.data.h5write import dataset, write_h5_atomic
from plexgt.data.permute import (
    balanced_permutations,
    degree_permutations,
    inverse,
    process_edges,
)
from plexgt.data.prep_run import PrepRun, feature_chunk, physical_memory
from plexgt.data.prepared import (
    A1,
    A2,
    ANCHOR,
    ANCHORS,
    BUCKETED,
    BUCKETS,
    COUNTS,
    DONE,
    EDGE_FEAT,
    FEATURE_UNIT,
    FEATURES,
    FEATURES_DATA,
    FEATURES_INDICES,
    FEATURES_INDPTR,
    FEATURES_X,
    INDICES,
    MATRICES,
    TILE_DEG,
    bucket_base,
    tile_group,
    unit_file,
)
from plexgt.data.reciprocity import (
    ReverseSample,
    decide,
    gather_reciprocity,
    reciprocity,
)
from plexgt.data.source import check_finite, collect_edges, parts_of
from plexgt.errors import DataError
from plexgt.util.files import read_json, write_json_atomic
from plexgt.util.progress import Progress

Streams = dict[str, tuple[np.dtype, int | None]]


def _block(n: int, size: int, i: int) -> tuple[int, int]:
    """[lo, hi) of block ``i`` of ``size`` rows out of ``n`` (empty past the end)."""
    lo = min(n, i * size)
    return lo, min(n, lo + size)


# -- stage 1: the permutations ---------------------------------------------------------------
def permute_stage(run: PrepRun) -> None:
    """Collective: set perm_p and perm_q of ``degree`` and ``balanced``.

    ``degree`` needs every node's degree, so each rank counts its share and the counts are
    summed; ``balanced`` needs every edge, so rank 0 alone computes it and broadcasts.
    """
    comm, o = run.comm, run.opts
    if run.permutation == "degree":
        deg = run.local(lambda: count_degrees(run))
        run.set_perms(*degree_permutations(comm.sum(deg), o.seed))
    elif run.permutation == "balanced":
        res = comm.bcast(run.local(lambda: balance(run) if comm.rank == 0 else None))
        run.set_reciprocity(res[2])
        run.set_perms(res[0], res[1])


def count_degrees(run: PrepRun) -> np.ndarray:
    """[N] int64 in + out degree over this rank's share of the edges (before the sum):
    from the source's earlier pass where it counted them, else from a pass of our own."""
    rank, w = run.comm.rank, run.comm.size
    deg = run.src.counted_degrees(rank, w)
    if deg is not None:
        return deg
    deg = np.zeros(run.n, dtype=np.int64)
    for src, dst in run.src.edge_chunks(rank, w, run.opts.chunk_edges):
        deg += np.bincount(src, minlength=run.n)
        deg += np.bincount(dst, minlength=run.n)
    return deg


def balance(run: PrepRun) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(perm_p, perm_q, reciprocity) of ``--permutation balanced``, from all the edges (rank 0
    alone), which also count their reverse edges exactly and so decide ``--symmetrize auto``.

    Unlike the other stages this holds every processed edge in memory (~50 bytes an edge):
    the refinement needs each node's nonzeros per block exactly, duplicates merged.
    """
    t0 = time.monotonic()
    n, o = run.n, run.opts
    e = run.src.num_edges_hint() * (2 if run.sym_bound else 1) + n
    phys = physical_memory()
    need = 56 * e + 48 * n * run.balance_blocks
    if phys is not None and need > phys:
        raise DataError(f"{run.src.name}: --permutation balanced needs ~{need / 2**30:.0f} "
                        f"GiB for {e} edges, more than this machine's {phys / 2**30:.0f} "
                        "GiB (use --permutation degree or random)")
    src, dst = collect_edges(run.src.edge_chunks(0, 1, o.chunk_edges))
    # the same bounded sample as the streamed pass (an exact count here sorted every edge
    # again: +120 MB on 2M edges, over the refinement's own arrays)
    sample = ReverseSample(int(src.size), 1)
    for lo in range(0, int(src.size), o.chunk_edges):
        sample.add(src[lo:lo + o.chunk_edges], dst[lo:lo + o.chunk_edges])
    recip = reciprocity(*sample.edges(), n, sample.exact, int(src.size))
    sym = decide(run.asked_symmetrize, recip)
    src, dst = process_edges(src, dst, n, sym, o.self_loops)
    p, q, info = balanced_permutations(src, dst, n, run.balance_blocks, o.seed)
    info["seconds"] = round(time.monotonic() - t0, 3)
    run.balance_info = info
    return p, q, recip


# -- stage 2: route edges and feature rows to buckets ----------------------------------------
def edge_streams(run: PrepRun) -> Streams:
    """Bucket records of a matrix: (row, column) in its permuted order (and the edge's
    features when the source has them)."""
    out: Streams = {"r": (run.idx_dtype, None), "c": (run.idx_dtype, None)}
    if run.fe:
        out["ef"] = (np.dtype(np.float32), run.fe)
    return out


def feature_streams(run: PrepRun) -> Streams:
    """Bucket records of the features: Q position and the [F] row."""
    return {"pos": (np.dtype(np.int64), None), "x": (run.fdtype, run.f)}


def bucket_stage(run: PrepRun) -> None:
    """Collective: fill the buckets, unless a run on as many ranks already did (``--resume``).

    Then the source checks what only the whole pass can show (e.g. a header's claimed edge
    count: :meth:`GraphSource.check_edge_pass`), on the counts of every rank summed.
    """
    comm, source = run.comm, run.src
    marker = run.path(BUCKETED)
    redo, done = True, {}
    if marker.exists():
        done = read_json(marker)
        redo = done.get("nparts") != comm.size
    comm.agree(None)
    if not redo:
        if not run.reciprocity:
            run.set_reciprocity(done["reciprocity"])
        if done.get("feature_density") is not None:
            run.set_density(done["feature_density"])
        return
    if comm.rank == 0:
        marker.unlink(missing_ok=True)
    res = run.local(lambda: bucket(run))
    assert res is not None
    sample, counts = res
    if not run.reciprocity:  # every rank's sample counted on rank 0: one decision
        run.set_reciprocity(gather_reciprocity(sample, run.n, comm))
    if run.f and counts is not None:  # every rank's count summed: one density, one layout
        nnz, cells = (int(v) for v in comm.sum(np.array(counts, dtype=np.int64)))
        run.set_density(nnz / max(1, cells))
    # counts a split pass could not check (a header's claimed edges): summed, checked
    stats = source.edge_pass_stats()
    if stats.size:
        totals = comm.sum(np.array(stats, dtype=np.int64))
        run.local(lambda: source.check_edge_pass(totals))
    rec = {"nparts": comm.size, "reciprocity": run.reciprocity,
           "feature_density": run.feature_density}
    run.local(lambda: write_json_atomic(marker, rec) if comm.rank == 0 else None)


def bucket(run: PrepRun) -> tuple[ReverseSample, tuple[int, int] | None]:
    """This rank's share: its edges into A1 and A2 (as given, and self loops: the reverse
    edges are added when the tiles are built), and its feature rows unless the source reads
    rows by id (then the build stage gathers them). Returns the edges' reciprocity sample and
    (nonzeros, values) of the feature rows it read (None: none read, the density is known)."""
    run.path(BUCKETS).mkdir(parents=True, exist_ok=True)
    sample = _bucket_edges(run)
    counts = None
    if run.f and not run.src.random_access_features:
        counts = _bucket_features(run)
    elif run.f and run.sparse is None:  # rows read by id later: count them in a pass of ours
        counts = _count_features(run)
    return sample, counts


def _bucket_edges(run: PrepRun) -> ReverseSample:
    """Edge (src, dst) is A[dst, src]: (pinv[dst], qinv[src]) in A1, (qinv[dst], pinv[src]) in
    A2, each keyed by its tile (row block * T + column block)."""
    rank, o = run.comm.rank, run.opts
    nk = run.t * run.t
    fl = o.flush_items or 4 * o.chunk_edges
    with (BucketWriter(run.path(bucket_base(A1, rank)), nk, edge_streams(run), fl) as w1,
          BucketWriter(run.path(bucket_base(A2, rank)), nk, edge_streams(run), fl) as w2):
        return _route_edges(run, w1, w2)


def _route_edges(run: PrepRun, w1: BucketWriter, w2: BucketWriter) -> ReverseSample:
    """This rank's share of the edges (and self loops) into the A1 and A2 buckets; its
    sample of them for the reciprocity (:mod:`plexgt.data.reciprocity`)."""
    rank, w, o = run.comm.rank, run.comm.size, run.opts
    ehint = run.src.num_edges_hint()
    sample = ReverseSample(ehint, w)
    prog = Progress("prep: routing edges", ehint / w, o.progress and rank == 0)
    s, t, pinv, qinv = run.size, run.t, run.pinv, run.qinv

    def route(src: np.ndarray, dst: np.ndarray, attr: np.ndarray | None = None) -> None:
        ef = {} if attr is None else {"ef": attr}
        r1, c1 = pinv[dst], qinv[src]
        w1.add((r1 // s).astype(np.int64) * t + c1 // s, r=r1, c=c1, **ef)
        r2, c2 = qinv[dst], pinv[src]
        w2.add((r2 // s).astype(np.int64) * t + c2 // s, r=r2, c=c2, **ef)
        prog.update(src.size)

    # an edge's features go with it, and with its reverse; added self loops have zeros
    chunks = (run.src.edge_attr_chunks(rank, w, o.chunk_edges) if run.fe else
              ((a, b, None) for a, b in run.src.edge_chunks(rank, w, o.chunk_edges)))
    for src, dst, attr in chunks:
        route(src, dst, attr)
        if not run.reciprocity:
            sample.add(src, dst)
    if o.self_loops:
        for lo, hi in parts_of(run.n, o.chunk_edges, rank, w):
            ids = np.arange(lo, hi, dtype=np.int64)
            route(ids, ids, np.zeros((ids.size, run.fe), np.float32) if run.fe else None)
    prog.close()
    return sample


def _count_features(run: PrepRun) -> tuple[int, int]:
    """(nonzeros, values) of this rank's share of the feature rows, cast as stored."""
    nnz = cells = 0
    rows = max(1, (64 << 20) // max(1, run.f * 4))
    for _, x in run.src.feature_chunks(run.comm.rank, run.comm.size, rows):
        nnz += int(np.count_nonzero(np.asarray(x).astype(run.fdtype, copy=False)))
        cells += int(x.size)
    return nnz, cells


def _bucket_features(run: PrepRun) -> tuple[int, int]:
    """Feature rows, cast to the stored dtype (refused if that overflows), keyed by the block
    of their Q position. Returns (nonzeros, values) of the rows as stored: the measured
    density decides ``--sparse-features auto`` for a source that cannot tell it."""
    rank, w, f, fdtype = run.comm.rank, run.comm.size, run.f, run.fdtype
    row_bytes = f * fdtype.itemsize + 8
    rows = max(1, (64 << 20) // max(1, f * 4))
    nnz = cells = 0
    with BucketWriter(run.path(bucket_base(FEATURE_UNIT, rank)), run.nfb, feature_streams(run),
                      max(1, (128 << 20) // row_bytes)) as wf:
        for row0, x in run.src.feature_chunks(rank, w, rows):
            # a chunk names its rows by its first original id, or by every id (a node table)
            ids = row0 if isinstance(row0, np.ndarray) else np.arange(row0, row0 + x.shape[0])
            xs = np.asarray(x).astype(fdtype, copy=False)
            if xs.dtype != x.dtype:
                check_finite(xs, int(ids[0]) if ids.size else 0,
                             f"{run.src.name}: features cast to {fdtype}")
            pos = run.qinv[ids].astype(np.int64)
            wf.add(pos // run.fb, pos=pos, x=xs)
            nnz += int(np.count_nonzero(xs))
            cells += int(xs.size)
    return nnz, cells


# -- stage 3: build the units from the buckets -----------------------------------------------
def build_stage(run: PrepRun, fail_after: int | None) -> None:
    """Collective: every rank builds the units it owns (round robin) that are not done yet.

    ``fail_after`` (tests only) interrupts this rank after it has built that many units.
    """
    run.local(lambda: build_units(run, fail_after))


def is_done(run: PrepRun, kind: str, i: int) -> bool:
    """Whether a unit's completion record and file exist and agree on the file's size."""
    d, p = run.done_path(kind, i), run.unit_path(kind, i)
    if not (d.exists() and p.exists()):
        return False
    try:
        rec = read_json(d)
    except DataError:
        return False
    return rec.get("bytes") == p.stat().st_size


def build_units(run: PrepRun, fail_after: int | None) -> None:
    """This rank's units, each written atomically, then recorded as done (for ``--resume``)."""
    rank, w = run.comm.rank, run.comm.size
    nb = read_json(run.path(BUCKETED))["nparts"]
    mine = [u for k, u in enumerate(run.units) if k % w == rank and not is_done(run, *u)]
    readers: dict[str, BucketReader | None] = {}
    q: np.ndarray | None = None  # perm_q, once feature rows are gathered by original id
    prog = Progress("prep: building tiles", len(mine), run.opts.progress and rank == 0,
                    every_s=5.0)
    for built, (kind, i) in enumerate(mine):
        if fail_after is not None and built >= fail_after:
            raise RuntimeError(f"simulated interruption after {built} units")
        if kind == FEATURE_UNIT and run.src.random_access_features:
            readers[kind] = None
        if kind not in readers:
            streams = feature_streams(run) if kind == FEATURE_UNIT else edge_streams(run)
            readers[kind] = BucketReader([run.path(bucket_base(kind, p)) for p in range(nb)],
                                         streams)
        for sub in (*MATRICES, FEATURES, DONE):
            run.path(sub).mkdir(exist_ok=True)
        reader = readers[kind]
        if kind != FEATURE_UNIT:
            partner = None
            if run.symmetrize:  # the reverse edges: the other matrix's tiles, transposed
                other = A2 if kind == A1 else A1
                if other not in readers:
                    readers[other] = BucketReader(
                        [run.path(bucket_base(other, p)) for p in range(nb)], edge_streams(run))
                partner = readers[other]
            rec = build_tile_row(run, kind, i, reader, partner)
        elif reader is None:  # the source reads rows by id: gather, no buckets
            q = inverse(run.qinv) if q is None else q
            rec = build_features(run, i, _gathered_rows(run, i, q))
        else:
            rec = build_features(run, i, reader.read(i))
        rec["file"] = unit_file(kind, i)
        write_json_atomic(run.done_path(kind, i), rec)
        prog.update(1)
    prog.close()


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


def _merged_features(key: np.ndarray, ef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct keys, [k, F_e] float32 features of each: the sum over its duplicate
    edges). The duplicates are summed in float64 in an order fixed by their values, so the
    result does not depend on the order the buckets delivered them in (prep's rank count)."""
    order = np.lexsort((*ef.T[::-1], key))
    key, ef = key[order], ef[order].astype(np.float64)
    if key.size == 0:
        return key, ef.astype(np.float32)
    start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    return key[start], np.add.reduceat(ef, start, axis=0).astype(np.float32)


def _sorted_unique(key: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique's hash path is ~10x slower on int64 keys)."""
    key.sort()
    if key.size < 2:
        return key
    keep = np.empty(key.size, dtype=bool)
    keep[0] = True
    np.not_equal(key[1:], key[:-1], out=keep[1:])
    return key[keep]


def build_tile_row(run: PrepRun, kind: str, ti: int, reader: BucketReader,
                   partner: BucketReader | None = None) -> dict[str, Any]:
    """Row block ``ti`` of matrix ``kind``, one tile at a time: duplicate edges merged, rows
    encoded (:func:`encode_counts`), degrees summed. Returns the file's record with the
    nonzeros of each tile.

    ``partner`` (symmetrizing): the other matrix's buckets. Why they hold the reverse edges:
    A1 = P A Q^T and A2 = Q A P^T, so P A^T Q^T = A2^T and tile (i, j) of A1 + A1's transpose
    pattern is tile (i, j) of A1 plus tile (j, i) of A2 transposed (likewise for A2), each
    reversed copy with its edge's features. Deciding here, after the one pass that measured
    the reciprocity, costs no second pass over the input."""
    n, s, t = run.n, run.size, run.t
    r0, r1 = _block(n, s, ti)
    nrows = r1 - r0
    deg = np.zeros(nrows, dtype=np.int64)
    nnz: list[int] = []
    k = count_grid(n)
    cells = np.zeros(k * k, dtype=np.int64)

    def fill(f: h5py.File) -> None:
        f.attrs.update({"matrix": kind, "ti": ti, "row_lo": r0, "row_hi": r1})
        for tj in range(t):
            c0, c1 = _block(n, s, tj)
            rec = reader.read(ti * t + tj)
            if partner is not None:
                rev = partner.read(tj * t + ti)
                rec = {"r": np.concatenate([rec["r"], rev["c"]]),
                       "c": np.concatenate([rec["c"], rev["r"]]),
                       **({"ef": np.concatenate([rec["ef"], rev["ef"]])} if run.fe else {})}
            key = (rec["r"].astype(np.int64) - r0) * (c1 - c0) + (rec["c"] - c0)
            ef = None
            if run.fe:
                key, ef = _merged_features(key, rec["ef"])
            else:
                key = _sorted_unique(key)
            counts = np.bincount(key // max(1, c1 - c0), minlength=nrows)
            indices = (key % max(1, c1 - c0)).astype(run.idx_dtype)
            g = f.create_group(tile_group(tj))
            stored, anchors = encode_counts(counts)
            dataset(g, COUNTS, stored)
            dataset(g, ANCHORS, anchors)
            dataset(g, INDICES, indices)
            if ef is not None:
                dataset(g, EDGE_FEAT, ef, chunks=(max(1, min(ef.shape[0], 1 << 14)), run.fe)
                    if ef.shape[0] else None)
            deg[:] += counts
            nnz.append(int(key.size))
            cells[:] += block_counts(key // max(1, c1 - c0) + r0, key % max(1, c1 - c0) + c0,
                                     n, k)
        dataset(f, TILE_DEG, deg)

    rec = write_h5_atomic(run.unit_path(kind, ti), fill)
    rec["nnz"] = nnz
    rec["block_nnz"] = cells.tolist()
    return rec


def count_grid(n: int) -> int:
    """K of the K x K grid of node blocks the manifest's ``block_nnz`` counts nonzeros on (64,
    fewer on tiny graphs): the planner's view of how evenly any partition of the stored
    pattern spreads its nonzeros (:mod:`plexgt.plan.balance`)."""
    return max(1, min(64, n))


def block_counts(rows: np.ndarray, cols: np.ndarray, n: int, k: int) -> np.ndarray:
    """[k * k] nonzeros of the entries (rows, cols) (node ids < n) per cell (i, j) of rows
    and columns [ceil(i·n/k), ceil((i+1)·n/k)), row-major."""
    br = (rows.astype(np.int64) * k) // max(1, n)
    bc = (cols.astype(np.int64) * k) // max(1, n)
    return np.bincount(br * k + bc, minlength=k * k)


def _gathered_rows(run: PrepRun, b: int, q: np.ndarray) -> dict[str, np.ndarray]:
    """Feature block ``b`` read from the source by original id (``q``: perm_q), as the
    records the buckets would hold."""
    lo, hi = _block(run.n, run.fb, b)
    x = run.src.feature_rows(q[lo:hi].astype(np.int64))
    rec = {"pos": np.arange(lo, hi, dtype=np.int64), "x": x.astype(run.fdtype)}
    if rec["x"].dtype != x.dtype:
        check_finite(rec["x"], lo, f"{run.src.name}: features (Q order) cast to {run.fdtype}")
    return rec


def build_features(run: PrepRun, b: int, rec: dict[str, np.ndarray]) -> dict[str, Any]:
    """Feature block ``b`` from its records (Q position, row), which must cover every row of
    the block exactly once. Returns the file's record."""
    lo, hi = _block(run.n, run.fb, b)
    pos, x = rec["pos"], rec["x"]
    have = np.zeros(hi - lo, dtype=bool)
    have[pos - lo] = True
    if not have.all() or pos.size != hi - lo:
        missing = int(np.nonzero(~have)[0][0]) + lo if not have.all() else -1
        raise DataError(f"{run.src.name}: feature rows do not cover every node once "
                        f"(Q position {missing} missing or rows duplicated)")
    out = np.empty((hi - lo, run.f), dtype=run.fdtype)
    out[pos - lo] = x
    chunks = feature_chunk(hi - lo, run.f, run.fdtype.itemsize)
    nnz = int(np.count_nonzero(out))

    def fill(f: h5py.File) -> None:
        f.attrs.update({"row_lo": lo, "row_hi": hi})
        if run.sparse:  # rows as CSR: a reader slices indptr, then one range of each array
            rows, cols = np.nonzero(out)  # row-major: sorted by row, then column
            indptr = np.zeros(hi - lo + 1, dtype=np.int64)
            np.cumsum(np.bincount(rows, minlength=hi - lo), out=indptr[1:])
            dataset(f, FEATURES_INDPTR, indptr)
            dataset(f, FEATURES_INDICES, cols.astype(np.int32))
            # not scipy's csr_matrix: it refuses float16 (OGB npz rows, --features-dtype)
            dataset(f, FEATURES_DATA, out[rows, cols])
        else:
            dataset(f, FEATURES_X, out, chunks=chunks)

    return {**write_h5_atomic(run.unit_path(FEATURE_UNIT, b), fill), "nnz": nnz}
