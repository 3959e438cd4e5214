"""``--split-index all``: prep keeps every stored split, training chooses one (or all)."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from plexgt.cli import main
from plexgt.config import TrainConfig, read_config
from plexgt.data.formats.npz_edges import read_edge_npz
from plexgt.data.loader import PreparedGraph, read_targets
from plexgt.data.prepared import mask_ds
from plexgt.data.verify import verify
from plexgt.errors import ConfigError, DataError
from plexgt.training.repeats import (
    Repeat,
    repeat_config,
    repeats,
    run_path,
    seed_path,
    summarize,
    summary_line,
)
from tests.datagen import small_graph

K, N = 3, 40


def _split_masks(k: int = K, n: int = N, seed: int = 0) -> dict[str, np.ndarray]:
    """[k, n] disjoint train/valid/test masks, a different draw per split."""
    rng = np.random.default_rng(seed)
    part = rng.integers(0, 4, size=(k, n))  # 3: in no split
    return {"train_masks": part == 0, "val_masks": part == 1, "test_masks": part == 2}


def _npz(tmp_path, masks=None, name="g.npz"):
    g = small_graph(N, 160, f=3, c=3)
    p = tmp_path / name
    np.savez(p, edges=np.stack([g.src, g.dst], 1), node_features=g.features,
             node_labels=np.arange(N) % 3, **(masks if masks is not None else _split_masks()))
    return p


def _prep(tmp_path, p, *extra, out="out"):
    return main(["prep", "--input", str(p), "--out", str(tmp_path / out), "--tiles", "2",
                 "--quiet", *extra])


def test_reader_keeps_every_split_with_none(tmp_path):
    masks = _split_masks()
    g = read_edge_npz(_npz(tmp_path, masks), None)
    assert len(g.stored_splits) == K
    for k, sp in enumerate(g.stored_splits):
        np.testing.assert_array_equal(sp["train"], np.flatnonzero(masks["train_masks"][k]))
        np.testing.assert_array_equal(sp["valid"], np.flatnonzero(masks["val_masks"][k]))
    assert all(np.array_equal(g.splits[s], g.stored_splits[0][s]) for s in g.splits)
    assert read_edge_npz(tmp_path / "g.npz", 1).stored_splits == []  # one split: as before


def test_reader_refuses_all_without_splits_or_with_unequal_counts(tmp_path):
    with pytest.raises(DataError, match="holds no split masks; --split-index all has none"):
        read_edge_npz(_npz(tmp_path, {}), None)
    m = _split_masks()
    m["val_masks"] = m["val_masks"][:2]
    with pytest.raises(DataError, match=r"different numbers of splits \('train_masks' 3, "
                                        r"'val_masks' 2"):
        read_edge_npz(_npz(tmp_path, m), None)


def test_prep_all_stores_every_split_in_both_orders(tmp_path):
    masks = _split_masks()
    assert _prep(tmp_path, _npz(tmp_path, masks), "--split-index", "all") == 0
    out = tmp_path / "out"
    man = json.loads((out / "manifest.json").read_text())
    rec = man["split"]
    assert rec["origin"] == "dataset" and rec["split_index"] == "all"
    assert rec["num_splits"] == K and len(rec["sizes"]) == K
    assert rec["sizes"][2]["train"] == int(masks["train_masks"][2].sum())
    assert man["splits"] == rec["sizes"][0]
    with h5py.File(out / "nodes.h5") as f:
        names = set(f)
    assert {mask_ds(s, o, k) for s in ("train", "valid", "test") for o in "PQ"
            for k in (None, 1, 2)} <= names and mask_ds("train", "P", 3) not in names
    pg = PreparedGraph(out)
    assert pg.split_indices == [0, 1, 2] and pg.split == 0
    for k in range(K):
        pg.select_split(k)
        for order in "PQ":
            got = pg.to_original(pg.read_mask("train", None, order), order)
            np.testing.assert_array_equal(got, masks["train_masks"][k])
            got = pg.to_original(pg.read_mask("test", None, order), order)
            np.testing.assert_array_equal(got, masks["test_masks"][k])
        # a rank reads its rows only, of the selected split
        whole = pg.read_masks(None, "Q")
        t = read_targets(pg, (10, 25), "Q", 16)
        np.testing.assert_array_equal(t.masks["train"][:15], whole["train"][10:25])
        assert not t.masks["train"][15]
    res = verify(out)
    assert res["ok"], res["problems"]


def test_default_split_and_refused_indices(tmp_path):
    assert _prep(tmp_path, _npz(tmp_path), "--split-index", "all") == 0
    assert PreparedGraph(tmp_path / "out", split="default").split == 0
    assert PreparedGraph(tmp_path / "out", split=2).split == 2
    with pytest.raises(DataError, match=r"holds splits 0..2; split_index 3 is not one of them$"):
        PreparedGraph(tmp_path / "out", split=3)
    with pytest.raises(ConfigError, match="'all' is plexgt train's"):
        PreparedGraph(tmp_path / "out", split="all")
    # a one-split directory (prep --split-index 1) holds that split alone, unchanged layout
    assert _prep(tmp_path, tmp_path / "g.npz", "--split-index", "1", out="one") == 0
    pg = PreparedGraph(tmp_path / "one")
    assert pg.split_indices == [1]
    with h5py.File(tmp_path / "one" / "nodes.h5") as f:
        assert mask_ds("train", "P", 1) not in f and mask_ds("train", "P") in f
    with pytest.raises(DataError, match="holds split 1; split_index 0 is not one of them; "
                                        "plexgt prep --split-index all keeps"):
        pg.select_split(0)


def test_prep_all_refusals_leave_nothing(tmp_path, capsys):
    assert _prep(tmp_path, _npz(tmp_path, {}), "--split-index", "all") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no split masks; --split-index all has none to keep" in err[0]
    assert not (tmp_path / "out" / "manifest.json").exists()
    m = _split_masks()
    m["test_masks"][1] |= m["train_masks"][1]  # split 1 puts train nodes in test
    assert _prep(tmp_path, _npz(tmp_path, m, "o.npz"), "--split-index", "all", out="o") != 0
    err = capsys.readouterr().err
    assert "(stored split 1): node" in err and "splits must not overlap" in err
    assert not (tmp_path / "o" / "manifest.json").exists()
    with pytest.raises(SystemExit):
        _prep(tmp_path, tmp_path / "g.npz", "--split-index", "some")
    assert "'some' is not a split index (0, 1, ...) or 'all'" in capsys.readouterr().err


def test_split_index_config_key():
    assert TrainConfig().split_index == "default"
    assert read_config(None, None, ["--split_index=3"]).split_index == 3
    assert read_config(None, {"split_index": "all"}).split_index == "all"
    assert read_config(None, {"split_index": 2}).split_index == 2  # a TOML integer
    for bad in ("some", "-1"):
        with pytest.raises(ConfigError, match="config key 'split_index'"):
            read_config(None, None, [f"--split_index={bad}"])
    with pytest.raises(ConfigError, match="config key 'split_index': True"):
        read_config(None, {"split_index": True})
    # the default leaves the hash as it was; another split is another computation
    assert read_config().hash() == read_config(None, {"split_index": "default"}).hash()
    assert read_config(None, {"split_index": 1}).hash() != read_config().hash()


def test_repeats_paths_product_and_summary():
    assert run_path("out/m.jsonl", ["split3", "seed1"]) == "out/m.split3.seed1.jsonl"
    assert run_path("ck", ["split2"], directory=True).endswith("ck/split2")
    assert run_path("", ["split1"]) == "" and seed_path("m.jsonl", 4) == "m.seed4.jsonl"
    plan = repeats([0, 1], [5, 6])
    assert [(r.split, r.seed) for r in plan] == [(0, 5), (0, 6), (1, 5), (1, 6)]
    assert repeats([0, 2], None) == [Repeat(0), Repeat(2)]
    assert Repeat(3, 1).label() == "split 3, seed 1" and Repeat(seed=2).label() == "seed 2"
    cfg = TrainConfig(metrics="m.jsonl", checkpoint_dir="ck", tensorboard="tb", seed=9)
    c = repeat_config(cfg, Repeat(split=4))
    assert (c.split_index, c.seed, c.metrics) == (4, 9, "m.split4.jsonl")
    assert c.checkpoint_dir.endswith("ck/split4") and c.tensorboard.endswith("tb/split4")
    runs = [{"split": k, "seed": 0, "test": t, "valid": v}
            for k, (t, v) in enumerate([(0.8, 0.7), (0.9, 0.75), (0.7, 0.8)])]
    s = summarize("rocauc", runs, c)
    assert s["splits"] == [0, 1, 2] and s["test_mean"] == pytest.approx(0.8)
    assert s["test_std"] == pytest.approx(0.1)
    assert summary_line(s).startswith("plexgt train: 3 splits (0, 1, 2): test_rocauc at the "
                                      "best validation epoch 0.8000 ± 0.1000")
    both = [dict(r, seed=sd) for r in runs[:2] for sd in (1, 2)]
    assert "4 runs (splits 0, 1 x seeds 1, 2)" in summary_line(summarize("acc", both, c))
    assert "splits" not in summarize("acc", [{"seed": 1, "test": 1.0, "valid": 1.0}], cfg)
