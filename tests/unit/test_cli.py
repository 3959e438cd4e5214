"""The plexgt command line in one process."""

import os
import subprocess
import sys
import types

import pytest
import torch.distributed as dist

from plexgt import cli
from plexgt.cli import main
from plexgt.errors import ConfigError, PeerFailed, mark_agreed


def test_info_dry_run_plans_without_mpi(capsys):
    assert main(["info", "--dry-run", "--world-size", "64", "--grid", "4x4x4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("grid 4x4x4: 64 ranks")
    assert len(out) == 65
    assert out[1].startswith("rank    0 (x=0, y=0, z=0)  X=[0, 4, 8, 12] Y=[0, 1, 2, 3]")
    assert "Z=[0, 16, 32, 48]" in out[1]


def test_bad_grid_is_one_line_error_exit_2(capsys):
    assert main(["info", "--dry-run", "--world-size", "8", "--grid", "2x2x1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "gx=2 * gy=2 * gz=1 = 4 ranks, but the world size is 8" in err[0]
    assert main(["info", "--dry-run", "--world-size", "8", "--grid", "2by4"]) == 2
    assert main(["info", "--dry-run", "--grid", "2x2x2"]) == 2


def test_python_dash_m_plexgt_is_the_same_cli():
    r = subprocess.run([sys.executable, "-m", "plexgt", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "info" in r.stdout


@pytest.mark.parametrize("failure", ["this rank's", "a peer's"])
def test_an_agreed_error_ends_the_rank_with_no_process_group_left(monkeypatch, capsys, failure):
    """Every rank of a job that agreed on an error destroys its group before exiting: left to
    the interpreter's exit, gloo's threads sometimes end the rank by std::terminate (a job
    status of 6 or 15 instead of 2)."""
    if dist.is_initialized():
        pytest.skip("this test process already holds a process group")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    def run(args: object) -> int:  # a command failing after its group exists
        if failure == "a peer's":
            raise PeerFailed("rank 1 failed")
        err = ConfigError("grid 2x2x1 does not fit")
        mark_agreed(err, 0)
        raise err

    fake = types.SimpleNamespace(add_arguments=lambda parser: None, run=run)
    monkeypatch.setattr(cli, "_module", lambda name: fake)
    try:
        assert main(["train"]) == 2
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert capsys.readouterr().err.count("error:") == (failure == "this rank's")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """A small class-labelled graph and a multi-label one, prepared."""
    from plexgt.data.shard import PrepOptions, prepare
    from plexgt.data.source import MemorySource
    from plexgt.data.synthetic import sbm
    from tests.datagen import multilabel

    root = tmp_path_factory.mktemp("cli")
    g = sbm(num_nodes=300, num_edges=3000, num_classes=4, num_features=8, seed=1)
    prepare(MemorySource(g), PrepOptions(out=root / "sbm", progress=False))
    prepare(MemorySource(multilabel(g, tasks=3)), PrepOptions(out=root / "ml", progress=False))
    return root


def _train_one_process(cwd, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PLEXGT_NO_MPI": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "plexgt", "train", "--model.hidden=16",
                           "--epochs", "1", "--progress=false", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("data,argv,msg", [
    ("ml", ["--model", "gcn", "--metric=accuracy"],
     "config key 'metric': {path}: metric accuracy needs class labels; the graph has 3 "
     "multi-label tasks (use rocauc)"),
    ("sbm", ["--model", "gcn", "--model.node_embedding=100000000"],
     "config key 'model.node_embedding': 100000000 needs at least 480,000,000,000 bytes"),
    ("sbm", ["--model", "gt", "--model.super_nodes=1000000000"],
     "config key 'model.super_nodes': 1000000000 needs at least 2,656,000,000,000 bytes"),
])
def test_train_refuses_what_it_would_ignore_or_could_not_hold(graphs, tmp_path, data, argv,
                                                              msg):
    """--metric=accuracy was taken for an abbreviation of --metrics (a metrics file named
    'accuracy', ROC-AUC reported as ever); 10⁸-10⁹ table rows ended in a MemoryError
    traceback. Each is one line naming the key, exit 2, nothing written."""
    path = graphs / data
    r = _train_one_process(tmp_path, "--data", str(path), *argv)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert err[0].startswith("plexgt train: error: " + msg.format(path=path)), err[0]
    assert list(tmp_path.iterdir()) == []
