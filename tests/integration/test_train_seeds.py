"""``plexgt train --seeds``: one run per seed, each its own files, mean ± std at the end."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest

from plexgt.training.repeats import mean_std, seed_path

from .conftest import prepared_sbm, run_job

pytestmark = pytest.mark.timeout(300)

COMMON = ["--model", "gcn", "--model.hidden=8", "--epochs", "4", "--optim.warmup_epochs=1"]


def _train(data: Path, *extra: str):
    return run_job([sys.executable, "-m", "plexgt", "train", "--data", str(data), *COMMON,
                    *extra])


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_seeds_run_each_seed_and_report_mean_std(tmp_path):
    data = prepared_sbm(tmp_path, seed=2)
    m = tmp_path / "m.jsonl"
    # --deterministic: the last assertion compares two processes to the bit, and MKL's float32
    # GEMMs otherwise pick kernels by the operands' alignment (CI once saw 1-ulp drifts in the
    # first two epochs' losses)
    r = _train(data, "--deterministic", "--seeds", "3", "5", "--metrics", str(m))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("plexgt train: seed 3: finished after epoch 4")
    assert lines[1].startswith("plexgt train: seed 5: finished after epoch 4")
    assert lines[2].startswith("plexgt train: 2 seeds (3, 5): test_acc at the best "
                               "validation epoch ")
    assert not m.exists()  # one file per seed, none mixing them
    s = json.loads((tmp_path / "m.summary.json").read_text())
    assert s["seeds"] == [3, 5] and s["metric"] == "acc" and s["std_ddof"] == 1
    tests = [run["test"] for run in s["runs"]]
    assert s["test_mean"] == pytest.approx(statistics.mean(tests))
    assert s["test_std"] == pytest.approx(statistics.stdev(tests))
    assert f"{s['test_mean']:.4f} ± {s['test_std']:.4f}" in lines[2]
    curves = {}
    for run in s["runs"]:
        rows = _rows(Path(run["metrics"]))
        assert Path(run["metrics"]).name == f"m.seed{run['seed']}.jsonl"
        assert [row["epoch"] for row in rows] == [1, 2, 3, 4]
        best = max(rows, key=lambda row: row["valid_acc"])  # first of equals, as train's
        assert (run["best_epoch"], run["test"]) == (best["epoch"], best["test_acc"])
        curves[run["seed"]] = [row["loss"] for row in rows]
    assert curves[3] != curves[5]  # each seed its own initialisation
    # seed 5 of the several is exactly the run of --seed=5 alone
    alone = tmp_path / "alone.jsonl"
    r = _train(data, "--deterministic", "--seed=5", "--metrics", str(alone))
    assert r.returncode == 0, r.stderr
    assert [row["loss"] for row in _rows(alone)] == curves[5]


def test_seeds_refusals(tmp_path):
    data = prepared_sbm(tmp_path, seed=2)
    r = _train(data, "--seeds", "1", "1")
    assert r.returncode != 0 and "a seed is named twice" in r.stderr
    r = _train(data, "--seeds", "1", "2", "--stop-after", "2")
    assert r.returncode != 0 and "not with --resume or --stop-after" in r.stderr
    r = _train(data, "--summary", str(tmp_path / "s.json"))
    assert r.returncode != 0 and "--summary goes with --seeds" in r.stderr


def test_seed_paths_and_mean_std():
    assert seed_path("out/m.jsonl", 3) == "out/m.seed3.jsonl"
    assert seed_path("ck", 2, directory=True) == str(Path("ck") / "seed2")
    assert seed_path("", 1) == ""
    assert mean_std([0.9]) == (0.9, 0.0)
    mean, std = mean_std([0.93, 0.94, 0.95])
    assert mean == pytest.approx(0.94) and std == pytest.approx(0.01)
    assert all(math.isnan(v) for v in mean_std([]))
