"""Checkpoints: one shard per rank, written atomically; a checkpoint counts once complete.

Layout: ``DIR/epoch_000042/rank_00003.pt`` for each rank, then ``DIR/epoch_000042/COMPLETE``
(JSON: epoch, world size, grid, config hash), written by rank 0 after every rank has renamed
its shard into place. A crash mid-write leaves a directory without COMPLETE, which
:func:`latest_complete` skips, so ``--resume`` always starts from a checkpoint that loads.
Shards hold only tensors, numbers and strings and are read with ``weights_only=True``.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import torch

from plexgt.errors import CheckpointError

COMPLETE = "COMPLETE"
STOPPED = "STOPPED"
LOCK = "LOCK"



def epoch_dir(root: Path, epoch: int) -> Path:
    return root / f"epoch_{epoch:06d}"


def shard_path(root: Path, epoch: int, rank: int) -> Path:
    return epoch_dir(root, epoch) / f"rank_{rank:05d}.pt"


def write_shard(root: Path, epoch: int, rank: int, state: dict[str, Any]) -> str:
    """Write this rank's shard under a temporary name, fsync, then rename into place; returns
    its sha256, which rank 0 records in COMPLETE so that a damaged shard is refused on load
    rather than trained on."""
    path = shard_path(root, epoch, rank)
    tmp = path.with_suffix(".pt.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        raise CheckpointError(f"{e.filename or path}: cannot write the checkpoint "
                              f"({e.strerror or e})") from None
    return hashlib.sha256(data).hexdigest()


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
    """Rank 0, after a barrier: declare ``epoch`` complete and drop all but ``keep`` newest."""
    d = epoch_dir(root, epoch)
    missing = [r for r in range(meta["world_size"]) if not shard_path(root, epoch, r).exists()]
    if missing:
        raise CheckpointError(f"{d}: shards of ranks {missing} are missing")
    tmp = d / (COMPLETE + ".tmp")
    try:
        tmp.write_text(json.dumps({"epoch": epoch, **meta}, indent=1))
        os.replace(tmp, d / COMPLETE)
    except OSError as e:
        _discard(tmp)
        raise CheckpointError(f"{d}: cannot complete the checkpoint ({e.strerror or e})"
                              ) from None
    done = sorted(p for p in root.glob("epoch_*") if (p / COMPLETE).exists())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


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


def load_shard(root: Path, epoch: int, rank: int, meta: dict[str, Any],
               expect: dict[str, Any]) -> dict[str, Any]:
    """Load this rank's shard after checking the run matches what wrote it.

    ``expect`` holds world_size, grid, strategy and config_hash of this run; a mismatch is
    refused with an error naming both sides (re-sharding to another grid is not supported).
    """
    for k in ("world_size", "grid", "strategy", "config_hash"):
        if meta.get(k) != expect.get(k):
            if k == "config_hash" and "config" in meta and "config" in expect:
                diff = _first_difference(meta["config"], expect["config"])
                if diff is not None:
                    key, old, new = diff
                    raise CheckpointError(
                        f"{epoch_dir(root, epoch)}: written with {key}={old!r}, this run has "
                        f"{key}={new!r}; resume with the same {key}")
            raise CheckpointError(
                f"{epoch_dir(root, epoch)}: written with {k}={meta.get(k)!r}, this run has "
                f"{k}={expect.get(k)!r}; resume with the same {k} (re-sharding a checkpoint "
                "to another grid or configuration is not supported)"
            )
    path = shard_path(root, epoch, rank)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint shard missing") from None
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable checkpoint shard ({e.strerror})") from None
    sums = meta.get("sha256")
    if sums is not None and hashlib.sha256(data).hexdigest() != sums[rank]:
        raise CheckpointError(f"{path}: checkpoint shard is damaged (sha256 differs from the "
                              f"one recorded in {epoch_dir(root, epoch) / COMPLETE})")
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a corrupt shard
        raise CheckpointError(f"{path}: unreadable checkpoint shard ({e})") from None


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
