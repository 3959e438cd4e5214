"""``plexgt prep/train --split-index all``: every stored split kept, one run per split, each
on its own split, mean ± std at the end (the heterophilous benchmarks' 10-split protocol)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

from plexgt.data.synthetic import sbm

from .conftest import mpiexec, run_job

pytestmark = pytest.mark.timeout(400)

K = 3
COMMON = ["--model", "gcn", "--model.hidden=8", "--epochs", "3", "--optim.warmup_epochs=1",
          "--deterministic"]
# --deterministic: split k of the several is compared with its run alone to the bit, across
# processes (MKL's float32 GEMMs pick kernels by alignment otherwise)


def _plexgt(*args: str):
    return run_job([sys.executable, "-m", "plexgt", *args])


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """An SBM graph written as a heterophilous-benchmark npz with K stored splits ([K, N]
    masks, a different train set each), prepared with --split-index all."""
    root = tmp_path_factory.mktemp("splits")
    g = sbm(num_nodes=400, num_edges=3000, num_classes=4, num_features=16, seed=4)
    part = np.random.default_rng(1).integers(0, 3, size=(K, g.num_nodes))
    np.savez(root / "g.npz", edges=np.stack([g.src, g.dst], 1), node_features=g.features,
             node_labels=g.labels, train_masks=part == 0, val_masks=part == 1,
             test_masks=part == 2)
    r = _plexgt("prep", "--input", str(root / "g.npz"), "--split-index", "all", "--tiles", "2",
                "--out", str(root / "d"), "--quiet")
    assert r.returncode == 0, r.stderr
    return root / "d", part


def test_prep_all_and_train_each_split(prepared, tmp_path):
    data, part = prepared
    man = json.loads((data / "manifest.json").read_text())
    assert man["split"]["num_splits"] == K
    assert [s["train"] for s in man["split"]["sizes"]] == [int((p == 0).sum()) for p in part]
    m = tmp_path / "m.jsonl"
    r = _plexgt("train", "--data", str(data), *COMMON, "--split-index", "all", "--metrics",
                str(m), "--checkpoint-dir", str(tmp_path / "ck"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    for k in range(K):
        assert lines[k].startswith(f"plexgt train: split {k}: finished after epoch 3")
    assert lines[K].startswith("plexgt train: 3 splits (0, 1, 2): test_acc at the best "
                               "validation epoch ")
    assert not m.exists()  # one file per split
    s = json.loads((tmp_path / "m.summary.json").read_text())
    assert s["splits"] == [0, 1, 2] and s["config"]["split_index"] == 0
    tests = [run["test"] for run in s["runs"]]
    assert s["test_mean"] == pytest.approx(statistics.mean(tests))
    assert s["test_std"] == pytest.approx(statistics.stdev(tests))
    assert f"{s['test_mean']:.4f} ± {s['test_std']:.4f}" in lines[K]
    curves = {}
    for run in s["runs"]:
        k = run["split"]
        assert Path(run["metrics"]).name == f"m.split{k}.jsonl"
        assert (tmp_path / "ck" / f"split{k}").is_dir()
        rows = _rows(Path(run["metrics"]))
        best = max(rows, key=lambda row: row["valid_acc"])
        assert (run["best_epoch"], run["test"]) == (best["epoch"], best["test_acc"])
        curves[k] = [row["loss"] for row in rows]
    # the same seed on three train sets: three different curves
    assert len({tuple(c) for c in curves.values()}) == K
    # split 2 of the several is exactly the run of --split-index 2 alone
    alone = tmp_path / "alone.jsonl"
    r = _plexgt("train", "--data", str(data), *COMMON, "--split-index", "2", "--metrics",
                str(alone))
    assert r.returncode == 0, r.stderr
    assert [row["loss"] for row in _rows(alone)] == curves[2]


@pytest.mark.parametrize("model", ["gcn"])
def test_each_split_on_three_ranks_equals_one_rank(prepared, tmp_path, model):
    """Each rank reads its own rows of split k's masks (nodes.h5 hyperslabs of the split's
    datasets): the 3-rank curves of every split equal the 1-rank ones (float64)."""
    data, _ = prepared
    curves = {}
    for n in (1, 3):
        m = tmp_path / f"n{n}.jsonl"
        r = run_job([mpiexec(), "-n", str(n), sys.executable, "-m", "plexgt", "train",
                     "--data", str(data), *COMMON, "--model", model, "--dtype=float64",
                     "--split-index", "all", "--metrics", str(m)], 300)
        assert r.returncode == 0, r.stderr
        curves[n] = {k: [row["loss"] for row in _rows(tmp_path / f"n{n}.split{k}.jsonl")]
                     for k in range(K)}
    for k in range(K):
        assert curves[3][k] == pytest.approx(curves[1][k], rel=1e-6, abs=1e-9), k
    assert len({tuple(c) for c in curves[1].values()}) == K


def test_splits_times_seeds(prepared, tmp_path):
    data, _ = prepared
    m = tmp_path / "m.jsonl"
    r = _plexgt("train", "--data", str(data), *COMMON, "--epochs", "1", "--split-index=all",
                "--seeds", "4", "5", "--metrics", str(m), "--summary", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    assert list(zip(s["splits"], s["seeds"])) == [(k, sd) for k in range(K) for sd in (4, 5)]
    assert sorted(Path(run["metrics"]).name for run in s["runs"]) == sorted(
        f"m.split{k}.seed{sd}.jsonl" for k in range(K) for sd in (4, 5))
    assert "6 runs (splits 0, 1, 2 x seeds 4, 5)" in r.stdout


def test_refusals_are_one_line_and_write_nothing(prepared, tmp_path):
    data, _ = prepared
    m = tmp_path / "m.jsonl"
    cases = [
        (["--split-index", "7"], f"{data}: holds splits 0..2; split_index 7 is not one of them"),
        (["--split-index", "some"], "config key 'split_index': 'some' must be a split index"),
        (["--split-index", "all", "--stop-after", "1"],
         "--split-index all runs every split from epoch 0 to the end: not with --resume or "
         "--stop-after"),
    ]
    for extra, msg in cases:
        r = _plexgt("train", "--data", str(data), *COMMON, "--metrics", str(m), *extra)
        err = [line for line in r.stderr.strip().splitlines() if line]
        assert r.returncode != 0 and len(err) == 1 and msg in err[0], (extra, r.stderr)
        assert not list(tmp_path.iterdir()), extra  # no metrics file, no summary
