"""Checkpoints: the run's state in the single-process model's form, written with
torch.distributed.checkpoint (DCP); a checkpoint counts once complete.

Layout: ``DIR/epoch_000042/`` holds DCP's files (``.metadata``, ``__<rank>_0.distcp``), then
``COMPLETE`` (JSON: epoch, the layout that wrote it, config hash, step, best-so-far and the
sha256 of every file), written by rank 0 after every rank has hashed the files it was given.
A crash mid-write leaves a directory without COMPLETE, which :func:`latest_complete` skips, so
``--resume`` always starts from a checkpoint that loads; the newest two complete ones are kept.

A batch-trained model (hgt: an epoch of many optimizer steps) may also stop mid-epoch:
``DIR/epoch_000041_step_000005/`` holds the state after 41 epochs and 5 steps of the next, and
its COMPLETE adds ``epoch_step`` (5) and ``epoch_loss_sum`` (the float64 sum of those steps'
losses). Checkpoints are ordered by (epoch, step), an epoch's end being step 0 of the next:
``epoch_000042`` supersedes every ``epoch_000041_step_*``.

The state is *canonical*: parameters and AdamW moments under the single-process model's names
and shapes (a 3D GCN's blocks reassembled, a row-parallel model's replicated copy), so any
world size, grid or strategy resumes it, each rank slicing what it holds. DCP writes each
replicated tensor once (its planner deals the keys out over the ranks) and reads them into
the resuming run's tensors; the whole state of a gcn, gt or gps is parameters and moments of
at most a few million entries, so reassembling it costs a small all-reduce per checkpoint.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import pickle
import re
import socket
import stat
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from plexgt.errors import CheckpointError
from plexgt.training import dcp_safe, ownfiles

COMPLETE = "COMPLETE"
STOPPED = "STOPPED"
LOCK = "LOCK"
DATA_FILE = re.compile(r"__\d+_\d+\.distcp|\.metadata")
"""The files DCP writes into an epoch's directory (and COMPLETE lists)."""
LOCK_MARK = "plexgt train: "
LOCK_LINE = re.compile(r"((?:plexgt train: )?(pid \d+ on \S*))\n?")
"""LOCK's one line (earlier plexgt wrote it without the mark)."""
EPOCH_FILE = re.compile(r"__\d+_\d+\.distcp|\.metadata(\.tmp)?|COMPLETE(\.tmp)?")
"""Every name DCP or plexgt gives a file in an epoch's directory, temporaries included."""
FORMAT = 2
"""COMPLETE's ``format``: 2 = canonical DCP state (1 was one torch.save shard per rank)."""


def epoch_dir(root: Path, epoch: int, step: int = 0) -> Path:
    """The directory of the checkpoint after ``epoch`` epochs and ``step`` optimizer steps of
    the next (0: at the epoch's end, the full-graph models' only kind)."""
    return root / (f"epoch_{epoch:06d}" if not step else f"epoch_{epoch:06d}_step_{step:06d}")


def step_of(meta: dict[str, Any]) -> int:
    """The optimizer steps into its epoch a COMPLETE records (0: an epoch's end)."""
    return int(meta.get("epoch_step", 0))


def position(meta: dict[str, Any]) -> tuple[int, int]:
    """(epoch, step) of a COMPLETE: the order of a run's checkpoints."""
    return int(meta["epoch"]), step_of(meta)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _innermost(e: BaseException) -> BaseException:
    """The exception at the root of a (possibly DCP-wrapped) failure."""
    if isinstance(e, CheckpointException) and e.failures:
        e = e.failures[min(e.failures)][0]  # DCP's per-rank failures: the lowest rank's
    while e.__cause__ is not None:
        e = e.__cause__
    return e


def _why(e: BaseException) -> str:
    """The innermost reason of a (possibly DCP-wrapped) failure, on one line."""
    e = _innermost(e)
    if isinstance(e, OSError):
        return f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}"
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else type(e).__name__


def write_state(root: Path, epoch: int, state: dict[str, Any], step: int = 0
                ) -> dict[str, str]:
    """Write ``state`` (every rank the same keys and shapes; collective) under
    ``epoch_dir(root, epoch, step)``, each file created anew and none through a symlink; returns
    {file name: sha256} of the files this rank hashed (file i of the sorted listing goes to
    rank i mod P)."""
    d = epoch_dir(root, epoch, step)
    try:
        _make_dir(d)
        dcp.save(state, storage_writer=dcp_safe.Writer(d))
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP wraps every rank's
        inner = _innermost(e)
        err = (CheckpointError(str(inner)) if isinstance(inner, CheckpointError) else
               _write_error(d, e, _size_estimate(state)))
        if _world()[0] == 0 and not isinstance(inner, CheckpointError):
            _discard_epoch(d)  # DCP raises on every rank once all have stopped writing
        raise err from None
    _barrier()
    return _hash_mine(d)


def _size_estimate(state: dict[str, Any]) -> int:
    """Bytes a checkpoint of ``state`` takes: its tensors, plus about 2 KiB a tensor (DCP's
    torch.save framing of each, 1.5 KiB, and its metadata entry)."""
    return sum(v.numel() * v.element_size() + 2048 for v in state.values()
               if isinstance(v, torch.Tensor))


def _write_error(d: Path, e: BaseException, need: int) -> CheckpointError:
    """A failed write in one line. A full device shows in DCP's files as torch's "unexpected
    pos 704 vs 598" (its zip writer drops the errno); so the device's free space is asked
    too."""
    mib = f"about {need / 2**20:.3g} MiB"
    seen, todo = set(), [e]
    if isinstance(e, CheckpointException):
        todo += [f[0] for f in e.failures.values()]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT):
            what = "no space left on the device" if x.errno == errno.ENOSPC else \
                "the disk quota is exceeded"
            return CheckpointError(f"{d}: cannot write the checkpoint: {what}; the "
                                   f"checkpoint needs {mib}")
        todo += [c for c in (x.__cause__, x.__context__) if c is not None]
    try:
        st = os.statvfs(d.parent)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    if free is not None and free < need:
        return CheckpointError(f"{d}: cannot write the checkpoint: no space left on the "
                               f"device; the checkpoint needs {mib}")
    if "unexpected pos" in _why(e):  # a short write, with room on the device: a quota?
        return CheckpointError(f"{d}: cannot write the checkpoint: a write was cut short "
                               f"(is a quota full?); the checkpoint needs {mib}")
    return CheckpointError(f"{d}: cannot write the checkpoint ({_why(e)})")


def _discard_epoch(d: Path) -> None:
    """Remove a failed write's files (DCP's and plexgt's only) and its directory."""
    try:
        names = _epoch_files(d)
        if names is not None:
            _remove_epoch(d, names)
    except CheckpointError:
        pass  # something not plexgt's is there: left as it is


def _make_dir(d: Path) -> None:
    """Create an epoch's directory (or find the one another rank just created): a real
    directory, not a symlink to one."""
    try:
        d.mkdir(parents=True)
    except FileExistsError:
        k = ownfiles.kind(d)
        if k == "link":
            raise ownfiles.symlink_error(d) from None
        if k != "dir":
            raise ownfiles.foreign_error(d, "non-directory") from None


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _epoch_files(d: Path) -> list[str] | None:
    """The names in an epoch directory, all of them files DCP or plexgt writes there (None:
    no directory); CheckpointError naming anything else, or a symlink."""
    k = ownfiles.kind(d)
    if k is None:
        return None
    if k == "link":
        raise ownfiles.symlink_error(d)
    if k != "dir":
        raise ownfiles.foreign_error(d, "non-directory")
    try:
        names = sorted(os.listdir(d))
    except OSError as e:
        raise ownfiles.os_error(d, e, "list the checkpoint") from None
    for n in names:
        if not EPOCH_FILE.fullmatch(n):
            raise ownfiles.foreign_error(d / n)
        k = ownfiles.kind(d / n)
        if k == "link":
            raise ownfiles.symlink_error(d / n)
        if k != "file":
            raise ownfiles.foreign_error(d / n, "directory" if k == "dir" else
                                         "non-regular file")
    return names


def _remove_epoch(d: Path, names: list[str]) -> None:
    """Remove ``names`` (:func:`_epoch_files`) and then the directory."""
    try:
        for n in names:
            (d / n).unlink(missing_ok=True)
        d.rmdir()
    except OSError as e:
        raise CheckpointError(f"{e.filename or d}: cannot replace the old checkpoint "
                              f"({e.strerror or e})") from None


def clear_epoch(root: Path, epoch: int, run: str = "", step: int = 0) -> None:
    """Rank 0, before a write: remove what a killed run of this one left under this epoch, so
    that no COMPLETE ever covers a mix of two writes. Only DCP's and plexgt's files are
    removed; a directory holding anything else, a symlink, or another run's complete
    checkpoint is refused."""
    d = epoch_dir(root, epoch, step)
    names = _epoch_files(d)
    if names is None:
        return
    if COMPLETE in names:
        other = _complete_of(d)
        if other is None or other.get("run", "") != run:
            raise CheckpointError(f"{d}: holds a complete checkpoint of another run; plexgt "
                                  "does not replace it (use another --checkpoint-dir)")
    _remove_epoch(d, names)


def _complete_of(d: Path) -> dict[str, Any] | None:
    """An epoch directory's COMPLETE, None if it has none that reads as one."""
    try:
        meta = json.loads(ownfiles.read_text(d / COMPLETE))
        position(meta)
    except (CheckpointError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return meta if isinstance(meta, dict) else None


def _hash_mine(d: Path) -> dict[str, str]:
    rank, world = _world()
    names = sorted(n for n in os.listdir(d) if DATA_FILE.fullmatch(n))
    return {n: _sha256(d / n) for i, n in enumerate(names) if i % world == rank}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with os.fdopen(os.open(path, os.O_RDONLY | ownfiles.NOFOLLOW), "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def verify_files(root: Path, epoch: int, meta: dict[str, Any]) -> None:
    """Check this rank's share of the checkpoint's files (file i of COMPLETE's list goes to
    rank i mod P) against the sha256 recorded in COMPLETE: a damaged or missing file is
    refused rather than trained on."""
    d = epoch_dir(root, epoch, step_of(meta))
    sums = meta.get("sha256")
    if not isinstance(sums, dict) or not sums:
        raise CheckpointError(f"{d / COMPLETE}: no file checksums (format {meta.get('format')}; "
                              f"this plexgt reads format {FORMAT})")
    odd = next((n for n in sorted(sums) if not DATA_FILE.fullmatch(str(n))), None)
    if odd is not None:
        raise CheckpointError(f"{d / COMPLETE}: lists {odd!r}, not one of DCP's files")
    rank, world = _world()
    for i, name in enumerate(sorted(sums)):
        if i % world != rank:
            continue
        path = d / name
        try:
            got = _sha256(path)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: checkpoint file missing") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ownfiles.symlink_error(path) from None
            raise CheckpointError(f"{path}: unreadable checkpoint file ({e.strerror})") from None
        if got != sums[name]:
            raise CheckpointError(f"{path}: checkpoint file is damaged (sha256 differs from "
                                  f"the one recorded in {d / COMPLETE})")


def saved_keys(root: Path, epoch: int, step: int = 0) -> set[str]:
    """The state keys the checkpoint of ``epoch`` (and ``step``) holds (its checked DCP
    metadata): what a template may read from it."""
    return set(dcp_safe.read_metadata(epoch_dir(root, epoch, step)).state_dict_metadata)


def read_state(root: Path, epoch: int, template: dict[str, Any], step: int = 0
               ) -> dict[str, Any]:
    """Read a checkpoint into ``template`` (this run's tensors of the canonical shapes;
    collective) and return it."""
    d = epoch_dir(root, epoch, step)
    try:
        dcp_safe.load(d, template)  # runs nothing a crafted checkpoint holds
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - does not fit, unreadable
        inner = _innermost(e)
        if isinstance(inner, CheckpointError):
            raise CheckpointError(f"{d}: {inner}") from None
        if isinstance(inner, pickle.UnpicklingError):  # torch.load(weights_only=True) refused
            why = next((ln.split("error:", 1)[1].split(". ")[0].strip() for ln in
                        str(inner).splitlines() if "WeightsUnpickler error:" in ln), "")
            raise CheckpointError(f"{d}: a tensor of its .distcp files holds other objects "
                                  f"(refused, not run{': ' + why if why else ''})") from None
        raise CheckpointError(f"{d}: cannot read the checkpoint into this run ({_why(e)})"
                              ) from None
    return template


def check_meta(root: Path, epoch: int, meta: dict[str, Any], expect: dict[str, Any]) -> None:
    """Refuse a checkpoint whose computation differs from this run's: another dataset (both
    named), node order, or configuration (the first key that differs). The layout (world
    size, grid, strategy) may differ: the state is canonical."""
    d = epoch_dir(root, epoch, step_of(meta))
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{d / COMPLETE}: checkpoint format "
                              f"{meta.get('format', 1)}, this plexgt reads format {FORMAT}")
    if meta.get("dataset") and expect.get("dataset") and meta["dataset"] != expect["dataset"]:
        raise CheckpointError(f"{d}: trained on "
                              f"{meta.get('dataset_name') or 'another dataset'}, this run's data "
                              f"is {expect.get('dataset_name') or 'another'}; resume on the "
                              "dataset it was trained on")  # (older checkpoints record none)
    if expect.get("node_order") and meta.get("node_order") != expect["node_order"]:
        raise CheckpointError(f"{d}: its node embedding's rows follow "
                              "another prepared directory's node order; resume on the "
                              "directory it was trained on")
    if meta.get("config_hash") == expect.get("config_hash"):
        return
    if "config" in meta and "config" in expect:
        diff = _first_difference(meta["config"], expect["config"])
        if diff is not None:
            key, old, new = diff
            raise CheckpointError(f"{d}: written with {key}={old!r}, this "
                                  f"run has {key}={new!r}; resume with the same {key}")
    raise CheckpointError(f"{d}: written by another configuration "
                          f"(hash {meta.get('config_hash')!r}, this run "
                          f"{expect.get('config_hash')!r})")


def lock(root: Path) -> Any:
    """Hold ``root/LOCK`` for the life of the returned file: a second job given the same
    checkpoint directory is refused instead of overwriting the first one's checkpoints. The
    file is opened without following a symlink and written only if it is plexgt's (empty, or
    the line this writes)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ownfiles.os_error(root, e, "use the checkpoint directory") from None
    try:
        fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT | ownfiles.NOFOLLOW | os.O_NONBLOCK,
                     0o644)
    except OSError as e:
        raise ownfiles.os_error(root / LOCK, e, "use the checkpoint directory") from None
    f = os.fdopen(fd, "r+")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ownfiles.foreign_error(root / LOCK, "non-regular file")
        holder = f.read()
        if holder and not LOCK_LINE.fullmatch(holder):
            raise ownfiles.foreign_error(root / LOCK)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            who = LOCK_LINE.fullmatch(holder)
            raise CheckpointError(f"{root}: in use by {who[2] if who else 'another job'}; "
                                  "give each job its own --checkpoint-dir") from None
        f.seek(0)
        f.truncate()
        f.write(f"{LOCK_MARK}pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
    except BaseException:
        f.close()
        raise
    return f


def mark_complete(root: Path, epoch: int, meta: dict[str, Any], keep: int = 2) -> None:
    """Rank 0, once every rank's files are written and hashed: declare ``epoch`` (and
    ``meta``'s ``epoch_step``, if any) complete (``meta`` holds the checksums and the run's id)
    and drop all but the ``keep`` newest complete ones of this run by (epoch, step). Another
    run's checkpoints are never removed: a directory that held a later epoch of another run,
    sorted by name, once lost each new checkpoint just after it was written."""
    d = epoch_dir(root, epoch, step_of(meta))
    missing = [n for n in meta.get("sha256", {}) if not (d / n).exists()]
    if missing:
        raise CheckpointError(f"{d}: checkpoint files {missing} are missing")
    body = json.dumps({"epoch": epoch, "format": FORMAT, **meta}, indent=1)
    try:
        ownfiles.replace_own(d / COMPLETE, body, ours=lambda _: False, tmp=COMPLETE + ".tmp")
    except CheckpointError as e:
        _discard_epoch(d)  # a checkpoint that cannot be completed is not left half-made
        raise CheckpointError(f"{d}: cannot complete the checkpoint ({e})") from None
    run = meta.get("run")
    if not run:
        return
    mine = sorted((position(m), p) for p, m in _completes(root) if m.get("run") == run)
    for _, old in mine[:-keep]:
        try:  # what holds anything but DCP's and plexgt's files is left as it is
            _remove_epoch(old, _epoch_files(old) or [])
        except CheckpointError:
            continue


def _completes(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(directory, COMPLETE) of every epoch directory whose COMPLETE reads as one."""
    out = []
    for d in sorted(root.glob("epoch_*")):
        meta = _complete_of(d)
        if meta is not None:
            out.append((d, meta))
    return out


def check_fresh(root: Path) -> None:
    """Rank 0 of a run not resumed: refuse a directory that holds complete checkpoints (of
    another run), whose newest ``--resume`` would then continue."""
    found = latest_complete(root)
    if found is not None:
        raise CheckpointError(f"{root}: holds another run's complete checkpoints (the newest "
                              f"{epoch_dir(root, found[0]).name}); pass --resume to continue "
                              "it or use another --checkpoint-dir")


def latest_complete(root: Path) -> tuple[int, dict[str, Any]] | None:
    """(epoch, meta) of the newest complete checkpoint under ``root`` by (epoch, step)
    (:func:`position`; ``step_of(meta)`` says where in the epoch), or None. A COMPLETE must
    name its own directory: one copied under another name would resume another position."""
    best: tuple[tuple[int, int], dict[str, Any]] | None = None
    for d in sorted(root.glob("epoch_*")):
        if d.is_symlink():
            raise ownfiles.symlink_error(d)
        f = d / COMPLETE
        if os.path.lexists(f):
            try:
                meta = json.loads(ownfiles.read_text(f))
                at = position(meta)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise CheckpointError(f"{f}: corrupt checkpoint marker ({e}); remove {d} to "
                                      "resume from the one before") from None
            if epoch_dir(root, *at) != d:
                raise CheckpointError(f"{f}: records epoch {at[0]}"
                                      f"{f' step {at[1]}' if at[1] else ''}, not its "
                                      f"directory's; remove {d} to resume from the one before")
            if best is None or at > best[0]:
                best = (at, meta)
    return None if best is None else (best[0][0], best[1])


def _first_difference(old: dict[str, Any], new: dict[str, Any], prefix: str = ""
                      ) -> tuple[str, Any, Any] | None:
    """The first dotted key whose value differs between two configuration trees."""
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            d = _first_difference(a, b, f"{prefix}{k}.")
            if d is not None:
                return d
        elif a != b:
            return f"{prefix}{k}", a, b
    return None
