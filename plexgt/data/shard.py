"""``plexgt prep``: stream a source into a prepared directory of tiles, out of core and in parallel.

The layout of a prepared directory (files, datasets, format version) is defined and documented
in :mod:`plexgt.data.prepared`; the options and the state a run shares in
:mod:`plexgt.data.prep_run`; the stages in :mod:`plexgt.data.prep_stages`.

Pipeline: (1) the permutations P and Q (random, degree stratified or balanced on the edges);
(2) every rank streams its share of the input edges, permutes them to (row, col) in A1 and A2
and appends them to bucket files keyed by tile (buckets.py), and likewise feature rows keyed by
row block (then the source checks what only the whole pass can show, e.g. a header's claimed
edge count: :meth:`GraphSource.check_edge_pass`); (3) each unit (a row block of A1, of A2, or
of features) is owned by one rank (round robin) and built tile by tile from the buckets:
duplicate edges merged, CSR formed, degrees summed; (4) rank 0 writes nodes.h5 and, last, the
manifest. Memory: O(N) node arrays + a parse block and a bucket buffer (both O(chunk_edges)) +
one tile; never O(E). Every file is written under a temporary name and
renamed when complete; a completion record per unit lets ``--resume`` skip finished work.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path
from typing import Any

from plexgt.data.prep_run import (
    TILE_TARGET_NNZ,
    PrepOptions,
    PrepRun,
    choose_tiles,
    default_balance_blocks,
)
from plexgt.data.prep_stages import (
    bucket_stage,
    build_stage,
    encode_counts,
    finish_stage,
    permute_stage,
)
from plexgt.data.prepared import ANCHOR, FORMAT_VERSION, MANIFEST, PARAMS, SPLITS, STAGING
from plexgt.data.runtime import Comm, read_json, write_json_atomic
from plexgt.data.source import GraphSource
from plexgt.errors import DataError

# the names other modules import from here (most were defined here before the split)
__all__ = ["ANCHOR", "FORMAT_VERSION", "SPLITS", "TILE_TARGET_NNZ", "PrepOptions", "choose_tiles",
           "default_balance_blocks", "encode_counts", "prepare"]


def _looks_prepared(d: Path) -> bool:
    """Whether ``--overwrite`` may remove ``d``: a prepared, interrupted or empty directory."""
    return (d / MANIFEST).exists() or (d / STAGING).exists() or not any(d.iterdir())


def _setup_dir(o: PrepOptions, params: dict[str, Any]) -> bool:
    """Rank 0: create or reuse the output dir. Returns whether this run created it."""
    out = Path(o.out)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory")
    if out.exists() and o.resume:
        pfile = out / PARAMS
        if pfile.exists() and read_json(pfile) != params:
            raise DataError(f"{out}: --resume with different options or input than the "
                            "interrupted run (use --overwrite to start again)")
        if not pfile.exists() and any(out.iterdir()):
            raise DataError(f"{out}: nothing to resume (no {PARAMS})")
        (out / STAGING).mkdir(exist_ok=True)
        write_json_atomic(pfile, params)
        return False
    if out.exists():
        if not o.overwrite:
            raise DataError(f"{out}: output directory exists (pass --overwrite to replace it or "
                            "--resume to complete an interrupted run)")
        if not _looks_prepared(out):
            raise DataError(f"{out}: refusing to overwrite a non-empty directory that is not a "
                            "plexgt prepared directory")
        shutil.rmtree(out)
    (out / STAGING).mkdir(parents=True)
    write_json_atomic(out / PARAMS, params)
    return True


def prep_bytes(run: PrepRun) -> int:
    """About what a prep writes at its peak: both matrices' tiles (an int32 index a nonzero,
    each of A1 and A2), the staged edge buckets (two int64 ids an edge), the features and
    the node arrays (permutations, labels, degrees, masks in two orders)."""
    e = run.src.num_edges_hint() * (2 if run.opts.symmetrize else 1) + (
        run.n if run.opts.self_loops else 0)
    return (2 * e * run.idx_dtype.itemsize + 16 * e + run.n * run.f * run.fdtype.itemsize
            + 70 * run.n)


def check_disk(out: Path, run: PrepRun) -> None:
    """Refuse before writing anything when the output's filesystem lacks the room."""
    where = out
    while not where.exists() and where != where.parent:
        where = where.parent
    need, free = prep_bytes(run), shutil.disk_usage(where).free
    if need > free:
        raise DataError(f"{out}: prep needs about {_gib(need)} GiB ({run.src.name}: N={run.n}, "
                        f"about {run.src.num_edges_hint()} edges, F={run.f}) but {where} has "
                        f"{_gib(free)} GiB free")


def _disk_full(e: OSError, out: Path) -> bool:
    """Whether a write failed for want of space (numpy's short writes carry no errno)."""
    if e.errno == errno.ENOSPC:
        return True
    try:
        st = os.statvfs(out)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)


def _gib(b: int) -> str:
    return f"{b / 2**30:.3g}"


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
        run = PrepRun.create(source, opts, comm)
    except DataError as e:
        err, run = e, None
    comm.agree(err)
    assert run is not None
    if opts.resume and (out / MANIFEST).exists():
        m = read_json(out / MANIFEST)
        if m.get("params") != run.params:
            raise DataError(f"{out}: already complete, but prepared with different options or "
                            "input (use --overwrite to prepare again)")
        return m
    if comm.rank == 0:
        try:
            check_disk(out, run)
            created = _setup_dir(opts, run.params)
        except DataError as e:
            err = e
        except OSError as e:  # a read-only or missing parent: every rank must hear of it
            err = DataError(f"{e.filename or out}: cannot create the output "
                            f"({e.strerror or e})")
    comm.agree(err)
    created = comm.bcast(created)
    try:
        try:
            permute_stage(run)
            bucket_stage(run)
            build_stage(run, fail_after)
            manifest = finish_stage(run, t_start)
        except OSError as e:
            if not _disk_full(e, out):
                raise
            raise DataError(f"{e.filename or out}: the disk is full; prep needs about "
                            f"{_gib(prep_bytes(run))} GiB there") from None
    except DataError:
        if comm.rank == 0 and created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        source.close()
    return manifest
