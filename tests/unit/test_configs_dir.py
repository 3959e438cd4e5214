"""Every recipe in configs/ loads and validates as ``plexgt train`` loads it, and the published
ones name their data, split and source."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from plexgt.config import read_config, read_recipe
from plexgt.errors import ConfigError
from plexgt.plan.knobs import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))
TUNED = [p for p in CONFIGS if p.name.startswith("tunedgnn-")]
FETCHED = {f"{n}_split.npz" for n in re.search(
    r"^for f in (.*); do$", (ROOT / "data_prep/tunedgnn-splits.sh").read_text(), re.M
).group(1).split()}
"""The split files data_prep/tunedgnn-splits.sh fetches into configs/splits/."""


def test_the_directory_holds_the_recipes():
    names = {p.name for p in CONFIGS}
    assert {"general-gcn.toml", "general-gt.toml", "general-gps.toml"} <= names
    assert {f"tunedgnn-gcn-{d}.toml" for d in ("computers", "photo", "cs", "physics")} <= names
    assert {"hgt-computers.toml", "hgt-cs.toml"} <= names


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name.startswith("hgt-")],
                         ids=lambda p: p.name)
def test_hgt_recipes_name_their_data_and_split_and_train_hgt(path):
    # perf/train_hgt.py preps each from its recipe table: what the prep line says
    r, cfg = read_recipe(path), load_config(path)
    assert cfg.model.name == "hgt" and cfg.parallel.dp == cfg.parallel.pp == "1"
    assert Path(r["split_file"]).name in FETCHED and r["split_file"] in r["prep"]
    assert r["gnn_benchmark_file"] in r["prep"]
    assert f"--normalize-features {r['normalize_features']}" in r["prep"]
    assert ("--sparse-features no" in r["prep"]) == (r.get("sparse_features") == "no")
    assert r["seeds"] == [cfg.seed] and r["runs"] == 1


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_recipe_loads_and_validates(path):
    cfg = load_config(path)  # the schema's checks and the registries'
    assert cfg.data == ""  # the user names the prepared directory
    tree = tomllib.loads(path.read_text())
    # every key the file sets is what the loaded config holds (none dropped or renamed)
    for table in ("model", "optim", "batch"):
        for k, v in tree.get(table, {}).items():
            assert getattr(getattr(cfg, table), k) == v, f"{table}.{k}"
    assert "recipe" in tree and read_recipe(path) == tree["recipe"]
    if path.name.startswith("general-"):
        assert cfg.model.name == path.stem.removeprefix("general-")


@pytest.mark.parametrize("path", TUNED, ids=lambda p: p.name)
def test_published_recipes_name_data_split_and_source(path):
    r = read_recipe(path)
    for k in ("dataset", "gnn_benchmark_file", "split_file", "prep", "runs", "seeds",
              "published_mean", "published_std", "source_repository", "source_commit",
              "source_command", "source_result"):
        assert k in r, k
    split = ROOT / r["split_file"]
    assert r["split_file"] in r["prep"] and split.name in FETCHED
    assert "--normalize-features row" in r["prep"] and r["gnn_benchmark_file"] in r["prep"]
    assert len(r["seeds"]) == r["runs"] == 3
    if split.is_file():  # fetched by data_prep/tunedgnn-splits.sh (not tracked)
        with np.load(split, allow_pickle=False) as z:
            assert sorted(z.files) == ["test", "train", "valid"]
        # the sha256 the splits README lists
        digest = hashlib.sha256(split.read_bytes()).hexdigest()
        assert digest in (ROOT / "configs" / "splits" / "README.md").read_text()
    # the hyperparameters the file's comment quotes from run_gnn.sh are the keys it sets
    cfg = load_config(path)
    run = path.read_text().split("Their run:")[1].split("\n# What")[0]
    quoted = dict(re.findall(r"--(\w+) (\S+)", run))
    assert int(quoted["hidden_channels"]) == cfg.model.hidden
    assert int(quoted["local_layers"]) == cfg.model.layers
    assert int(quoted["epochs"]) == cfg.epochs
    assert float(quoted["lr"]) == cfg.optim.lr
    assert float(quoted["weight_decay"]) == cfg.optim.weight_decay
    assert float(quoted["dropout"]) == cfg.model.dropout
    assert cfg.model.residual == ("linear" if "--res" in run else "none")
    assert ("--ln" in run) == (cfg.model.norm == "layer")


def test_the_recipe_table_sets_nothing(tmp_path):
    body = "epochs = 7\n[model]\nhidden = 32\n"
    bare, described = tmp_path / "a.toml", tmp_path / "b.toml"
    bare.write_text(body)
    described.write_text(body + '[recipe]\ndataset = "x"\nepochs = 999\n')
    assert read_config(described) == read_config(bare)
    bad = tmp_path / "c.toml"
    bad.write_text('recipe = "x"\n')
    with pytest.raises(ConfigError, match="unknown config key 'recipe'"):
        read_config(bad)
    with pytest.raises(ConfigError, match="'recipe' must be a table"):
        read_recipe(bad)
