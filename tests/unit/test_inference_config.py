"""predict's and evaluate's view of a checkpoint, in one process: which checkpoint a path
names, and the configuration rebuilt from it with this job's layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from plexgt.config import TrainConfig
from plexgt.errors import CheckpointError, ConfigError, UsageError
from plexgt.parallel.inference import drop_backward
from plexgt.tasks.task import Task
from plexgt.training.inference import checkpoint_config, find_checkpoint, resolve_embeddings


def _complete(root: Path, epoch: int, config: dict) -> Path:
    d = root / f"epoch_{epoch:06d}"
    d.mkdir(parents=True)
    (d / "COMPLETE").write_text(json.dumps({"epoch": epoch, "format": 2, "config": config}))
    return d


def _computation(**model: object) -> dict:
    d = TrainConfig().computation()
    d["model"].update(model)
    return d


def test_a_path_names_the_newest_complete_checkpoint_or_one_epoch(tmp_path):
    _complete(tmp_path, 3, _computation())
    five = _complete(tmp_path, 5, _computation())
    (tmp_path / "epoch_000007").mkdir()  # being written: no COMPLETE
    assert find_checkpoint(tmp_path).epoch == 5
    cp = find_checkpoint(tmp_path / "epoch_000003")
    assert (cp.root, cp.epoch, cp.dir) == (tmp_path, 3, tmp_path / "epoch_000003")
    assert find_checkpoint(five).dir == five
    with pytest.raises(CheckpointError, match="nope: no such checkpoint directory"):
        find_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="epoch_000007: holds no complete checkpoint"):
        find_checkpoint(tmp_path / "epoch_000007")


def test_the_model_is_the_checkpoints_and_the_layout_this_jobs(tmp_path):
    cp = find_checkpoint(_complete(tmp_path, 1, _computation(name="gt", hidden=32, heads=2)))
    cfg = checkpoint_config(cp, "data", "auto", "gp_ring", ["--parallel.block_rows=64"])
    assert (cfg.model.name, cfg.model.hidden, cfg.model.heads) == ("gt", 32, 2)
    assert (cfg.data, cfg.parallel.strategy, cfg.parallel.block_rows) == ("data", "gp_ring", 64)
    assert cfg.hash() == TrainConfig(model=cfg.model).hash()  # the computation is the same
    with pytest.raises(UsageError, match="--model.hidden=8: the model and its numerics come "
                                         r"from the checkpoint; only parallel\.\* keys"):
        checkpoint_config(cp, "data", None, None, ["--model.hidden=8"])


def test_this_jobs_bad_keys_are_named_as_such_and_the_checkpoints_as_its(tmp_path):
    """An unknown or bad parallel key of the command line is named as the job's (it was
    once blamed on the checkpoint); a key the checkpoint records and this plexgt does not
    know is the checkpoint's."""
    cp = find_checkpoint(_complete(tmp_path, 1, _computation()))
    with pytest.raises(ConfigError, match=r"^unknown config key 'parallel\.foo'"):
        checkpoint_config(cp, "data", None, None, ["--parallel.foo=1"])
    with pytest.raises(ConfigError, match=r"^config key 'parallel\.grid': grid 'abc'"):
        checkpoint_config(cp, "data", "abc", None)
    cp = find_checkpoint(_complete(tmp_path / "new", 1, _computation(attention_kind="linear")))
    with pytest.raises(CheckpointError, match=r"epoch_000001: its configuration does not "
                                              r"load in plexgt .*'model\.attention_kind'"):
        checkpoint_config(cp, "data", None, None)


def test_a_model_without_an_inference_path_is_one_line_for_predict_and_runs_for_evaluate():
    """A family predict cannot place the outputs of (a model other branches may add) is a
    ConfigError naming it, not a traceback; evaluate's forward (drop_backward) leaves it be."""
    model = torch.nn.Linear(2, 2)
    drop_backward(model)
    task = Task(model=model, inputs=torch.zeros(1, 2), loss=None, correct=None, ledger=None,
                grid="rows1", strategy="mlp")
    with pytest.raises(ConfigError, match="plexgt does not know where a Linear's outputs live "
                                          r"\(layout rows1 mlp\)"):
        resolve_embeddings(task, None)
