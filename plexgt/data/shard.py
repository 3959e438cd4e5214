"""``plexgt prep``: stream a source into a prepared directory of tiles, out of core and in parallel.

The layout of a prepared directory (files, datasets, format version) is defined and documented
in :mod:`plexgt.data.prepared`; the options and the state a run shares in
:mod:`plexgt.data.prep_run`; the stages in :mod:`plexgt.data.prep_stages` and
:mod:`plexgt.data.prep_finish`.

Pipeline: (1) the permutations P and Q (random, degree stratified or balanced on the edges);
(2) every rank streams its share of the input edges, permutes them to (row, col) in A1 and A2
and appends them to bucket files keyed by tile (buckets.py), and likewise feature rows keyed by
row block (then the source checks what only the whole pass can show, e.g. a header's claimed
edge count: :meth:`GraphSource.check_edge_pass`), and the share of edges whose reverse is
present decides ``--symmetrize auto`` (:mod:`plexgt.data.reciprocity`); (3) each unit (a row
block of A1, of A2, or of features) is owned by one rank (round robin) and built tile by tile
from the buckets: the reverse edges added (the other matrix's tile, transposed) when
symmetrizing, duplicate edges merged, CSR formed, degrees summed; (4) rank 0 writes nodes.h5
and, last, the manifest. Memory: O(N) node arrays + a parse block and a bucket buffer (both
O(chunk_edges)) + one tile; never O(E). Every file is written under a temporary name and
renamed when complete; a completion record per unit lets ``--resume`` skip finished work.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from plexgt.data.prep_finish import finish_stage
from plexgt.data.prep_run import (
    TILE_TARGET_NNZ,
    PrepOptions,
    PrepRun,
    choose_tiles,
    default_balance_blocks,
    disk_full,
    prep_bytes,
)
from plexgt.data.prep_stages import (
    bucket_stage,
    build_stage,
    encode_counts,
    permute_stage,
)
from plexgt.data.prepared import (
    ANCHOR,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    OWNED_DIRS,
    PARAMS,
    SPLITS,
    STAGING,
    remove_prepared,
)
from plexgt.data.source import GraphSource
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import DataError
from plexgt.util.files import read_json, write_json_atomic

# the names other modules import from here (most were defined here before the split)
__all__ = ["ANCHOR", "FORMAT_VERSION", "SPLITS", "TILE_TARGET_NNZ", "PrepOptions", "choose_tiles",
           "default_balance_blocks", "encode_counts", "prep_bytes", "prepare"]


def _json_dict(path: Path) -> dict[str, Any]:
    """``path``'s JSON object, or {} for anything else (a user's file of the same name)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


PARAMS_KEYS = frozenset({"format_version", "N", "T", "feature_block_rows", "permutation"})
"""Keys every run's .staging/params.json holds (PrepRun.create): how an interrupted prep is
told from a user's directory that happens to hold a file of that name."""


def _is_plexgts(out: Path) -> bool:
    """Whether ``out`` is a prepared directory plexgt wrote (complete: its manifest names the
    format; or interrupted: its params record is a run's), or empty. Only then may
    ``--overwrite`` touch it; a symlinked manifest or staging area is not plexgt's."""
    if not any(out.iterdir()):
        return True
    manifest = out / MANIFEST
    if manifest.exists() or manifest.is_symlink():
        return (not manifest.is_symlink() and manifest.is_file()
                and _json_dict(manifest).get("format") == FORMAT)
    params = out / PARAMS
    if (out / STAGING).is_symlink() or params.is_symlink() or not params.is_file():
        return False
    d = _json_dict(params)
    return PARAMS_KEYS <= d.keys() and isinstance(d["format_version"], int)


def input_paths(source: GraphSource, opts: PrepOptions) -> list[Path]:
    """The paths a run reads: the source's files and what the command line named."""
    named = [opts.source_desc[k] for k in ("input", "node_table", "feature_file")
             if k in opts.source_desc]
    return [Path(p) for p in (*source.files, *named)]


def check_apart(out: Path, inputs: list[Path]) -> None:
    """Refuse an output that holds the input or lies inside it: ``--overwrite`` would delete
    the input before it is read (``--input u/graph.csv --out u`` once emptied u/)."""
    o = out.resolve()
    for p in inputs:
        r = p.resolve()
        if o == r or r.is_relative_to(o):
            raise DataError(f"{out}: the input {p} lies inside it; refusing to overwrite it "
                            "(choose an --out apart from the input)")
        if o.is_relative_to(r):
            raise DataError(f"{out}: lies inside the input {p}; refusing to overwrite it "
                            "(choose an --out apart from the input)")


def _refuse_symlinks(out: Path, rel: str = "") -> None:
    """Refuse to resume into a directory whose parts prep writes are symlinks it did not make."""
    for name in OWNED_DIRS.get(rel, ()):
        sub = f"{rel}/{name}" if rel else name
        if (out / sub).is_symlink():
            raise DataError(f"{out / sub}: is a symbolic link; prep writes only into "
                            "directories it made (remove it, or prepare again with --overwrite)")
        if (out / sub).is_dir():
            _refuse_symlinks(out, sub)


def _setup_dir(o: PrepOptions, params: dict[str, Any], inputs: list[Path]) -> bool:
    """Rank 0: create or reuse the output dir. Returns whether this run created it."""
    out = Path(o.out)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory")
    if o.overwrite:
        check_apart(out, inputs)
    if out.exists() and o.resume:
        pfile = out / PARAMS
        if pfile.exists() and read_json(pfile) != params:
            raise DataError(f"{out}: --resume with different options or input than the "
                            "interrupted run (use --overwrite to start again)")
        if not pfile.exists() and any(out.iterdir()):
            raise DataError(f"{out}: nothing to resume (no {PARAMS})")
        _refuse_symlinks(out)
        try:
            (out / STAGING).mkdir(exist_ok=True)
            write_json_atomic(pfile, params)
        except OSError:
            _remove_failed(out, False, o)
            raise
        return False
    created = not out.exists()
    if not created:
        if not o.overwrite:
            raise DataError(f"{out}: output directory exists (pass --overwrite to replace it or "
                            "--resume to complete an interrupted run)")
        if not _is_plexgts(out):
            raise DataError(f"{out}: refusing to overwrite a non-empty directory that is not a "
                            "plexgt prepared directory")
    try:
        if not created:
            remove_prepared(out)
        (out / STAGING).mkdir(parents=True, exist_ok=True)  # kept if a user's file is in it
        write_json_atomic(out / PARAMS, params)
    except OSError:  # a full disk, a read-only parent: what was written goes
        _remove_failed(out, created, o)
        raise
    return created


def _remove_failed(out: Path, created: bool, opts: PrepOptions) -> None:
    """Rank 0, after an agreed DataError (or a failed set-up): remove what this run wrote (the
    prepared format's files, which ``--overwrite`` had cleared before) and the directory if
    this run made it and nothing else is there. A resumed directory keeps its finished units
    for the next ``--resume``; only this run's temporary files go (on a full disk they are
    what keeps it full)."""
    try:
        if created or opts.overwrite:
            if remove_prepared(out) and created:
                out.rmdir()
        else:
            remove_prepared(out, temporary_only=True)
    except OSError:
        pass  # best effort: the error being raised is what the user must see


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


def _gib(b: int) -> str:
    return f"{b / 2**30:.3g}"


def prepare(source: GraphSource, opts: PrepOptions, comm: HostComm | None = None,
            fail_after: int | None = None) -> dict[str, Any]:
    """Run prep on every rank of ``comm``; returns the manifest (identical on every rank).

    ``fail_after`` (tests only) interrupts this rank after it has built that many units.
    A :class:`DataError` on any rank stops all of them and removes what the run wrote (not a
    resumed directory's work; never a file the format does not name); any other interruption
    leaves a directory ``--resume`` completes.
    """
    comm = comm or HostComm(None)
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
            created = _setup_dir(opts, run.params, input_paths(source, opts))
        except DataError as e:
            err = e
        except OSError as e:  # a full disk, a read-only or missing parent: every rank must hear
            err = run.disk_full_error(e) if disk_full(e, out) else DataError(
                f"{e.filename or out}: cannot create the output ({e.strerror or e})")
    comm.agree(err)
    created = comm.bcast(created)
    try:
        try:
            permute_stage(run)
            bucket_stage(run)
            build_stage(run, fail_after)
            manifest = finish_stage(run, t_start)
        except OSError as e:  # one outside the stages' guarded work (run.local)
            if not disk_full(e, out):
                raise
            raise run.disk_full_error(e) from None
    except DataError:
        if comm.rank == 0:
            _remove_failed(out, created, opts)
        raise
    finally:
        source.close()
    return manifest
