"""plexgt predict and evaluate end to end under mpiexec: one checkpoint, any layout, the same
predictions in the raw input's node order; the metrics train logged; bad input refused.

Every run is float64 (trained with --dtype=float64), so distributed and single-process
outputs agree to rounding (1e-10), and argmax and accuracies exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from plexgt.data.graph import GraphData
from plexgt.data.predictions import PredictionsFile
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.synthetic import sbm
from plexgt.models.gcn import GCN
from plexgt.models.gps import GPS
from plexgt.models.layers import ModelGraph, gcn_conv
from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import gcn_norm
from tests.datagen import prepared_sbm

from .conftest import mpiexec, run_job

pytestmark = pytest.mark.timeout(600)

SPLITS = ("train", "valid", "test")


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> tuple[GraphData, Path]:
    """A 600-node SBM graph (4 classes, 16 features) and its prepared directory."""
    out = tmp_path_factory.mktemp("predict") / "sbm"
    g = sbm(num_nodes=600, num_edges=6000, num_classes=4, num_features=16, seed=1)
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False))
    return g, out


@pytest.fixture(scope="module")
def gcn_ckpt(graph, tmp_path_factory) -> tuple[Path, dict]:
    """A 3-layer GCN trained 4 epochs on 1 rank."""
    return _trained(graph[1], tmp_path_factory.mktemp("gcn"), 1, "--model", "gcn",
                    "--model.layers=3", "--epochs", "4")


@pytest.fixture(scope="module")
def gt_ckpt(graph, tmp_path_factory) -> tuple[Path, dict]:
    """gt with a learned node embedding trained 3 epochs by 2 ranks on GP-A2A: the table is
    sharded by rows in the checkpoint."""
    return _trained(graph[1], tmp_path_factory.mktemp("gt"), 2, "--model", "gt",
                    "--model.heads=2", "--strategy", "gp_a2a", "--epochs", "3",
                    "--model.node_embedding=4")


def _plexgt(n: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_job([mpiexec(), "-n", str(n), sys.executable, "-m", "plexgt", *map(str, args)],
                   timeout)


def _trained(data: Path, root: Path, n: int, *extra: str) -> tuple[Path, dict]:
    """Train float64 with checkpoints; (checkpoint dir, the last epoch's metrics row)."""
    ck, metrics = root / "ck", root / "metrics.jsonl"
    r = _plexgt(n, "train", "--data", data, "--checkpoint-dir", ck, "--metrics", metrics,
                "--dtype=float64", "--model.hidden=16", "--optim.warmup_epochs=1", *extra)
    assert r.returncode == 0, r.stderr
    return ck, json.loads(metrics.read_text().splitlines()[-1])


def _predict(ck: Path, data: Path, out: Path, n: int, *extra: str) -> dict[str, np.ndarray]:
    r = _plexgt(n, "predict", "--checkpoint", ck, "--data", data, "--out", out, *extra)
    assert r.returncode == 0, r.stderr
    assert f"-> {out}" in r.stderr
    f = PredictionsFile(out)
    (_, cols), = list(f.chunks(f.columns, rows=f.n))
    cols["meta"] = f.meta
    return cols


def _canonical(ck: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's model tensors (newest epoch), through DCP's own converter."""
    epoch = sorted(ck.glob("epoch_*"))[-1]
    dcp_to_torch_save(epoch, tmp / "state.pt")
    state = torch.load(tmp / "state.pt", weights_only=False)
    return {k.removeprefix("model/"): v for k, v in state.items() if k.startswith("model/")}


def _check_order_and_splits(got: dict, g: GraphData) -> None:
    """Row i is node i of the raw input, in the split the input gave it."""
    assert np.array_equal(got["node_id"], np.arange(g.num_nodes))
    want = np.zeros(g.num_nodes, dtype=np.int8)
    for code, s in enumerate(SPLITS, start=1):
        want[g.splits[s]] = code
    assert np.array_equal(got["split"], want)


def _accuracies(got: dict, g: GraphData) -> dict[str, float]:
    """The accuracy of the file's predictions on each split, against the raw input's labels."""
    return {f"{s}_acc": float(np.mean(got["pred"][g.splits[s]] == g.labels[g.splits[s]]))
            for s in SPLITS}


def _same(a: dict, b: dict, columns: tuple[str, ...]) -> None:
    for c in columns:
        if a[c].dtype.kind == "f":
            np.testing.assert_allclose(a[c], b[c], rtol=0, atol=1e-10, err_msg=c)
        else:
            assert np.array_equal(a[c], b[c]), c


def _raw_graph(g: GraphData) -> ModelGraph:
    """The single-process operators of the raw graph, in its own node order (the prepared
    pattern has every self loop: the attention's too)."""
    n, loops = g.num_nodes, np.arange(g.num_nodes)
    adj = CSRGraph.from_coo(np.concatenate([g.dst, loops]), np.concatenate([g.src, loops]), n,
                            n)
    return ModelGraph(adj, gcn_norm(adj, dtype=torch.float64))


def test_gcn_predicts_the_single_process_model_on_every_grid(graph, gcn_ckpt, tmp_path):
    """A 3-layer GCN trained on 1 rank predicts on 1 rank (Parquet), on 4 ranks on 2x2x1
    (HDF5) and on 1x2x2 (.npy): the same logits, classes and hidden embeddings, each the
    single-process GCN's on the raw graph, row i the raw input's node i; the accuracy
    recomputed from the file is the one train logged for the checkpoint's epoch, and
    evaluate --predictions says the same."""
    g, data = graph
    ck, last = gcn_ckpt
    one = _predict(ck, data, tmp_path / "one.parquet", 1, "--embeddings", "hidden")
    a = _predict(ck, data, tmp_path / "a.h5", 4, "--grid", "2x2x1", "--embeddings", "layers.1")
    b = _predict(ck, data, tmp_path / "b.npy", 4, "--grid", "1x2x2", "--embeddings", "hidden")
    for got in (one, a, b):
        _check_order_and_splits(got, g)
        _same(got, one, ("pred", "logits", "embedding"))
    assert one["logits"].dtype == np.float64 and one["embedding"].shape == (600, 16)
    meta = one["meta"]
    assert (meta["epoch"], meta["model"], meta["embedding_layer"]) == (4, "gcn", "layers.1")

    ref = GCN(16, 16, 4, num_layers=3).double()
    ref.load_state_dict(_canonical(ck, tmp_path))
    ref.eval()
    x, gr = torch.from_numpy(g.features).double(), _raw_graph(g)
    with torch.no_grad():
        hidden = torch.relu(gcn_conv(gr.gcn, x, ref.layers[0]))
        hidden = torch.relu(gcn_conv(gr.gcn, hidden, ref.layers[1]))
        logits = ref(x, gr)
    np.testing.assert_allclose(one["embedding"], hidden.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(one["logits"], logits.numpy(), rtol=0, atol=1e-10)

    acc = _accuracies(one, g)
    assert acc == {k: last[k] for k in acc}
    r = _plexgt(1, "evaluate", "--predictions", tmp_path / "a.h5", "--data", data, "--json")
    assert r.returncode == 0, r.stderr
    assert {k: v for k, v in json.loads(r.stdout).items() if k in acc} == acc


def test_evaluate_a_checkpoint_on_another_layout_gives_the_logged_metrics(graph, gt_ckpt):
    """A gt checkpoint of 2 ranks (GP-A2A) evaluated by 3 ranks on GP-Ring: every split's
    accuracy is the one train logged for that epoch."""
    g, data = graph
    ck, last = gt_ckpt
    r = _plexgt(3, "evaluate", "--checkpoint", ck, "--data", data, "--strategy", "gp_ring",
                "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["epoch"] == 3
    assert {k: got[k] for k in ("train_acc", "valid_acc", "test_acc")} == {
        k: last[k] for k in ("train_acc", "valid_acc", "test_acc")}
    r = _plexgt(1, "evaluate", "--checkpoint", ck, "--data", data)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"plexgt evaluate: {ck}/epoch_000003 (epoch 3) on {data}")


def test_gt_with_a_node_embedding_predicts_the_same_on_every_strategy(graph, gt_ckpt,
                                                                      tmp_path):
    """gt with a learned node embedding (sharded in the checkpoint by the 2 ranks of GP-A2A
    that trained it) predicts on 1 rank, on 2 with GP-AG and on 3 with GP-Ring: the same
    logits, classes and block embeddings, in node order."""
    g, data = graph
    ck, last = gt_ckpt
    one = _predict(ck, data, tmp_path / "one.npy", 1, "--embeddings", "blocks.0")
    for n, s, suffix in ((2, "gp_ag", "parquet"), (3, "gp_ring", "h5")):
        got = _predict(ck, data, tmp_path / f"{s}.{suffix}", n, "--strategy", s,
                       "--embeddings", "blocks.0")
        _check_order_and_splits(got, g)
        _same(got, one, ("pred", "logits", "embedding"))
    assert _accuracies(one, g)["test_acc"] == last["test_acc"]


def test_gps_predicts_the_single_process_model_on_its_3d_and_1d_paths(graph, tmp_path):
    """gps trained on 1 rank predicts on 4 ranks (GCN path 3D on 2x2x1) and on 2 (GP-A2A,
    1D path): the single-process GPS's logits and first block's output on the raw graph."""
    g, data = graph
    ck, last = _trained(data, tmp_path, 1, "--model", "gps", "--model.heads=2", "--epochs",
                        "3")
    ref = GPS(16, 16, 4, num_layers=2, heads=2).double()
    ref.load_state_dict(_canonical(ck, tmp_path))
    ref.eval()
    x, gr = torch.from_numpy(g.features).double(), _raw_graph(g)
    with torch.no_grad():
        logits = ref(x, gr)
        block0 = ref.blocks[0](ref.input(x), gr)[0]
    for n, layout in ((4, ["--grid", "2x2x1", "--strategy", "gp_ag"]),
                      (2, ["--strategy", "gp_a2a"])):
        got = _predict(ck, data, tmp_path / f"p{n}.parquet", n, *layout, "--embeddings",
                       "blocks.0")
        _check_order_and_splits(got, g)
        np.testing.assert_allclose(got["logits"], logits.numpy(), rtol=0, atol=1e-10)
        np.testing.assert_allclose(got["embedding"], block0.numpy(), rtol=0, atol=1e-10)
        assert _accuracies(got, g)["test_acc"] == last["test_acc"]


def test_multilabel_predictions_hold_probabilities_and_the_logged_rocauc(tmp_path):
    """Three 0/1 tasks: the file holds sigmoid probabilities beside the logits, no class;
    evaluate --predictions gives the test ROC-AUC train logged."""
    from tests.datagen import multilabel

    data = tmp_path / "ml"
    g = multilabel(sbm(num_nodes=400, num_edges=4000, num_classes=4, num_features=12, seed=2),
                   tasks=3)
    prepare(MemorySource(g), PrepOptions(out=data, tiles=2, progress=False))
    ck, last = _trained(data, tmp_path, 1, "--model", "gcn", "--epochs", "3")
    got = _predict(ck, data, tmp_path / "p.parquet", 3, "--grid", "1x3x1")
    assert "pred" not in got and got["prob"].shape == got["logits"].shape == (400, 3)
    np.testing.assert_allclose(got["prob"], 1 / (1 + np.exp(-got["logits"])), rtol=1e-12)
    r = _plexgt(1, "evaluate", "--predictions", tmp_path / "p.parquet", "--data", data,
                "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["test_rocauc"] == pytest.approx(last["test_rocauc"], abs=1e-12)


def test_bad_input_is_one_line_and_leaves_no_file(graph, gcn_ckpt, tmp_path):
    """A checkpoint of another dataset, none at all, a layer the model lacks, a model key, an
    existing output, an unknown suffix, an output directory that is not one: one line each,
    exit 2, the directory as it was."""
    g, data = graph
    ck, _ = gcn_ckpt
    other = tmp_path / "other"
    prepared_sbm(other, 600, 6000, num_classes=4, num_features=16, seed=2, tiles=2,
                 symmetrize=False)
    out = tmp_path / "out"
    out.mkdir()
    (out / "exists.npy").write_text("mine")
    (out / "file").write_text("")
    cases = [
        (1, [ck, data, out / "x.npy", "--embeddings", "layers.5"],
         "--embeddings layers.5: the model has no such layer; its layers: layers.0, "
         "layers.1, layers.2, hidden"),
        (1, [ck, other, out / "x.npy"], "is another dataset"),
        (1, [tmp_path / "nope", data, out / "x.npy"], "nope: no such checkpoint directory"),
        (1, [ck, data, out / "exists.npy"], "exists.npy: exists; pass --overwrite"),
        (1, [ck, data, out / "x.csv"], "unknown output format '.csv'"),
        (1, [ck, data, out / "file" / "x.h5"], "no such directory for the output x.h5"),
        (1, [ck, data, out / "x.npy", "--model.hidden=8"],
         "only parallel.* keys can be set"),
    ]
    for n, (c, d, o, *extra), msg in cases:
        r = _plexgt(n, "predict", "--checkpoint", c, "--data", d, "--out", o, *extra)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and msg in lines[0], (msg, r.stderr)
        assert lines[0].startswith("plexgt predict: error: ")
        assert sorted(p.name for p in out.iterdir()) == ["exists.npy", "file"], msg
    assert (out / "exists.npy").read_text() == "mine"


def test_predict_grid_auto_takes_plan_inference_choice_where_training_does_not_fit(
        graph, gcn_ckpt, tmp_path):
    """At a memory per rank between what one forward and one training step of the checkpoint's
    model need on 2 ranks, ``plan`` refuses training (exit 1) and ``plan --inference`` chooses
    a grid; ``predict --grid auto`` on 2 ranks runs that grid and predicts what 1 rank does."""
    g, data = graph
    ck, _ = gcn_ckpt
    model = ["--model", "gcn", "--hidden", "16", "--layers", "3", "--dtype", "float64",
             "--world-size", "2", "--data", data]

    def plan(*extra: str) -> tuple[int, dict]:
        js = tmp_path / "plan.json"
        r = _plexgt(1, "plan", *model, "--json", js, *extra)
        assert r.returncode in (0, 1), r.stderr
        return r.returncode, json.loads(js.read_text())

    least = {}
    for mode in ((), ("--inference",)):
        rc, out = plan("--memory-per-rank", "0.001", *mode)
        assert rc == 1
        least[mode] = out["search"]["least_memory_bytes"]
    assert least[("--inference",)] < least[()]
    gib = repr((least[()] + least[("--inference",)]) / 2 / 2**30)
    assert plan("--memory-per-rank", gib)[0] == 1
    rc, out = plan("--memory-per-rank", gib, "--inference")
    assert rc == 0 and out["choice"]["scale"] == 2
    grid = out["choice"]["grid"]
    one = _predict(ck, data, tmp_path / "one.npy", 1)
    r = _plexgt(2, "predict", "--checkpoint", ck, "--data", data, "--out", tmp_path / "p.npy",
                "--grid", "auto", f"--parallel.memory_per_rank_gb={gib}")
    assert r.returncode == 0, r.stderr
    assert f"grid {grid}," in r.stderr, (grid, r.stderr)
    f = PredictionsFile(tmp_path / "p.npy")
    (_, cols), = list(f.chunks(f.columns, rows=f.n))
    _same(cols, one, ("node_id", "pred", "logits"))


@pytest.mark.parametrize("model", ["mlp", "sage"])
def test_grid3d_registry_models_predict_on_any_grid_as_on_one_rank(graph, model, tmp_path):
    """The grid3d registry's other models (mlp, sage) are not refused: trained on 1 rank,
    they predict on 3 ranks (3x1x1, 1x3x1) the 1-rank logits, classes and hidden embeddings,
    row i the raw input's node i."""
    g, data = graph
    ck, _ = _trained(data, tmp_path, 1, "--model", model, "--epochs", "2")
    one = _predict(ck, data, tmp_path / "one.parquet", 1, "--embeddings", "hidden")
    assert one["meta"]["model"] == model
    for grid in ("3x1x1", "1x3x1"):
        got = _predict(ck, data, tmp_path / f"{grid}.h5", 3, "--grid", grid,
                       "--embeddings", "hidden")
        _check_order_and_splits(got, g)
        _same(got, one, ("pred", "logits", "embedding"))
