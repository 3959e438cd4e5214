"""hgt (an epoch of several optimizer steps) stopped between two steps by SIGUSR1, or left
at a periodic mid-epoch checkpoint, resumes at that step: the same metrics rows (each
epoch's loss included) and bit-identical final parameters as the uninterrupted run (one
in-process rank, float64, dropout on; the multi-rank case is tests/mpi/test_hgt_resume.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from plexgt.commands.train import final_line
from plexgt.distributed.bootstrap import DistContext
from plexgt.distributed.collectives import CommLedger
from plexgt.plan.knobs import load_config
from plexgt.tasks import build_task
from plexgt.training import checkpoint as ckpt
from plexgt.training import loop
from tests.datagen import prepared_sbm
from tests.signals import signal_during_step

pytestmark = [pytest.mark.timeout(300), pytest.mark.filterwarnings("ignore::UserWarning")]

KEYS = {"model.name": "hgt", "model.hidden": 8, "model.heads": 2, "model.layers": 2,
        "model.node_embedding": 3, "model.dropout": 0.2, "batch.targets": 8,
        "batch.size": 16, "batch.sequences": 2, "batch.global_nodes": 1,
        "parallel.dp": "1", "parallel.pp": "1", "parallel.cp": "1", "parallel.stages": "2",
        "parallel.micro_batches": 1, "dtype": "float64", "deterministic": True,
        "progress": False, "epochs": 3, "optim.warmup_epochs": 1}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepared_sbm(tmp_path_factory.mktemp("midepoch") / "prep", 120, 900,
                        num_features=6, num_classes=3, seed=4)



def _run(prepared, tmp, kill_at=None, logs=None, **keys):
    """(task, summary) of ``plexgt train`` on one rank; ``kill_at`` = (epoch, step): SIGUSR1
    to this process during that step (the signal's real path: StopFlag's handler)."""
    cfg = load_config(None, {"data": str(prepared), "metrics": str(tmp / "m.jsonl"),
                             **KEYS, **keys})
    ctx = DistContext(0, 1, 0, 1, "gloo", torch.device("cpu"), "single")
    task = build_task(cfg, ctx, CommLedger())
    if kill_at is not None:
        signal_during_step(task, kill_at)
    out = [] if logs is None else logs
    return task, loop.train(cfg, ctx, task, log=out.append)


def _rows(tmp):
    rows = [json.loads(line) for line in (tmp / "m.jsonl").read_text().splitlines()]
    keep = ("epoch", "loss", "lr", "train_acc", "valid_acc", "test_acc")
    return [{k: r[k] for k in keep} for r in rows]


def _params(task):
    return {n: p.detach().clone() for n, p in task.model.named_parameters()}


@pytest.fixture(scope="module")
def uninterrupted(prepared, world, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("whole")
    task, summary = _run(prepared, tmp)
    assert summary["stopped"] == "" and task.steps(0) >= 4  # several steps an epoch
    return _rows(tmp), _params(task), task.steps(0)


def _same(tmp, task, uninterrupted):
    rows, params, _ = uninterrupted
    assert _rows(tmp) == rows  # exactly: the losses' float64 sums in the same order
    got = _params(task)
    assert got.keys() == params.keys()
    for n, p in params.items():
        assert torch.equal(got[n], p), n


def test_sigusr1_mid_epoch_checkpoints_the_step_and_resume_is_the_uninterrupted_run(
        prepared, world, tmp_path, uninterrupted):
    """SIGUSR1 during step 2 of epoch 2 (0-based (1, 2)): the ranks stop after that step
    (before, the run went on to the epoch's end) with epoch_000001_step_000003 and STOPPED;
    no row for the unfinished epoch; --resume finishes the run equal to the uninterrupted
    one to the bit."""
    ck = tmp_path / "ck"
    logs: list[str] = []
    task, summary = _run(prepared, tmp_path, kill_at=(1, 2), logs=logs,
                         checkpoint_dir=str(ck))
    n = uninterrupted[2]
    where = ck / "epoch_000001_step_000003"
    assert summary["stopped"] == "signal 10" and summary["last_epoch"] == 1
    assert summary["last_step"] == 3 and summary["checkpoint"] == str(where)
    assert (f"plexgt train: stopped by signal 10 after step 3 of {n} of epoch 2; checkpoint "
            f"{where} written; continue with --resume") in logs
    assert final_line(summary).startswith("plexgt train: stopped by signal 10 after step 3 "
                                          "of epoch 2; ")
    assert final_line(summary).endswith(f"; checkpoint {where} written")
    assert (ck / ckpt.STOPPED).read_text() == "1 3\n"
    meta = json.loads((where / ckpt.COMPLETE).read_text())
    assert (meta["epoch"], meta["epoch_step"]) == (1, 3)
    assert meta["step"] == n + 3  # the dropout keys' step counter
    assert [r["epoch"] for r in _rows(tmp_path)] == [1]
    assert ckpt.latest_complete(ck)[0] == 1
    logs.clear()
    task, summary = _run(prepared, tmp_path, logs=logs, checkpoint_dir=str(ck), resume=True)
    assert f"plexgt train: resumed from {where} (epoch 1, step 3 of epoch 2)" in logs
    assert summary["stopped"] == "" and summary["last_epoch"] == 3
    assert not (ck / ckpt.STOPPED).exists()
    _same(tmp_path, task, uninterrupted)


def test_periodic_mid_epoch_checkpoints_order_prune_and_resume(prepared, world, tmp_path,
                                                                uninterrupted):
    """checkpoint_every_steps=2: the two newest by (epoch, step) are kept, the epoch's end
    (epoch_000003) newest of all; with its COMPLETE gone (a write cut short), --resume takes
    the mid-epoch one before it and ends equal to the uninterrupted run."""
    ck = tmp_path / "ck"
    n = uninterrupted[2]
    _run(prepared, tmp_path, checkpoint_dir=str(ck), checkpoint_every_steps=2)
    last_mid = (n - 1) // 2 * 2  # the last multiple of 2 before the epoch's end
    mid = ck / f"epoch_000002_step_{last_mid:06d}"
    assert sorted(p.name for p in ck.glob("epoch_*")) == [mid.name, "epoch_000003"]
    assert ckpt.latest_complete(ck)[0] == 3
    (ck / "epoch_000003" / ckpt.COMPLETE).unlink()
    shutil.rmtree(ck / "epoch_000003")
    epoch, meta = ckpt.latest_complete(ck)
    assert (epoch, ckpt.step_of(meta)) == (2, last_mid)
    task, summary = _run(prepared, tmp_path, checkpoint_dir=str(ck), resume=True,
                         checkpoint_every_steps=2)
    assert summary["last_epoch"] == 3
    _same(tmp_path, task, uninterrupted)


def test_the_config_hash_leaves_checkpoint_every_steps_out(prepared):
    """A periodic mid-epoch checkpoint changes nothing computed: a run may resume with
    another period (and the full-graph models' hashes stay what they were)."""
    a = load_config(None, {"data": str(prepared), **KEYS})
    b = load_config(None, {"data": str(prepared), **KEYS, "checkpoint_every_steps": 7})
    assert a.hash() == b.hash()
    assert "checkpoint_every_steps" not in json.dumps(a.computation())
