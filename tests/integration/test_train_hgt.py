"""plexgt train --model hgt under mpiexec: the dp x pp x cp layouts train the single-process
curve, checkpoints resume on another layout, bad layouts are one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import mpiexec, prepared_sbm, run_job

pytestmark = pytest.mark.timeout(300)

COMMON = ["--model", "hgt", "--model.hidden=16", "--model.heads=2", "--model.layers=3",
          "--model.node_embedding=4", "--batch.targets=32", "--batch.size=64",
          "--batch.sequences=4", "--batch.global_nodes=2", "--dtype=float64",
          "--optim.warmup_epochs=2", "--epochs", "6"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return prepared_sbm(tmp_path_factory.mktemp("hgt"), seed=1)


def _train(data: Path, n: int, *extra: str) -> subprocess.CompletedProcess:
    return run_job([mpiexec(), "-n", str(n), sys.executable, "-m", "plexgt", "train",
                    "--data", str(data), *COMMON, *extra], 240)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _same_curve(got: list[dict], want: list[dict]) -> None:
    assert [r["epoch"] for r in got] == [r["epoch"] for r in want] == list(range(1, 7))
    for g, w in zip(got, want):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-9, abs=1e-12), g["epoch"]
        for k in ("train_acc", "valid_acc", "test_acc"):
            assert g[k] == pytest.approx(w[k], abs=1e-12), (g["epoch"], k)


@pytest.fixture(scope="module")
def one_rank(data, tmp_path_factory) -> list[dict]:
    m = tmp_path_factory.mktemp("one") / "m.jsonl"
    r = _train(data, 1, "--metrics", str(m))
    assert r.returncode == 0, r.stderr
    rows = _rows(m)
    assert rows[-1]["loss"] < rows[0]["loss"] and rows[0]["grid"] == "dp1xpp1xcp1"
    return rows


def test_written_on_pp2_resumed_on_dp2_continues_the_single_process_curve(data, tmp_path,
                                                                        one_rank):
    """pp = 2 (stages 1,2; K = 2) for 3 epochs, checkpointed, then dp = 2 to the end: the
    single process's losses and accuracies (float64, dropout on); the node table and the
    AdamW moments went through the canonical checkpoint."""
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    r = _train(data, 2, "--parallel.pp=2", "--parallel.dp=1", "--parallel.cp=1",
               "--parallel.stages=1,2", "--parallel.micro_batches=2", "--metrics", str(m),
               "--checkpoint-dir", str(ck), "--stop-after", "3")
    assert r.returncode == 0, r.stderr
    r = _train(data, 2, "--parallel.dp=2", "--parallel.pp=1", "--parallel.cp=1",
               "--metrics", str(m), "--checkpoint-dir", str(ck), "--resume")
    assert r.returncode == 0, r.stderr
    assert (f"resumed from {ck}/epoch_000003 (epoch 3, written by 2 ranks on dp1xpp2xcp1 "
            "gpipe)") in r.stderr
    rows = _rows(m)
    _same_curve(rows, one_rank)
    assert [r["grid"] for r in rows] == ["dp1xpp2xcp1"] * 3 + ["dp2xpp1xcp1"] * 3
    assert {r["strategy"] for r in rows} == {"gpipe"} and rows[-1]["bytes_comm"] > 0
    assert (ck / "epoch_000006").is_dir()


def test_cp2_trains_the_single_process_curve(data, tmp_path, one_rank):
    m = tmp_path / "m.jsonl"
    r = _train(data, 2, "--parallel.cp=2", "--metrics", str(m))
    assert r.returncode == 0, r.stderr
    rows = _rows(m)
    _same_curve(rows, one_rank)
    assert rows[-1]["grid"] == "dp1xpp1xcp2"
    assert r.stdout.strip().splitlines()[-1].startswith(
        "plexgt train: finished after epoch 6; best validation epoch")


@pytest.mark.parametrize("extra,message", [
    (["--parallel.dp=3", "--batch.sequences=6"], "config keys 'parallel.dp/pp/cp': no mesh "
                                                 "with parallel.dp=3 fits the world size 2"),
    (["--parallel.stages=1,1"], "config key 'parallel.stages': '1,1' sums to 2 layers, not "
                                "model.layers=3"),
    (["--parallel.cp=2", "--batch.size=63"], "config key 'parallel.cp': 2 does not divide "
                                             "batch.size=63"),
    (["--parallel.pp=2", "--parallel.dp=2"], "config keys 'parallel.dp/pp/cp': no mesh with "
                                             "parallel.dp=2 * pp=2 fits the world size 2"),
])
def test_a_bad_layout_is_a_one_line_error(data, tmp_path, extra, message):
    m = tmp_path / "m.jsonl"
    r = _train(data, 2, *extra, "--metrics", str(m))
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("plexgt train: error: ") and message in last, r.stderr
    assert not m.exists() or not m.read_text()


def _plan(data: Path, tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / name
    r = run_job([sys.executable, "-m", "plexgt", "plan", "--data", str(data), "--world-size",
                 "2", *[a for a in COMMON if a not in ("--epochs", "6")], *extra,
                 "--json", str(out)], 120)
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def test_train_with_every_layout_key_auto_runs_the_plans_choice(data, tmp_path):
    """``plexgt train`` with dp/pp/cp/stages/micro_batches all 'auto' runs the layout ``plexgt
    plan`` prints for the same config. Under a memory limit between the frontier's two
    fastest meshes the plan is not the fewest-stages-then-fewest-cp rule's dp2 (what
    choose_layout took before the planner: this test fails with it)."""
    rows = _plan(data, tmp_path, "free.json")["rows"]
    dp2 = min(r["memory_bytes"] for r in rows if (r["dp"], r["pp"], r["cp"]) == (2, 1, 1))
    assert any(r["memory_bytes"] < dp2 for r in rows)  # a leaner mesh than dp2's leanest
    gb = (dp2 - 64) / 2**30
    limit = f"--parallel.memory_per_rank_gb={gb!r}"
    c = _plan(data, tmp_path, "limited.json", f"--memory-per-rank={gb!r}")["choice"]
    assert (c["dp"], c["pp"], c["cp"]) != (2, 1, 1)
    m = tmp_path / "m.jsonl"
    r = _train(data, 2, limit, "--epochs", "1", "--metrics", str(m))
    assert r.returncode == 0, r.stderr
    assert _rows(m)[-1]["grid"] == f"dp{c['dp']}xpp{c['pp']}xcp{c['cp']}"
