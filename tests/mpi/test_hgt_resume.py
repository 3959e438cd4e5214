"""``plexgt train --model hgt`` stopped between two optimizer steps on a dp x pp x cp mesh,
then resumed: on the same mesh the uninterrupted run's rows and canonical parameters to the
bit (float64, dropout on, deterministic); on another mesh its rows and parameters within the
layouts' rounding (test_hgt_dist.TRAINED's reason).

SIGUSR1 reaches rank 0 only (during step 1 of epoch 2): every rank must stop after that
step, which they agree on over the world. The loop runs in-process on every rank, its mesh
groups the session's (conftest.mesh_groups: groups made later could hang gloo).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from mpi4py import MPI

import plexgt.tasks.batch as batch_task
from plexgt.data.synthetic import sbm
from plexgt.distributed.collectives import CommLedger
from plexgt.distributed.mesh import Mesh, factorizations
from plexgt.plan.knobs import load_config
from plexgt.tasks import build_task
from plexgt.training import checkpoint as ckpt
from plexgt.training import loop
from tests.signals import signal_during_step

from .conftest import RANK, WORLD, prepare_on_rank0

pytestmark = [pytest.mark.timeout(600), pytest.mark.filterwarnings("ignore::UserWarning")]

LAYERS = 3
STAGES = {1: "3", 2: "1,2", 3: "1,1,1"}
KEYS = {"model.name": "hgt", "model.hidden": 8, "model.heads": 2, "model.layers": LAYERS,
        "model.node_embedding": 3, "model.dropout": 0.2, "model.input_dropout": 0.1,
        "batch.targets": 2, "batch.size": 12, "batch.sequences": 12,
        "batch.global_nodes": 1, "dtype": "float64", "deterministic": True,
        "progress": False, "epochs": 3, "optim.warmup_epochs": 1, "optim.clip_norm": 1.0}
ROW_KEYS = ("epoch", "loss", "lr", "train_acc", "valid_acc", "test_acc")
TRAINED = {"rtol": 1e-8, "atol": 1e-10}


def _meshes() -> tuple[Mesh, Mesh]:
    """(the stopped run's mesh: the most axes split, pp before cp; another for a resume)."""
    ok = [m for m in factorizations(WORLD) if m.pp <= LAYERS and 12 % m.cp == 0
          and 12 % m.dp == 0]
    ok.sort(key=lambda m: (-sum(x > 1 for x in m.shape), -m.pp, -m.cp))
    other = next((m for m in ok if m.dp == WORLD and m != ok[0]), ok[-1])
    return ok[0], other


@pytest.fixture(scope="module")
def graph(tmp_path_factory, dist_ctx):
    return prepare_on_rank0(tmp_path_factory, "hgt_resume", lambda: sbm(
        144, 900, num_classes=3, num_features=5, seed=3, centroid_scale=1.0)).path


@pytest.fixture(scope="module")
def shared(tmp_path_factory, dist_ctx) -> Path:
    """A directory every rank sees (rank 0's)."""
    path = tmp_path_factory.mktemp("shared") if RANK == 0 else None
    return Path(MPI.COMM_WORLD.bcast(path))


def _run(graph, dist_ctx, mesh_groups, monkeypatch, mesh, metrics, kill_at=None, logs=None,
         **keys):
    """(task, summary) of ``plexgt train`` on ``mesh``; ``kill_at`` = (epoch, step): rank 0
    alone gets SIGUSR1 during that step."""
    monkeypatch.setattr(batch_task, "build_mesh_groups",
                        lambda m, rank, world, timeout=None: mesh_groups(m))
    cfg = load_config(None, {"data": str(graph), "metrics": str(metrics), **KEYS,
                             "parallel.dp": str(mesh.dp), "parallel.pp": str(mesh.pp),
                             "parallel.cp": str(mesh.cp), "parallel.stages": STAGES[mesh.pp],
                             "parallel.micro_batches": 2 if 12 // mesh.dp % 2 == 0 else 1,
                             **keys})
    task = build_task(cfg, dist_ctx, CommLedger())
    assert task.grid == str(mesh)
    if kill_at is not None and RANK == 0:
        signal_during_step(task, kill_at)
    out = [] if logs is None else logs
    return task, loop.train(cfg, dist_ctx, task, log=out.append)


def _rows(metrics: Path) -> list[dict]:
    """The metrics rows' computed values (rank 0 writes the file; every rank reads it)."""
    MPI.COMM_WORLD.Barrier()
    return [{k: r[k] for k in ROW_KEYS} for r in map(json.loads,
                                                     metrics.read_text().splitlines())]


def _params(task) -> dict[str, torch.Tensor]:
    """The canonical parameters (collective)."""
    return task.model.to_canonical(dict(task.model.named_parameters()))


def test_a_mid_epoch_stop_on_a_mesh_resumes_to_the_uninterrupted_run(
        graph, shared, dist_ctx, mesh_groups, monkeypatch):
    mesh, other = _meshes()
    whole_m = shared / "whole.jsonl"
    task, summary = _run(graph, dist_ctx, mesh_groups, monkeypatch, mesh, whole_m)
    steps = task.steps(0)
    assert steps >= 3 and summary["stopped"] == ""
    want_rows, want = _rows(whole_m), _params(task)

    ck, m = shared / "ck", shared / "m.jsonl"
    logs: list[str] = []
    _, summary = _run(graph, dist_ctx, mesh_groups, monkeypatch, mesh, m, kill_at=(1, 1),
                      logs=logs, checkpoint_dir=str(ck))
    where = ck / "epoch_000001_step_000002"
    assert (summary["stopped"], summary["last_epoch"], summary["last_step"]) == (
        "signal 10", 1, 2)  # on every rank: rank 0's signal, agreed after step 1
    assert summary["checkpoint"] == str(where)
    if RANK == 0:
        assert (f"plexgt train: stopped by signal 10 after step 2 of {steps} of epoch 2; "
                f"checkpoint {where} written; continue with --resume") in logs
        assert (ck / ckpt.STOPPED).read_text() == "1 2\n"
        shutil.copytree(ck, shared / "ck2")
        shutil.copy(m, shared / "m2.jsonl")
    assert [r["epoch"] for r in _rows(m)] == [1]

    logs.clear()
    task, summary = _run(graph, dist_ctx, mesh_groups, monkeypatch, mesh, m, logs=logs,
                         checkpoint_dir=str(ck), resume=True)
    assert summary["stopped"] == "" and summary["last_epoch"] == 3
    if RANK == 0:
        assert f"plexgt train: resumed from {where} (epoch 1, step 2 of epoch 2)" in logs
    assert _rows(m) == want_rows  # exactly, the resumed epoch's loss included
    got = _params(task)
    for n, p in want.items():
        assert torch.equal(got[n], p), n

    if other == mesh:
        return  # one rank: no other mesh
    logs.clear()
    task, summary = _run(graph, dist_ctx, mesh_groups, monkeypatch, other, shared / "m2.jsonl",
                         logs=logs, checkpoint_dir=str(shared / "ck2"), resume=True)
    assert summary["last_epoch"] == 3
    if RANK == 0:
        assert (f"resumed from {shared / 'ck2' / where.name} (epoch 1, step 2 of epoch 2, "
                f"written by {WORLD} ranks on {mesh} gpipe)") in " ".join(logs)
    rows = _rows(shared / "m2.jsonl")
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    for g, w in zip(rows, want_rows):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-9, abs=1e-12), g["epoch"]
        for k in ("train_acc", "valid_acc", "test_acc"):
            assert g[k] == pytest.approx(w[k], abs=1e-12), (g["epoch"], k)
    got = _params(task)
    for n, p in want.items():
        torch.testing.assert_close(got[n], p, **TRAINED, msg=lambda s, n=n: f"{n}: {s}")
