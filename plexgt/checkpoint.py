"""Checkpoints: one shard per rank, written atomically; a checkpoint counts once complete.

Layout: ``DIR/epoch_000042/rank_00003.pt`` for each rank, then ``DIR/epoch_000042/COMPLETE``
(JSON: epoch, world size, grid, config hash), written by rank 0 after every rank has renamed
its shard into place. A crash mid-write leaves a directory without COMPLETE, which
:func:`latest_complete` skips, so ``--resume`` always starts from a checkpoint that loads.
Shards hold only tensors, numbers and strings and are read with ``weights_only=True``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from plexgt.data.graph import DataError

COMPLETE = "COMPLETE"
STOPPED = "STOPPED"


class CheckpointError(DataError):
    """A checkpoint that is missing, incomplete, or written by an incompatible run."""


def epoch_dir(root: Path, epoch: int) -> Path:
    return root / f"epoch_{epoch:06d}"


def shard_path(root: Path, epoch: int, rank: int) -> Path:
    return epoch_dir(root, epoch) / f"rank_{rank:05d}.pt"


def write_shard(root: Path, epoch: int, rank: int, state: dict[str, Any]) -> None:
    """Write this rank's shard under a temporary name, fsync, then rename into place."""
    path = shard_path(root, epoch, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".pt.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def mark_complete(root: Path, epoch: int, meta: dict[str, Any], keep: int = 2) -> None:
    """Rank 0, after a barrier: declare ``epoch`` complete and drop all but ``keep`` newest."""
    d = epoch_dir(root, epoch)
    missing = [r for r in range(meta["world_size"]) if not shard_path(root, epoch, r).exists()]
    if missing:
        raise CheckpointError(f"{d}: shards of ranks {missing} are missing")
    tmp = d / (COMPLETE + ".tmp")
    tmp.write_text(json.dumps({"epoch": epoch, **meta}, indent=1))
    os.replace(tmp, d / COMPLETE)
    done = sorted(p for p in root.glob("epoch_*") if (p / COMPLETE).exists())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_complete(root: Path) -> tuple[int, dict[str, Any]] | None:
    """(epoch, meta) of the newest complete checkpoint under ``root``, or None."""
    best = None
    for d in sorted(root.glob("epoch_*")):
        f = d / COMPLETE
        if f.exists():
            meta = json.loads(f.read_text())
            best = (int(meta["epoch"]), meta)
    return best


def load_shard(root: Path, epoch: int, rank: int, meta: dict[str, Any],
               expect: dict[str, Any]) -> dict[str, Any]:
    """Load this rank's shard after checking the run matches what wrote it.

    ``expect`` holds world_size, grid, strategy and config_hash of this run; a mismatch is
    refused with an error naming both sides (re-sharding to another grid is not supported).
    """
    for k in ("world_size", "grid", "strategy", "config_hash"):
        if meta.get(k) != expect.get(k):
            raise CheckpointError(
                f"{epoch_dir(root, epoch)}: written with {k}={meta.get(k)!r}, this run has "
                f"{k}={expect.get(k)!r}; resume with the same {k} (re-sharding a checkpoint "
                "to another grid or configuration is not supported)"
            )
    path = shard_path(root, epoch, rank)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint shard missing") from None
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a corrupt shard
        raise CheckpointError(f"{path}: unreadable checkpoint shard ({e})") from None
