"""Checkpoint files on their own: checksums, a corrupt marker, the directory lock, the key a
configuration mismatch names, and the metrics a resumed run cuts back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from plexgt.config import load_config
from plexgt.errors import CheckpointError, ConfigError
from plexgt.training import checkpoint as ckpt
from plexgt.training.loop import open_metrics


def _write(root: Path, epoch: int = 3, meta: dict | None = None) -> dict:
    sha = ckpt.write_shard(root, epoch, 0, {"w": torch.arange(10.0)})
    meta = {"world_size": 1, "grid": "1x1x1", "strategy": "plexus3d", "config_hash": "h",
            **(meta or {}), "sha256": [sha]}
    ckpt.mark_complete(root, epoch, meta)
    return meta


def test_a_damaged_shard_is_refused_not_trained_on(tmp_path):
    meta = _write(tmp_path)
    expect = {k: meta[k] for k in ("world_size", "grid", "strategy", "config_hash")}
    assert torch.equal(ckpt.load_shard(tmp_path, 3, 0, meta, expect)["w"], torch.arange(10.0))
    path = ckpt.shard_path(tmp_path, 3, 0)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="rank_00000.pt: checkpoint shard is damaged"):
        ckpt.load_shard(tmp_path, 3, 0, meta, expect)


def test_a_corrupt_complete_marker_is_a_one_line_error(tmp_path):
    _write(tmp_path)
    (ckpt.epoch_dir(tmp_path, 3) / ckpt.COMPLETE).write_text("{not json")
    with pytest.raises(CheckpointError, match="COMPLETE: corrupt checkpoint marker"):
        ckpt.latest_complete(tmp_path)


def test_a_configuration_mismatch_names_the_key(tmp_path):
    a = load_config(None, None, ["--model.hidden=16"])
    b = load_config(None, None, ["--model.hidden=32", "--epochs=500"])
    assert a.hash() != b.hash()
    assert a.hash() == load_config(None, None, ["--model.hidden=16", "--epochs=9"]).hash()
    meta = _write(tmp_path, meta={"config_hash": a.hash(), "config": a.computation()})
    expect = {**meta, "config_hash": b.hash(), "config": b.computation()}
    with pytest.raises(CheckpointError, match="written with model.hidden=16, this run has "
                                              "model.hidden=32"):
        ckpt.load_shard(tmp_path, 3, 0, meta, expect)


def test_two_jobs_cannot_share_a_checkpoint_directory(tmp_path):
    held = ckpt.lock(tmp_path)
    try:
        with pytest.raises(CheckpointError, match="in use by pid"):
            ckpt.lock(tmp_path)
    finally:
        held.close()
    ckpt.lock(tmp_path).close()  # free again once the first job has ended


def test_an_unwritable_checkpoint_directory_is_a_one_line_error(tmp_path):
    """A directory that cannot be written (here a file in its place, which fails for root as
    well as for a user; a read-only directory behaves alike) is a CheckpointError naming it."""
    (tmp_path / "taken").write_text("a file, not a directory")
    with pytest.raises(CheckpointError, match="taken.*cannot write the checkpoint"):
        ckpt.write_shard(tmp_path / "taken", 1, 0, {"w": torch.zeros(1)})
    with pytest.raises(CheckpointError, match="taken.*cannot use the checkpoint directory"):
        ckpt.lock(tmp_path / "taken")


def test_resumed_metrics_drop_the_epochs_past_the_checkpoint(tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_text("".join(json.dumps({"epoch": e, "loss": 1.0 / e}) + "\n" for e in range(1, 8))
                 + '{"epoch": 8, "lo')  # the killed run's last line, cut short
    cfg = load_config(None, None, [f"--metrics={m}", "--resume=true", "--checkpoint_dir=x"])
    with open_metrics(cfg, 5) as f:
        f.write(json.dumps({"epoch": 6, "loss": 0.5}) + "\n")
    assert [json.loads(l)["epoch"] for l in m.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(ConfigError, match="config key 'metrics'"):
        open_metrics(load_config(None, None, [f"--metrics={tmp_path}"]), 0)
