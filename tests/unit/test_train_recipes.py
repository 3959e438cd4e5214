"""perf.train_reference --recipes: prep + train --seeds of a recipe, written beside the
published numbers (on a stand-in graph of the recipe's size: the tool, not the accuracy)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import perf.harness as harness
from perf import train_recipes
from plexgt.config import read_recipe
from plexgt.data.graph import GraphData
from tests.datagen import write_gnn_benchmark

pytestmark = pytest.mark.timeout(300)


def test_prep_args_follow_the_recipe(tmp_path):
    r = read_recipe(train_recipes.recipe_path("cs"))
    args = train_recipes.prep_args(r, tmp_path / "o", tmp_path)
    assert args[:3] == ["prep", "--input", str(tmp_path / "gnn-benchmark" / "ms_academic_cs.npz")]
    i = args.index("--split-file")
    assert args[i + 1] == str(train_recipes.ROOT / "configs/splits/coauthor-cs_split.npz")
    assert "--symmetrize" in args and args[args.index("--normalize-features") + 1] == "row"


def test_a_recipe_runs_and_is_written_beside_the_published_number(tmp_path, monkeypatch):
    n = 7650  # Amazon Photo's N: the recipe's split file names its nodes
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, n, (2, 20000))
    x = rng.random((n, 6)).astype(np.float32)
    g = GraphData("photo", n, src, dst, x, rng.integers(0, 8, n))
    (tmp_path / "gnn-benchmark").mkdir()
    write_gnn_benchmark(tmp_path / "gnn-benchmark" / "amazon_electronics_photo.npz", g)
    # a stand-in for the split file (fetched by data_prep/tunedgnn-splits.sh, not tracked):
    # 60/20/20 of Photo's nodes where the recipe names it, under a stand-in checkout root
    perm = rng.permutation(n)
    (tmp_path / "configs" / "splits").mkdir(parents=True)
    np.savez(tmp_path / "configs" / "splits" / "amazon-photo_split.npz",
             train=perm[:4590], valid=perm[4590:6120], test=perm[6120:])
    monkeypatch.setattr(train_recipes, "SPLITS_ROOT", tmp_path)
    monkeypatch.setattr(harness, "RESULTS_DIR", tmp_path / "results")
    assert train_recipes.main(["photo"], [3], 2, "ref", datasets=tmp_path) == 0
    out = json.loads((tmp_path / "results" / "ref.json").read_text())
    (rec,) = out["recipes"]
    assert rec["seeds"] == [3] and rec["epochs"] == 2 and rec["smoke"]
    assert (rec["published_mean"], rec["published_std"]) == (96.10, 0.46)
    assert rec["split"]["origin"] == "file" and rec["feature_normalization"] == "row"
    assert rec["nodes"] == n and len(rec["per_run"]) == 1
    assert rec["test_acc_mean"] == pytest.approx(100 * rec["per_run"][0]["test"])
    assert rec["difference"] == pytest.approx(rec["test_acc_mean"] - 96.10)
    md = (tmp_path / "results" / "ref.md").read_text()
    assert "| Amazon Photo | `configs/tunedgnn-gcn-photo.toml` |" in md
    assert "96.10 ± 0.46" in md and "2 of 1000 (smoke: not comparable)" in md
    assert "1000 epochs x 3 runs ~" in md


def _rec(seeds, tests, epochs=1000, smoke=False, train_seconds=100.0):
    runs = [{"seed": k, "test": t, "valid": t, "best_epoch": 1, "last_epoch": epochs}
            for k, t in zip(seeds, tests)]
    return {"recipe": "configs/tunedgnn-gcn-photo.toml", "epochs": epochs, "smoke": smoke,
            "seeds": seeds, "per_run": runs, "published_mean": 96.10,
            "test_acc_mean": 100 * sum(tests) / len(tests), "train_seconds": train_seconds}


def test_stored_runs_of_other_seeds_are_added_and_summarised_again():
    stored = {"date": "2026-12-05T10:12:44Z",
              "recipes": [_rec([0], [0.9595]), _rec([7], [0.5], smoke=True, epochs=30)]}
    got = train_recipes.with_stored_runs(_rec([1, 2], [0.9601, 0.9633],
                                              train_seconds=200.0), stored)
    assert got["seeds"] == [0, 1, 2]
    assert [run["measured"] for run in got["per_run"]][0] == "2026-12-05T10:12:44Z"
    assert got["test_acc_mean"] == pytest.approx((95.95 + 96.01 + 96.33) / 3)
    assert got["test_acc_std"] == pytest.approx(np.std([95.95, 96.01, 96.33], ddof=1))
    assert got["within"] and got["difference"] == pytest.approx(got["test_acc_mean"] - 96.10)
    assert got["train_seconds"] == pytest.approx(300.0)
    # a seed run again replaces its stored run; smoke runs and other epochs never combine
    again = train_recipes.with_stored_runs(_rec([0], [0.95]), stored)
    assert again["seeds"] == [0] and again["per_run"][0]["test"] == 0.95
    smoke = train_recipes.with_stored_runs(_rec([1], [0.9], smoke=True, epochs=30), stored)
    assert smoke["seeds"] == [1]
    assert train_recipes.with_stored_runs(_rec([1], [0.9], epochs=500), stored)["seeds"] == [1]
