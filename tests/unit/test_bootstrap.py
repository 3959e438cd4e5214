"""Bootstrap for real nodes: GPU choice and binding checks, per-rank group creation, numerics."""

import os

import pytest
import torch

from plexgt.distributed import collectives
from plexgt.distributed import grid as grid_mod
from plexgt.distributed.bootstrap import check_distinct_gpus, pick_gpu
from plexgt.distributed.grid import build_groups, parse_grid
from plexgt.errors import DeviceError
from plexgt.plan.knobs import load_config
from plexgt.training.numerics import CUBLAS_WORKSPACE, apply_numerics


def test_pick_gpu():
    assert [pick_gpu(i, 4, 4) for i in range(4)] == [0, 1, 2, 3]  # Perlmutter: 4 per node
    assert [pick_gpu(i, 8, 1) for i in range(8)] == [0] * 8  # srun --gpus-per-task=1
    assert pick_gpu(2, 3, 8) == 2  # fewer ranks than GPUs: the first ones are used
    with pytest.raises(DeviceError, match=r"node nid001: 8 ranks but 4 visible GPUs"):
        pick_gpu(5, 8, 4, "nid001")
    with pytest.raises(DeviceError, match="sees no GPU"):
        pick_gpu(0, 1, 0)
    # Perlmutter: rank i's cores are in NUMA domain i, nearest to GPU 3 - i
    assert [pick_gpu(i, 4, 4, gpu_map="3,2,1,0") for i in range(4)] == [3, 2, 1, 0]
    with pytest.raises(DeviceError, match="does not give each of 4 ranks"):
        pick_gpu(0, 4, 4, gpu_map="3,2,1")
    with pytest.raises(DeviceError, match="not a comma-separated list"):
        pick_gpu(0, 4, 4, gpu_map="a,b")


def test_two_ranks_on_one_gpu_is_an_error():
    check_distinct_gpus(["GPU-a", "GPU-b", "GPU-c", "GPU-d"])
    with pytest.raises(DeviceError, match=r"node n1: local ranks 0 and 2 were given the same "
                                          r"GPU GPU-a"):
        check_distinct_gpus(["GPU-a", "GPU-b", "GPU-a"], "n1")


@pytest.mark.parametrize("bound", [True, False])
def test_groups_cost_six_splits_per_rank_at_any_size_on_a_device(monkeypatch, bound):
    """At P = 2048 bound to a device (NCCL) a rank creates its own 3 axis and 3 plane groups,
    each synchronised among its members only: six splits of the world, instead of one per
    group of the grid, P/Gx + P/Gy + P/Gz + Gx + Gy + Gz = 688. On gloo it creates all 688,
    globally synchronised (a non-member's call returns at once), so that the groups' names
    agree whatever groups came before."""
    calls = []

    def fake_new_group(ranks, **kw):
        calls.append((tuple(ranks), kw))
        return ("group", tuple(ranks))

    monkeypatch.setattr(collectives, "world_bound_to_device", lambda: bound)
    monkeypatch.setattr(grid_mod.dist, "new_group", fake_new_group)
    monkeypatch.setattr(grid_mod.dist, "group", type("G", (), {"WORLD": "world"}))
    g = parse_grid("16x16x8")
    gg = build_groups(g, 1234, 2048)
    if bound:
        assert len(calls) == 6
        assert all(kw["use_local_synchronization"] for _, kw in calls)
        assert all(1234 in ranks for ranks, _ in calls)
    else:
        assert len(calls) == 2048 // 16 + 2048 // 16 + 2048 // 8 + 16 + 16 + 8
        assert not any(kw.get("use_local_synchronization") for _, kw in calls)
    assert {a: len(gg.axis[a][1]) for a in "xyz"} == {"x": 16, "y": 16, "z": 8}
    assert sorted(len(gg.plane[p][1]) for p in ("xy", "yz", "zx")) == [128, 128, 256]


@pytest.fixture
def numerics_env_unset(monkeypatch):
    """No user setting of the numerics variables to start from (tests/conftest.py puts them
    and torch's switches back after the test)."""
    for k in ("CUBLAS_WORKSPACE_CONFIG", "MKL_CBWR"):
        monkeypatch.delenv(k, raising=False)


def test_deterministic_numerics(numerics_env_unset):
    got = apply_numerics(load_config(None, {"deterministic": True, "tf32": True}))
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    assert torch.are_deterministic_algorithms_enabled()
    assert got["tf32"] is False and torch.backends.cuda.matmul.allow_tf32 is False


def test_tf32_is_an_option(numerics_env_unset, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # a user's own setting wins
    assert apply_numerics(load_config(None, {"tf32": True}))["tf32"] is True
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert apply_numerics(load_config(None, {"deterministic": True}))[
        "CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert apply_numerics(load_config(None, {}))["tf32"] is False


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ledger_times_the_stream_not_the_launch():
    """On a GPU the ledger's seconds come from CUDA events: a 50 ms device-side sleep inside a
    timed region counts once the work is done, though its launch returns at once."""
    from plexgt.distributed.collectives import CommLedger

    ledger = CommLedger(device=torch.device("cuda"))
    with ledger.timed():
        torch.cuda._sleep(50_000_000)  # cycles: tens of ms on any current GPU
    torch.cuda.synchronize()
    assert ledger.settle() > 0.005


def test_nccl_without_a_gpu_is_one_line(tmp_path):
    """plexgt train --backend nccl on a machine with no GPU ended in a ValueError traceback
    (exit 1); it is the one-line DeviceError, exit 2."""
    import subprocess
    import sys

    env = {**__import__("os").environ, "PLEXGT_NO_MPI": "1", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-m", "plexgt", "train", "--data", str(tmp_path),
                        "--backend", "nccl"], capture_output=True, text=True, timeout=120,
                       env=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "backend nccl requested but no GPU is visible" in lines[0]
