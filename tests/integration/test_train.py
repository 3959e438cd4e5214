"""plexgt train end to end under mpiexec: metrics, checkpoints, exact resume, signals, faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from .conftest import job_env, mpiexec, prepared_sbm, run_job

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return prepared_sbm(tmp_path_factory.mktemp("train"), seed=1)


def _train(data: Path, n: int, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_job([mpiexec(), "-n", str(n), sys.executable, "-m", "plexgt", "train",
                    "--data", str(data), "--model", "gcn", "--model.hidden=16",
                    "--optim.warmup_epochs=2", *extra], timeout)


@contextmanager
def _job(cmd: list[str], **kw):
    """A background job in its own session, killed whole however the test ends."""
    proc = subprocess.Popen(cmd, text=True, env=job_env(), start_new_session=True, **kw)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _checkpoint(epoch_dir: Path, out: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's canonical state, read through DCP's own converter."""
    dcp_to_torch_save(epoch_dir, out)
    return torch.load(out, weights_only=False)


def _losses(path: Path) -> dict[int, float]:
    return {r["epoch"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def _one_rank_curve(data: Path, tmp_path: Path, n: int, common: list[str], layout: list[str]
                    ) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """Train on 1 rank and on n (with ``layout``); assert the loss curves agree (float64,
    1e-6) and fall. Returns both metrics files and the n-rank run."""
    one, many = tmp_path / "one.jsonl", tmp_path / "many.jsonl"
    r = _train(data, 1, *common, "--metrics", str(one))
    assert r.returncode == 0, r.stderr
    r = _train(data, n, *common, *layout, "--metrics", str(many))
    assert r.returncode == 0, r.stderr
    a, b = _losses(one), _losses(many)
    assert len(a) > 1 and list(a) == list(range(1, len(a) + 1)) and list(b) == list(a)
    for e in a:
        assert b[e] == pytest.approx(a[e], rel=1e-6, abs=1e-9), e
    assert a[len(a)] < a[1]
    return one, many, r


@pytest.mark.parametrize("model,n,layout", [
    ("gcn", 4, ["--grid", "2x2x1"]),
    ("gt", 3, ["--strategy", "gp_a2a", "--model.heads=2"]),
    ("sage", 3, ["--grid", "1x3x1"]),
    ("mlp", 2, ["--grid", "1x1x2"]),
])
def test_dropout_on_the_curve_of_any_layout_is_the_single_process_curve(data, tmp_path, model,
                                                                         n, layout):
    """Dropout 0.5 (the default) with counter-based masks: 1 rank and n ranks on another grid
    or strategy train the same float64 loss curve (they differed at the first epoch when each
    rank drew its own masks)."""
    heads = [a for a in layout if a.startswith("--model.heads")]
    common = ["--model", model, "--epochs", "20", "--dtype=float64", *heads]
    _, many, r = _one_rank_curve(data, tmp_path, n, common, layout)
    _assert_metrics_and_final_line(many, r, 20, layout[1] if layout[0] == "--grid" else
                                   f"rows{n}")


def _assert_metrics_and_final_line(metrics: Path, r: subprocess.CompletedProcess, epochs: int,
                                   grid: str) -> None:
    """An n-rank run's JSONL has every epoch with its timings, bytes, memory and layout; its
    last stdout line is the summary; rank 0 logged the resolved config on stderr."""
    rows = [json.loads(l) for l in metrics.read_text().splitlines()]
    assert [row["epoch"] for row in rows] == list(range(1, epochs + 1))
    need = {"epoch", "loss", "train_acc", "valid_acc", "test_acc", "time_compute",
            "time_comm", "time_wait", "bytes_comm", "peak_mem_bytes", "grid", "strategy"}
    assert need <= rows[-1].keys()
    assert rows[-1]["grid"] == grid and rows[-1]["bytes_comm"] > 0
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith(f"plexgt train: finished after epoch {epochs}; best validation epoch")
    assert "[model]" in r.stderr and "grid = " in r.stderr


@pytest.fixture(scope="module")
def multilabel_data(tmp_path_factory) -> Path:
    from plexgt.data.shard import PrepOptions, prepare
    from plexgt.data.source import MemorySource
    from plexgt.data.synthetic import sbm
    from tests.datagen import multilabel

    out = tmp_path_factory.mktemp("multilabel") / "ml"
    g = multilabel(sbm(num_nodes=400, num_edges=4000, num_classes=4, num_features=12, seed=2),
                   tasks=3)
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False))
    return out


@pytest.mark.parametrize("model,n,layout", [("gcn", 3, ["--grid", "1x3x1"])])
def test_multilabel_tasks_train_the_one_rank_curve(multilabel_data, tmp_path, model, n,
                                                   layout):
    """Three 0/1 tasks with unlabelled pairs: per-task binary cross-entropy on n ranks (the
    tasks split over the 3D grid's plane) follows the 1-rank float64 curve; the metric is the
    mean ROC-AUC over tasks, the best epoch chosen on it (node rows' loss and scores: the MPI
    tests, every strategy's path)."""
    heads = [a for a in layout if a.startswith("--model.heads")]
    common = ["--model", model, "--epochs", "15", "--dtype=float64", *heads]
    one, many, r = _one_rank_curve(multilabel_data, tmp_path, n, common, layout)
    rows = [json.loads(l) for l in many.read_text().splitlines()]
    assert "valid_rocauc" in rows[-1] and "valid_acc" not in rows[-1]
    assert {row["metric"] for row in rows} == {"rocauc"}
    assert rows[-1]["valid_rocauc"] > 0.6  # the tasks are the classes' bits: learnable
    ones = [json.loads(l) for l in one.read_text().splitlines()]
    for x, y in zip(rows, ones):
        assert x["valid_rocauc"] == pytest.approx(y["valid_rocauc"], rel=1e-6)
    assert "valid_rocauc=" in r.stdout.strip().splitlines()[-1]


def test_report_of_a_binary_run_shows_its_roc_auc(tmp_path):
    """A binary run selects its best epoch on ROC-AUC and writes accuracy beside it; each row
    records the selection metric, and plexgt report (evaluated every 2 epochs: half the rows
    have no metric) reports and plots that, where it reported accuracy."""
    from plexgt.data.shard import PrepOptions, prepare
    from plexgt.data.source import MemorySource
    from plexgt.data.synthetic import sbm

    data = tmp_path / "binary"
    g = sbm(num_nodes=300, num_edges=3000, num_classes=2, num_features=8, seed=4)
    prepare(MemorySource(g), PrepOptions(out=data, tiles=2, progress=False))
    m, png = tmp_path / "m.jsonl", tmp_path / "r.png"
    r = run_job([sys.executable, "-m", "plexgt", "train", "--data", str(data), "--model",
                 "gcn", "--model.hidden=8", "--epochs", "5", "--eval_every=2", "--metrics",
                 str(m)])
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in m.read_text().splitlines()]
    assert {row["metric"] for row in rows} == {"rocauc"}
    assert [row["epoch"] for row in rows if "valid_rocauc" in row] == [2, 4, 5]
    assert "valid_rocauc=" in r.stdout.strip().splitlines()[-1]
    rep = run_job([sys.executable, "-m", "plexgt", "report", str(m)]
                  + (["--out", str(png)] if _has_matplotlib() else []))
    assert rep.returncode == 0, rep.stderr
    assert "best valid_rocauc " in rep.stdout and "valid_acc" not in rep.stdout


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def test_featureless_graph_trains_a_node_embedding_on_the_one_rank_curve(tmp_path):
    """A graph with labels but no features: without an embedding a one-line error; with
    ``model.node_embedding`` gcn on 1x1x2 (the table's columns split over the grid) trains
    the 1-rank float64 curve and learns the communities."""
    from plexgt.data.graph import GraphData
    from plexgt.data.shard import PrepOptions, prepare
    from plexgt.data.source import MemorySource
    from plexgt.data.synthetic import sbm

    g = sbm(num_nodes=400, num_edges=4000, num_classes=4, num_features=1, seed=3)
    data = tmp_path / "bare"
    prepare(MemorySource(GraphData("bare", 400, g.src, g.dst, None, g.labels)),
            PrepOptions(out=data, tiles=2, progress=False))
    r = _train(data, 1, "--epochs", "2")
    assert r.returncode == 2 and "has no node features; train a node embedding" in r.stderr
    common = ["--epochs", "20", "--dtype=float64", "--model.node_embedding=8",
              "--model.dropout=0", "--optim.lr=0.05"]
    _, many, _ = _one_rank_curve(data, tmp_path, 2, common, ["--grid", "1x1x2"])
    last = json.loads(many.read_text().splitlines()[-1])
    assert last["train_acc"] > 0.5  # 4 classes: chance is 0.25


def test_sparse_features_train_the_dense_one_rank_curve(tmp_path):
    """Bag-of-words features prepped as CSR tiles (plexgt prep --sparse-features, gnn-benchmark
    npz in) train sparse on n ranks — gcn on 1x2x2 (layer 0 an SpMM on the gathered input),
    gt over GP-A2A's rows — the curve the dense prep trains on 1 rank (float64, dropout on)."""
    from plexgt.cli import main
    from plexgt.data.synthetic import sbm
    from tests.datagen import sparsified, write_gnn_benchmark

    g = sparsified(sbm(num_nodes=300, num_edges=3000, num_classes=4, num_features=60, seed=5),
                   density=0.05)
    src = write_gnn_benchmark(tmp_path / "bow.npz", g)
    for layout in ("yes", "no"):
        assert main(["prep", "--input", str(src), "--out", str(tmp_path / layout), "--quiet",
                     "--tiles", "2", "--sparse-features", layout]) == 0
    manifest = json.loads((tmp_path / "yes" / "manifest.json").read_text())
    assert manifest["feature_layout"] == "csr"
    for model, n, layout in (("gcn", 2, ["--grid", "1x1x2"]),):
        common = ["--model", model, "--epochs", "6", "--dtype=float64",
                  *[a for a in layout if a.startswith("--model.heads")]]
        one, many = tmp_path / f"{model}1.jsonl", tmp_path / f"{model}n.jsonl"
        r = _train(tmp_path / "no", 1, *common, "--metrics", str(one))
        assert r.returncode == 0, r.stderr
        r = _train(tmp_path / "yes", n, *common, *layout, "--metrics", str(many))
        assert r.returncode == 0, r.stderr
        a, b = _losses(one), _losses(many)
        assert list(b) == list(a) == list(range(1, 7))
        for e in a:
            assert b[e] == pytest.approx(a[e], rel=1e-6, abs=1e-9), (model, e)


def test_gps_trains_on_the_gcn_path_agp_chooses(data, tmp_path):
    """gps with grid 'auto': the GCN path (1D, or 3D on the planner's grid) and strategy AGP
    predicts fastest, named in the metrics; an explicit grid runs the 3D path as given."""
    from plexgt.data.loader import PreparedGraph
    from plexgt.plan.knobs import load_config
    from plexgt.tasks.task import run_plan

    for grid_arg in ("auto", "1x1x2"):
        cfg = load_config(None, None, [f"--data={data}", "--model.name=gps",
                                       "--model.hidden=16", f"--parallel.grid={grid_arg}"])
        sname, grid, _ = run_plan(cfg, PreparedGraph(data), 2).layout
        want = (str(grid), f"{sname}+plexus3d") if grid else ("rows2", sname)
        m = tmp_path / f"{grid_arg}.jsonl"
        r = _train(data, 2, "--model", "gps", "--grid", grid_arg, "--epochs", "3",
                   "--metrics", str(m))
        assert r.returncode == 0, r.stderr
        last = json.loads(m.read_text().splitlines()[-1])
        assert (last["grid"], last["strategy"]) == want and last["bytes_comm"] > 0


KILL_EPOCHS = 40  # killed once epoch 10's checkpoint is complete: 30 epochs to spare


def test_kill_and_resume_reproduces_the_loss_curve_exactly(data, tmp_path):
    """Two --deterministic gt runs on 2 ranks with dropout 0.5 (the default): one whole, one
    killed mid-epoch and resumed. Every epoch's loss and accuracies, the final parameters,
    optimizer moments and RNG are equal to the last bit, so two deterministic runs repeat
    each other too (they differed by 1-2 ulp in 14 of 60 epochs when dropout drew from
    torch's stream and MKL chose kernels by alignment; the 3D GCN's deterministic GEMM is
    tests/unit/test_device_audit.py's)."""
    full, part, ck = tmp_path / "full.jsonl", tmp_path / "part.jsonl", tmp_path / "c2"
    tb = tmp_path / "tb"
    common = ["--deterministic", "--model", "gt", "--model.heads=2", "--checkpoint-every", "5",
              "--epochs", str(KILL_EPOCHS)]
    r = _train(data, 2, "--metrics", str(full), "--checkpoint-dir", str(tmp_path / "c1"),
               *common)
    assert r.returncode == 0, r.stderr
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "plexgt", "train", "--data", str(data),
           "--model", "gcn", "--model.hidden=16", "--optim.warmup_epochs=2", "--metrics",
           str(part), "--checkpoint-dir", str(ck), "--tensorboard", str(tb), *common]
    with _job(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        deadline = time.time() + 120
        while time.time() < deadline and not (ck / "epoch_000010" / "COMPLETE").exists():
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the whole job, mid-epoch
        proc.wait(timeout=60)
    killed_after = len(part.read_text().splitlines())
    assert killed_after < KILL_EPOCHS, "the run finished before it could be killed"
    r = _train(data, 2, "--metrics", str(part), "--checkpoint-dir", str(ck), "--resume",
               "--tensorboard", str(tb), *common)
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stderr
    # the trajectory is exact (deterministic mode pins MKL's kernels): final parameters,
    # optimizer moments and RNG equal bit for bit
    a, b = (_checkpoint(d / f"epoch_{KILL_EPOCHS:06d}", tmp_path / f"{d.name}.pt")
            for d in (tmp_path / "c1", ck))
    assert sorted(a) == sorted(b) and any(k.startswith("optim/exp_avg/") for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _rows(part) == _rows(full)  # and every epoch's loss and accuracies, bit for bit
    _assert_tensorboard_curve(tb, _losses(full))


def _rows(path: Path) -> list[tuple]:
    keys = ("epoch", "loss", "train_acc", "valid_acc", "test_acc")
    return [tuple(r[k] for k in keys) for r in map(json.loads, path.read_text().splitlines())]


def _assert_tensorboard_curve(tb: Path, losses: dict[int, float]) -> None:
    """The TensorBoard curve of a killed and resumed run is the JSONL's: one point per epoch
    (the killed run's epochs past its checkpoint purged), float32 values."""
    acc = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    ea = acc.EventAccumulator(str(tb))
    ea.Reload()
    got = {s.step: s.value for s in ea.Scalars("loss/train")}
    assert sorted(got) == sorted(losses)
    assert all(got[e] == pytest.approx(losses[e], rel=1e-6) for e in losses)


def test_graph_transformer_checkpoints_resumes_stays_finished_and_extends(data, tmp_path):
    """gps (attention and the GCN path) writes checkpoints (graph transformers once died at
    the first save) and resumes from them; resuming a finished run changes nothing; a run
    given more epochs continues, and no epoch is logged twice (gt's checkpoints: the
    kill-and-resume and signal tests)."""
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    common = ["--model", "gps", "--model.heads=2", "--checkpoint-dir", str(ck),
              "--checkpoint-every", "1", "--metrics", str(m)]
    r = _train(data, 2, *common, "--epochs", "4", "--stop-after", "2")
    assert r.returncode == 0 and "stopped by stop_after after epoch 2" in r.stdout, r.stdout
    assert (ck / "epoch_000002" / "COMPLETE").exists()
    for _ in range(2):  # the second resume finds the run finished
        r = _train(data, 2, *common, "--epochs", "4", "--resume")
        assert r.returncode == 0, r.stderr
        assert "resumed from" in r.stderr and "finished after epoch 4" in r.stdout
    assert [json.loads(l)["epoch"] for l in m.read_text().splitlines()] == [1, 2, 3, 4]
    r = _train(data, 2, *common, "--epochs", "6", "--resume")  # extended: not refused
    assert r.returncode == 0 and "finished after epoch 6" in r.stdout, r.stderr
    assert [json.loads(l)["epoch"] for l in m.read_text().splitlines()] == list(range(1, 7))


EMBED = "--model.node_embedding=6"


@pytest.mark.parametrize("model,first,then,extra", [
    ("gcn", (4, ["--grid", "1x2x2"]), (3, ["--grid", "3x1x1"]), [EMBED]),
    ("sage", (4, ["--grid", "2x1x2"]), (3, ["--grid", "1x3x1"]), [EMBED]),
    ("gt", (3, ["--strategy", "gp_a2a"]), (2, ["--strategy", "gp_ag"]), [EMBED]),
])
def test_resume_on_another_layout_continues_the_curve(data, tmp_path, model, first, then,
                                                      extra):
    """Written by 4 ranks on 1x2x2 and resumed by 3 on 3x1x1 (gcn), or by 3 ranks with GP-A2A
    and resumed by 2 with GP-AG (gt): the loss curve continues the uninterrupted one (float64,
    dropout on, the checkpoint's weights are canonical). Both carry a node embedding, whose
    table is sharded in the checkpoint (rows, and on 1x2x2 columns, per rank) and resharded on
    resume. sage (2x1x2 -> 1x3x1) checkpoints the shards of both its weights per layer.
    perf/bench_resume.py runs 8 -> 4 ranks, 2x2x2 -> 4x1x1."""
    ck, m, ref = tmp_path / "ck", tmp_path / "m.jsonl", tmp_path / "ref.jsonl"
    common = ["--model", model, "--model.heads=2", "--epochs", "8", "--dtype=float64", *extra]
    r = _train(data, 1, *common, "--metrics", str(ref))
    assert r.returncode == 0, r.stderr
    (n1, lay1), (n2, lay2) = first, then
    r = _train(data, n1, *common, *lay1, "--metrics", str(m), "--checkpoint-dir", str(ck),
               "--stop-after", "4")
    assert r.returncode == 0, r.stderr
    r = _train(data, n2, *common, *lay2, "--metrics", str(m), "--checkpoint-dir", str(ck),
               "--resume")
    assert r.returncode == 0, r.stderr
    assert f"resumed from {ck}/epoch_000004 (epoch 4, written by {n1} ranks" in r.stderr
    got, want = _losses(m), _losses(ref)
    assert list(got) == list(want) == list(range(1, 9))
    for e in want:
        assert got[e] == pytest.approx(want[e], rel=1e-6, abs=1e-9), e
    rows = [json.loads(l) for l in m.read_text().splitlines()]
    assert {r["ranks"] for r in rows[:4]} == {n1} and {r["ranks"] for r in rows[4:]} == {n2}


OPTIONS = {"gcn": ["--model.norm=batch", "--model.residual=linear", "--model.input_proj=true",
                   "--model.head=true", "--model.jk=cat", "--optim.name=adam",
                   "--optim.decay=weights", "--optim.clip_norm=0.5"],
           "gt": ["--model.norm=batch", "--model.pre_norm=true", "--model.jk=max"]}


@pytest.mark.parametrize("model,first,then", [
    ("gcn", (4, ["--grid", "1x2x2"]), (3, ["--grid", "3x1x1"])),
    ("gt", (3, ["--strategy", "gp_a2a"]), (2, ["--strategy", "gp_ring"])),
])
def test_model_options_resume_on_another_layout_with_their_running_statistics(
        data, tmp_path, model, first, then):
    """BatchNorm, residuals, input and output Linears and jumping knowledge (gcn: with Adam,
    weight decay on weights only, in two parameter groups, and global clipping) through a
    checkpoint on one layout and a resume on another: the loss curve and the final state,
    BatchNorm's running statistics and the moments included (checkpointed beside the
    parameters, canonical like them), equal the uninterrupted 1-rank run's."""
    ck, m, ref, ck1 = tmp_path / "ck", tmp_path / "m.jsonl", tmp_path / "ref.jsonl", \
        tmp_path / "ck1"
    common = ["--model", model, "--model.heads=2", "--epochs", "6", "--dtype=float64",
              *OPTIONS[model]]
    r = _train(data, 1, *common, "--metrics", str(ref), "--checkpoint-dir", str(ck1))
    assert r.returncode == 0, r.stderr
    (n1, lay1), (n2, lay2) = first, then
    r = _train(data, n1, *common, *lay1, "--metrics", str(m), "--checkpoint-dir", str(ck),
               "--stop-after", "3")
    assert r.returncode == 0, r.stderr
    r = _train(data, n2, *common, *lay2, "--metrics", str(m), "--checkpoint-dir", str(ck),
               "--resume")
    assert r.returncode == 0, r.stderr
    got, want = _losses(m), _losses(ref)
    assert list(got) == list(want) == list(range(1, 7))
    for e in want:
        assert got[e] == pytest.approx(want[e], rel=1e-6, abs=1e-9), e
    a = _checkpoint(ck / "epoch_000006", tmp_path / "a.pt")
    b = _checkpoint(ck1 / "epoch_000006", tmp_path / "b.pt")
    stats = [k for k in b if "running_" in k]
    assert stats and sorted(k for k in a if k.startswith("model/")) == sorted(
        k for k in b if k.startswith("model/"))
    for k in b:
        if k.startswith(("model/", "optim/")):
            torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-9, msg=k)


def _runs(ck: Path) -> dict[int, str]:
    """{epoch: run id} of the complete checkpoints in ``ck``."""
    return {int(d.name[6:]): json.loads((d / "COMPLETE").read_text())["run"]
            for d in sorted(ck.glob("epoch_*")) if (d / "COMPLETE").exists()}


def test_a_fresh_run_refuses_another_runs_checkpoints_and_a_resumed_run_keeps_its_id(
        data, tmp_path):
    """A fresh run into a directory with complete checkpoints is refused in one line (it
    once pruned its own new checkpoints there and --resume continued the old run); a resumed
    run writes under the id of the run it continues and prunes that run's older ones."""
    ck = tmp_path / "ck"
    every = ["--checkpoint-dir", str(ck), "--checkpoint-every", "1"]
    r = _train(data, 1, "--epochs", "3", *every)
    assert r.returncode == 0, r.stderr
    first = _runs(ck)
    assert list(first) == [2, 3] and len(set(first.values())) == 1
    r = _train(data, 1, "--epochs", "2", *every)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"plexgt train: error: {ck}: holds another run's complete checkpoints (the newest "
        "epoch_000003); pass --resume to continue it or use another --checkpoint-dir")
    assert _runs(ck) == first
    r = _train(data, 1, "--epochs", "5", *every, "--resume")
    assert r.returncode == 0, r.stderr
    assert _runs(ck) == {4: first[3], 5: first[3]}


def test_resume_on_another_dataset_is_refused_and_on_a_reprep_of_the_same_continues(
        data, tmp_path):
    """A checkpoint of one SBM graph resumed on another of the same F and C trained on
    silently; the same input re-prepped with another permutation still resumes."""
    from plexgt.data.shard import PrepOptions, prepare
    from plexgt.data.source import MemorySource
    from plexgt.data.synthetic import sbm

    ck = tmp_path / "ck"
    r = _train(data, 1, "--epochs", "4", "--stop-after", "2", "--checkpoint-dir", str(ck))
    assert r.returncode == 0, r.stderr
    other = prepared_sbm(tmp_path / "other", seed=2)
    r = _train(other, 1, "--epochs", "4", "--checkpoint-dir", str(ck), "--resume")
    assert r.returncode == 2
    name = json.loads((data / "manifest.json").read_text())["name"]
    assert r.stderr.strip().splitlines()[-1] == (
        f"plexgt train: error: {ck}/epoch_000002: trained on {data} ({name}), this run's "
        f"data is {other} ({name.replace('seed=1', 'seed=2')}); resume on the dataset it was "
        "trained on")
    again = tmp_path / "again"
    g = sbm(num_nodes=600, num_edges=6000, num_classes=4, num_features=16, seed=1)
    prepare(MemorySource(g), PrepOptions(out=again, tiles=2, progress=False, seed=5))
    r = _train(again, 1, "--epochs", "4", "--checkpoint-dir", str(ck), "--resume")
    assert r.returncode == 0 and "finished after epoch 4" in r.stdout, r.stderr


def test_a_stopped_run_says_what_it_wrote(data, tmp_path):
    """Stopped (stop_after here; SIGTERM and SIGUSR1 take the same path) without a
    checkpoint directory, a run said "checkpoint written; continue with --resume"."""
    cmd = [sys.executable, "-m", "plexgt", "train", "--data", str(data), "--model", "gcn",
           "--model.hidden=16", "--epochs", "4", "--stop-after", "2"]
    r = run_job(cmd)
    assert r.returncode == 0, r.stderr
    assert "plexgt train: stopped by stop_after after epoch 2; no checkpoint written (no " \
           "--checkpoint-dir): a new run starts from epoch 0" in r.stderr.splitlines()
    assert "checkpoint written" not in r.stderr.replace("no checkpoint written", "")
    ck = tmp_path / "ck"
    r = run_job([*cmd, "--checkpoint-dir", str(ck)])
    assert r.returncode == 0, r.stderr
    assert (f"plexgt train: stopped by stop_after after epoch 2; checkpoint {ck}/epoch_000002 "
            "written; continue with --resume") in r.stderr.splitlines()
    assert (ck / "epoch_000002" / "COMPLETE").exists()


def test_a_stop_at_the_last_epoch_ends_a_finished_run(data, tmp_path):
    """stop_after (or a signal) at the last epoch: the run is finished, so no STOPPED for
    the job script to requeue on and no 'continue with --resume'; the last line names the
    checkpoint the end wrote. Before, it said 'stopped by stop_after ... continue with
    --resume' and left STOPPED (a requeue that trained nothing)."""
    ck = tmp_path / "ck"
    r = run_job([sys.executable, "-m", "plexgt", "train", "--data", str(data), "--model",
                 "gcn", "--model.hidden=16", "--epochs", "2", "--stop-after", "2",
                 "--checkpoint-dir", str(ck)])
    assert r.returncode == 0, r.stderr
    assert "continue with --resume" not in r.stderr and not (ck / "STOPPED").exists()
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("plexgt train: finished after epoch 2; best validation epoch ")
    assert last.endswith(f"; checkpoint {ck}/epoch_000002 written")


def test_sigterm_without_a_checkpoint_dir_says_nothing_was_written(data, tmp_path):
    """SIGTERM (the path SIGUSR1 and stop_after share) on a run without --checkpoint-dir:
    the stop line says no checkpoint was written and the last line names none."""
    m = tmp_path / "m.jsonl"
    cmd = [sys.executable, "-m", "plexgt", "train", "--data", str(data), "--model", "gcn",
           "--model.hidden=16", "--epochs", "100000", "--metrics", str(m), "--eval_every=7"]
    with _job(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        deadline = time.time() + 120
        while time.time() < deadline and not (m.exists() and len(m.read_text().splitlines()) > 2):
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    stopped = [l for l in err.splitlines() if l.startswith("plexgt train: stopped by signal")]
    assert len(stopped) == 1 and stopped[0].endswith(
        "; no checkpoint written (no --checkpoint-dir): a new run starts from epoch 0")
    last = out.strip().splitlines()[-1]
    assert last.startswith("plexgt train: stopped by signal 15 after epoch ")
    assert "written" not in last


def test_sigusr1_checkpoints_and_stops_then_resume_finishes(data, tmp_path):
    ck, m = tmp_path / "c", tmp_path / "m.jsonl"
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "plexgt", "train", "--data", str(data),
           "--model", "gt", "--model.heads=2", "--epochs", "100000", "--checkpoint-dir",
           str(ck), "--metrics", str(m), "--model.hidden=16", "--optim.warmup_epochs=2"]
    with _job(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        deadline = time.time() + 120
        while time.time() < deadline and not (m.exists() and len(m.read_text().splitlines()) > 3):
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGUSR1)  # hydra forwards SIGUSR1 to every rank
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "stopped by signal 10" in err
    stopped_at = int((ck / "STOPPED").read_text())
    assert (ck / f"epoch_{stopped_at:06d}" / "COMPLETE").exists()
    r = _train(data, 2, "--model", "gt", "--model.heads=2", "--epochs", "100000",
               "--checkpoint-dir", str(ck), "--metrics", str(m), "--resume", "--stop-after",
               str(stopped_at + 2))
    assert r.returncode == 0, r.stderr
    assert max(_losses(m)) == stopped_at + 2
    assert int((ck / "STOPPED").read_text()) == stopped_at + 2  # stopped again, by stop_after


def _descendants(pid: int, name: str) -> list[int]:
    """Processes under ``pid`` (any depth: mpiexec -> proxy -> ranks) whose name has ``name``."""
    out, todo = [], [pid]
    while todo:
        kids = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True)
        for k in map(int, kids.stdout.split()):
            todo.append(k)
            if name in Path(f"/proc/{k}/comm").read_text():
                out.append(k)
    return sorted(out)


def test_sigkill_of_one_rank_ends_the_job(data, tmp_path):
    m = tmp_path / "m.jsonl"
    cmd = [mpiexec(), "-n", "3", sys.executable, "-m", "plexgt", "train", "--data", str(data),
           "--model", "gcn", "--epochs", "100000", "--metrics", str(m), "--model.hidden=16",
           "--parallel.timeout_s=30"]
    with _job(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        deadline = time.time() + 120
        while time.time() < deadline and not (m.exists() and len(m.read_text().splitlines()) > 2):
            time.sleep(0.5)
        pids = _descendants(proc.pid, "python")
        assert len(pids) == 3, f"expected 3 ranks under mpiexec, found {pids}"
        os.kill(pids[-1], signal.SIGKILL)
        t0 = time.time()
        proc.communicate(timeout=90)
    assert proc.returncode != 0
    assert time.time() - t0 < 60


def test_bad_config_is_one_line_error(data, tmp_path):
    r = run_job([sys.executable, "-m", "plexgt", "train", "--data", str(data), "--model", "gcn",
                 "--model.hiden=3"])
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "plexgt train: error: unknown config key 'model.hiden'")
    # (a bad value in a TOML file: tests/unit/test_config.py; a grid that is not the world's,
    # on every rank: test_faults.py)
