"""Configuration: TOML + flags + --key=value, every key checked, hash of what matters."""

import subprocess
import sys

import numpy as np
import pytest

from plexgt.config import to_toml
from plexgt.errors import ConfigError
from plexgt.plan.knobs import load_config
from plexgt.tasks.metrics import resolve_metric, roc_auc, task_roc_auc


def test_precedence_and_types(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('epochs = 7\n[model]\nname = "gt"\nhidden = 32\nheads = 4\n[optim]\nlr = 1\n')
    cfg = load_config(f, {"epochs": 9, "model.hidden": None}, ["--model.hidden=64"])
    assert cfg.epochs == 9  # flag over file
    assert cfg.model.hidden == 64  # override over file
    assert cfg.model.name == "gt" and cfg.optim.lr == 1.0  # int accepted for a float
    assert load_config(None, {}, []).model.name == "gcn"  # defaults


@pytest.mark.parametrize("overrides,message", [
    (["--model.hiden=3"], "unknown config key 'model.hiden'"),
    (["--epochs=abc"], "config key 'epochs': 'abc' is not a int"),
    (["--model.name=foo"], "config key 'model.name': 'foo' is not one of gcn, gt, gps, mlp, "
                             "sage"),
    (["--parallel.grid=2x2"], "config key 'parallel.grid'"),
    (["--resume=true"], "config key 'resume' needs 'checkpoint_dir'"),
    (["--model.name=gt", "--model.hidden=10", "--model.heads=4"], "not divisible"),
    (["epochs"], "is not of the form --key=value"),
    (["--optim.lr=-1"], "config key 'optim.lr': -1.0 must be a finite number > 0"),
    (["--optim.lr=nan"], "config key 'optim.lr': nan must be a finite number > 0"),
    (["--optim.weight_decay=inf"], "config key 'optim.weight_decay': inf must be a finite"),
    (["--parallel.timeout_s=0"], "config key 'parallel.timeout_s': 0.0 must be a finite"),
    (["--model.ffn_mult=0"], "model.ffn_mult must be >= 1"),
    (["--model.name=gt", "--model.super_nodes=-1"], "'model.super_nodes': -1 must be >= 0"),
    (["--model.super_nodes=2"], "and 0 for gcn"),
    (["--model.node_embedding=-5"], "config key 'model.node_embedding': -5 is negative"),
    (["--model.name=gt", "--parallel.strategy=gp_ring", "--parallel.head_parallel=2"],
     "config key 'parallel.head_parallel': 2 would be ignored: parallel.strategy gp_ring has "
     "no head axis"),
    (["--model.name=gps", "--parallel.strategy=gp_ag", "--parallel.head_parallel=4"],
     "parallel.strategy gp_ag has no head axis"),
    (["--parallel.head_parallel=2"], "'parallel.head_parallel': 2 would be ignored: gcn has "
                                     "no attention"),
    (["--model.norm=group"], "config key 'model.norm': 'group' is not one of auto, none, "
                             "layer, batch"),
    (["--model.residual=yes"], "config key 'model.residual': 'yes' is not one of none, "
                               "identity, linear"),
    (["--model.jk=cat"], "config key 'model.jk': 'cat' needs model.head=true for gcn"),
    (["--model.name=gt", "--model.residual=linear"],
     "config key 'model.residual' is the grid3d models'"),
    (["--model.name=gps", "--model.head=true"], "config key 'model.head' is the grid3d models'"),
    (["--model.name=sage", "--model.jk=max"],
     "config key 'model.jk': 'max' needs model.head=true for sage"),
    (["--model.name=gt", "--model.super_nodes=2", "--model.norm=batch"],
     "config key 'model.norm': 'batch' with model.super_nodes"),
])
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, {}, overrides)


@pytest.mark.parametrize("name", ["gcn", "sage", "mlp"])
def test_pre_norm_is_accepted_on_every_grid3d_model(name):
    # refused for sage and mlp until the operator-options test compared the last op's rows
    # in its own output order (tests/mpi/test_plexus_operator_options.py)
    cfg = load_config(None, {}, [f"--model.name={name}", "--model.pre_norm=true",
                                 "--model.head=true", "--model.norm=layer"])
    assert cfg.model.pre_norm


def test_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("epochs = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    bad.write_text("epochs = 'many'\n")  # valid TOML, a value of the wrong type
    with pytest.raises(ConfigError, match="config key 'epochs'"):
        load_config(bad)


def test_hash_ignores_bookkeeping_but_not_the_model():
    a = load_config(None, {"epochs": 5, "metrics": "m.jsonl"}, [])
    b = load_config(None, {"epochs": 5, "checkpoint_dir": "c", "stop_after": 3}, [])
    c = load_config(None, {}, ["--model.hidden=7"])
    assert a.hash() == b.hash() != c.hash()


def test_toml_round_trip(tmp_path):
    cfg = load_config(None, {"model.name": "gps"}, ["--optim.lr=0.003"])
    f = tmp_path / "resolved.toml"
    f.write_text(to_toml(cfg))
    assert load_config(f) == cfg


def test_bfloat16_is_a_dtype():
    assert load_config(None, {"dtype": "bfloat16", "model.name": "gcn"}).dtype == "bfloat16"
    with pytest.raises(ConfigError, match="'dtype': 'float16' is not one of"):
        load_config(None, {"dtype": "float16"})


def test_roc_auc_equals_scikit_learn_and_the_metric_follows_the_labels(tmp_path):
    rng = np.random.default_rng(3)
    s = np.round(rng.normal(size=(5, 300)), 1)  # many ties
    y = rng.integers(0, 2, (5, 300))
    np.savez(tmp_path / "sy.npz", s=s, y=y)
    # scikit-learn in its own process: its OpenMP runtime stays out of this one's
    code = ("import numpy as np, sys; from sklearn.metrics import roc_auc_score as f; "
            "z = np.load(sys.argv[1]); print(' '.join(repr(f(b, a)) for a, b in "
            "zip(z['s'], z['y'])))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "sy.npz")],
                         capture_output=True, text=True, check=True).stdout.split()
    for a, b, want in zip(s, y, out):
        assert roc_auc(a, b) == pytest.approx(float(want), rel=1e-12)
    assert np.isnan(roc_auc(np.ones(4), np.ones(4)))  # one class: undefined
    assert resolve_metric("auto", 2) == "rocauc" and resolve_metric("auto", 5) == "acc"
    assert resolve_metric("accuracy", 2) == "acc"
    with pytest.raises(ValueError, match="metric rocauc needs binary labels; the graph has 3"):
        resolve_metric("rocauc", 3)
    with pytest.raises(ConfigError, match="'metric': 'auc' is not one of auto, accuracy"):
        load_config(None, {}, ["--metric=auc"])


def test_multilabel_roc_auc_is_ogbs_mean_over_tasks(tmp_path):
    """Mean over tasks of scikit-learn's ROC-AUC on each task's labelled nodes, tasks with one
    class only left out: what OGB's evaluator computes for ogbn-proteins."""
    rng = np.random.default_rng(5)
    s = np.round(rng.normal(size=(200, 6)), 1)
    y = rng.integers(0, 2, (200, 6))
    y[rng.random((200, 6)) < 0.2] = -1  # unlabelled pairs
    y[:, 4] = np.where(y[:, 4] >= 0, 1, -1)  # one class only: skipped
    np.savez(tmp_path / "sy.npz", s=s, y=y)
    code = ("import numpy as np, sys; from sklearn.metrics import roc_auc_score as f; "
            "z = np.load(sys.argv[1]); s, y = z['s'], z['y']; "
            "a = [f(y[y[:, t] >= 0, t], s[y[:, t] >= 0, t]) for t in range(y.shape[1]) "
            "if len(set(y[y[:, t] >= 0, t])) == 2]; print(repr(sum(a) / len(a)), len(a))")
    want, tasks = subprocess.run([sys.executable, "-c", code, str(tmp_path / "sy.npz")],
                                 capture_output=True, text=True, check=True).stdout.split()
    assert int(tasks) == 5
    assert task_roc_auc(s, y) == pytest.approx(float(want), rel=1e-12)
    assert task_roc_auc(s[:, 0], y[:, 0].clip(0)) == roc_auc(s[:, 0], y[:, 0].clip(0))
    assert np.isnan(task_roc_auc(s[:, 4:5], y[:, 4:5]))
    assert resolve_metric("auto", 112, multilabel=True) == "rocauc"
    with pytest.raises(ValueError, match="metric accuracy needs class labels; the graph has "
                                         "112 multi-label tasks"):
        resolve_metric("accuracy", 112, multilabel=True)


def test_a_head_axis_is_kept_where_a_strategy_has_one():
    """gp_2d, and 'auto' (which may choose gp_2d), take parallel.head_parallel; an axis of 1
    is every strategy's (perf/validate_plan.py sets it so for the others)."""
    for strategy, a in (("gp_2d", 2), ("auto", 2), ("gp_ring", 1), ("gp_a2a", 1)):
        cfg = load_config(None, {}, ["--model.name=gt", f"--parallel.strategy={strategy}",
                                     f"--parallel.head_parallel={a}"])
        assert cfg.parallel.head_parallel == a


@pytest.mark.parametrize("overrides,key,limit", [
    (["--model.node_embedding=100000000"], "model.node_embedding", "physical memory"),
    (["--model.name=gt", "--model.super_nodes=1000000000"], "model.super_nodes",
     "physical memory"),
    (["--model.node_embedding=1000000", "--parallel.memory_per_rank_gb=1"],
     "model.node_embedding", "parallel.memory_per_rank_gb (1,073,741,824 bytes)"),
])
def test_a_table_no_rank_can_hold_is_refused_before_allocating(overrides, key, limit):
    """10⁸ embedding columns or 10⁹ super nodes of a 400-node graph: one line naming the key
    and the bytes, against the rank's limit or the machine's memory (a MemoryError traceback
    in the first array before)."""
    from types import SimpleNamespace

    from plexgt.tasks.limits import check_memory

    pg = SimpleNamespace(N=400)
    cfg = load_config(None, {}, overrides)
    with pytest.raises(ConfigError, match=f"config key '{key}': .* needs at least .* bytes a "
                                          "rank on 2 rank") as e:
        check_memory(cfg, pg, 2)
    assert limit in str(e.value) and "\n" not in str(e.value)
    check_memory(load_config(None, {}, ["--model.node_embedding=64"]), pg, 2)  # a sane one
