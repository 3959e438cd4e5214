"""Checkpoints: the run's state in the single-process model's form, written with
torch.distributed.checkpoint (DCP); a checkpoint counts once complete.

Layout: ``DIR/epoch_000042/`` holds DCP's files (``.metadata``, ``__<rank>_0.distcp``), then
``COMPLETE`` (JSON: epoch, the layout that wrote it, config hash, step, best-so-far and the
sha256 of every file), written by rank 0 after every rank has hashed the files it was given.
A crash mid-write leaves a directory without COMPLETE, which :func:`latest_complete` skips, so
``--resume`` always starts from a checkpoint that loads; the newest two complete ones are kept.

The state is *canonical*: parameters and AdamW moments under the single-process model's names
and shapes (a 3D GCN's blocks reassembled, a row-parallel model's replicated copy), so any
world size, grid or strategy resumes it, each rank slicing what it holds. DCP writes each
replicated tensor once (its planner deals the keys out over the ranks) and reads them into
the resuming run's tensors; the whole state of a gcn, gt or gps is parameters and moments of
at most a few million entries, so reassembling it costs a small all-reduce per checkpoint.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import shutil
import socket
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from plexgt.errors import CheckpointError
from plexgt.training import dcp_safe

COMPLETE = "COMPLETE"
STOPPED = "STOPPED"
LOCK = "LOCK"
FORMAT = 2
"""COMPLETE's ``format``: 2 = canonical DCP state (1 was one torch.save shard per rank)."""


def epoch_dir(root: Path, epoch: int) -> Path:
    return root / f"epoch_{epoch:06d}"


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


def write_state(root: Path, epoch: int, state: dict[str, Any]) -> dict[str, str]:
    """Write ``state`` (every rank the same keys and shapes; collective) under
    ``epoch_dir(root, epoch)``; returns {file name: sha256} of the files this rank hashed
    (file i of the sorted listing goes to rank i mod P)."""
    d = epoch_dir(root, epoch)
    try:
        d.mkdir(parents=True, exist_ok=True)
        dcp.save(state, checkpoint_id=str(d))
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP wraps every rank's
        raise CheckpointError(f"{d}: cannot write the checkpoint ({_why(e)})") from None
    _barrier()
    return _hash_mine(d)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def clear_epoch(root: Path, epoch: int) -> None:
    """Rank 0, before a write: remove what a killed run (or an earlier run into this directory)
    left under this epoch, so that no COMPLETE ever covers a mix of two writes."""
    d = epoch_dir(root, epoch)
    try:
        if d.exists():
            shutil.rmtree(d)
    except OSError as e:
        raise CheckpointError(f"{e.filename or d}: cannot replace the old checkpoint "
                              f"({e.strerror or e})") from None


def _hash_mine(d: Path) -> dict[str, str]:
    rank, world = _world()
    names = sorted(p.name for p in d.iterdir() if p.is_file() and p.name != COMPLETE)
    return {n: _sha256(d / n) for i, n in enumerate(names) if i % world == rank}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def verify_files(root: Path, epoch: int, meta: dict[str, Any]) -> None:
    """Check this rank's share of the checkpoint's files (file i of COMPLETE's list goes to
    rank i mod P) against the sha256 recorded in COMPLETE: a damaged or missing file is
    refused rather than trained on."""
    d = epoch_dir(root, epoch)
    sums = meta.get("sha256")
    if not isinstance(sums, dict) or not sums:
        raise CheckpointError(f"{d / COMPLETE}: no file checksums (format {meta.get('format')}; "
                              f"this plexgt reads format {FORMAT})")
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
            raise CheckpointError(f"{path}: unreadable checkpoint file ({e.strerror})") from None
        if got != sums[name]:
            raise CheckpointError(f"{path}: checkpoint file is damaged (sha256 differs from "
                                  f"the one recorded in {d / COMPLETE})")


def read_state(root: Path, epoch: int, template: dict[str, Any]) -> dict[str, Any]:
    """Read a checkpoint into ``template`` (this run's tensors of the canonical shapes;
    collective) and return it."""
    d = epoch_dir(root, epoch)
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
    """Refuse a checkpoint whose computation differs from this run's, naming the first key
    that differs. The layout (world size, grid, strategy) may differ: the state is canonical."""
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{epoch_dir(root, epoch) / COMPLETE}: checkpoint format "
                              f"{meta.get('format', 1)}, this plexgt reads format {FORMAT}")
    if expect.get("node_order") and meta.get("node_order") != expect["node_order"]:
        raise CheckpointError(f"{epoch_dir(root, epoch)}: its node embedding's rows follow "
                              "another prepared directory's node order; resume on the "
                              "directory it was trained on")
    if meta.get("config_hash") == expect.get("config_hash"):
        return
    if "config" in meta and "config" in expect:
        diff = _first_difference(meta["config"], expect["config"])
        if diff is not None:
            key, old, new = diff
            raise CheckpointError(f"{epoch_dir(root, epoch)}: written with {key}={old!r}, this "
                                  f"run has {key}={new!r}; resume with the same {key}")
    raise CheckpointError(f"{epoch_dir(root, epoch)}: written by another configuration "
                          f"(hash {meta.get('config_hash')!r}, this run "
                          f"{expect.get('config_hash')!r})")


def _discard(path: Path) -> None:
    """Remove a temporary file if it is there (no error if it, or its folder, is not)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def lock(root: Path) -> Any:
    """Hold ``root/LOCK`` for the life of the returned file: a second job given the same
    checkpoint directory is refused instead of overwriting the first one's checkpoints."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        f = open(root / LOCK, "a+")  # noqa: SIM115 - held open until the run ends
    except OSError as e:
        raise CheckpointError(f"{e.filename or root}: cannot use the checkpoint directory "
                              f"({e.strerror or e})") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another job"
        f.close()
        raise CheckpointError(f"{root}: in use by {holder}; give each job its own "
                              "--checkpoint-dir") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    return f


def mark_complete(root: Path, epoch: int, meta: dict[str, Any], keep: int = 2) -> None:
    """Rank 0, once every rank's files are written and hashed: declare ``epoch`` complete
    (``meta`` holds the checksums and the run's id) and drop all but the ``keep`` newest
    complete ones of this run. Another run's checkpoints are never removed: a directory that
    held a later epoch of another run, sorted by name, once lost each new checkpoint just
    after it was written."""
    d = epoch_dir(root, epoch)
    missing = [n for n in meta.get("sha256", {}) if not (d / n).exists()]
    if missing:
        raise CheckpointError(f"{d}: checkpoint files {missing} are missing")
    tmp = d / (COMPLETE + ".tmp")
    try:
        tmp.write_text(json.dumps({"epoch": epoch, "format": FORMAT, **meta}, indent=1))
        os.replace(tmp, d / COMPLETE)
    except OSError as e:
        _discard(tmp)
        raise CheckpointError(f"{d}: cannot complete the checkpoint ({e.strerror or e})"
                              ) from None
    run = meta.get("run")
    if not run:
        return
    mine = sorted((int(m["epoch"]), p) for p, m in _completes(root) if m.get("run") == run)
    for _, old in mine[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _completes(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(directory, COMPLETE) of every epoch directory whose COMPLETE reads as one."""
    out = []
    for d in sorted(root.glob("epoch_*")):
        try:
            meta = json.loads((d / COMPLETE).read_text())
            int(meta["epoch"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
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
    """(epoch, meta) of the newest complete checkpoint under ``root``, or None."""
    best = None
    for d in sorted(root.glob("epoch_*")):
        f = d / COMPLETE
        if f.exists():
            try:
                meta = json.loads(f.read_text())
                best = (int(meta["epoch"]), meta)
            except (ValueError, KeyError, TypeError, OSError) as e:
                raise CheckpointError(f"{f}: corrupt checkpoint marker ({e}); remove {d} to "
                                      "resume from the one before") from None
    return best


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
