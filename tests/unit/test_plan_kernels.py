"""Kernels priced at the size each rank runs: the SpMM's per-call / per-row / per-nonzero fit,
the partition's busiest block (:mod:`plexgt.plan.balance`), and profiles without them."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from plexgt.distributed.grid import Grid3D
from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.agp import SystemModel, Workload, estimate
from plexgt.plan.balance import DEFAULT_IMBALANCE, Balance
from plexgt.plan.plexus_cost import Coefficients, rank_cost
from plexgt.plan.profile import check_profile, fit_spmm, profile_notes

PROFILE = Path(__file__).parents[2] / "perf" / "results" / "validate_plan_system.json"


def test_spmm_fit_recovers_known_coefficients():
    """Synthetic timings t = call + row·rows·d + nnz·nnz·d on the profile's kinds of
    pattern (tiny, 1-2 nonzeros a row, dense): the three coefficients come back."""
    call, row, nnz = 2e-5, 1.5e-9, 4e-9
    shapes = [(256, 1024), (32768, 65536), (65536, 65536), (8192, 16384), (2000, 16000),
              (8000, 128000), (3000, 768000)]
    samples = [[e, d, call + row * r * d + nnz * e * d, r] for r, e in shapes for d in (16, 64)]
    got = fit_spmm(samples)
    assert got["spmm_s_per_call"] == pytest.approx(call, rel=1e-6)
    assert got["spmm_s_per_row_col"] == pytest.approx(row, rel=1e-6)
    assert got["spmm_s_per_nnz_col"] == pytest.approx(nnz, rel=1e-6)


def test_spmm_samples_without_rows_fit_per_nonzero_only():
    got = fit_spmm([[1000, 16, 1000 * 16 * 3e-9], [4000, 64, 4000 * 64 * 3e-9]])
    assert got == {"spmm_s_per_call": 0.0, "spmm_s_per_row_col": 0.0,
                   "spmm_s_per_nnz_col": pytest.approx(3e-9)}


def _skewed(n: int = 100) -> Balance:
    # 2 x 2 cells of 50 nodes: the first row (and column) of blocks holds 3x the second's
    c = np.array([[30.0, 0.0], [0.0, 10.0]])
    return Balance(n, {"A1": c, "A2": c}, "test")


def test_imbalance_is_the_fullest_block_over_the_mean():
    b = _skewed()
    assert b.imbalance("A1", 2, 1) == pytest.approx(30 / 20)
    assert b.imbalance("A1", 1, 2) == pytest.approx(30 / 20)
    assert b.imbalance("A1", 2, 2) == pytest.approx(30 / 10)
    assert b.imbalance("A1", 1, 1) == 1.0
    # 4 row blocks of 25 nodes: each cell's nonzeros spread evenly over its 50 rows
    assert b.imbalance("A1", 4, 1) == pytest.approx(15 / 10)
    assert Balance().imbalance("A1", 4, 2) == DEFAULT_IMBALANCE and not Balance().known


def test_an_imbalanced_grid_is_priced_at_its_busiest_block():
    """A 3D GCN on 1x1x2 with all compute in the SpMM: layer 0's blocks are A1's two row
    blocks, layer 1's A2's two column blocks; 3/4 of the nonzeros in one block each time, so
    the step costs 1.5x the evenly spread one (max over ranks, not the mean)."""
    coef = Coefficients(spmm_s_per_nnz_col=1e-9, gemm_s_per_fma=0.0)
    even = Balance(100, {k: np.array([[20.0, 0.0], [0.0, 20.0]]) for k in ("A1", "A2")})
    args = (Grid3D(1, 1, 2), 0, 100, 4000, [16, 16, 4], 4, coef)
    flat = rank_cost(*args, balance=even).compute_s
    skew = rank_cost(*args, balance=_skewed()).compute_s
    assert flat > 0 and skew == pytest.approx(1.5 * flat)
    assert rank_cost(*args).compute_s == pytest.approx(flat)  # the default: even



@pytest.mark.parametrize("mode", [{"inference": True}, {"checkpoint": True}])
def test_forward_pricing_pays_the_busiest_block_and_the_spmm_fixed_terms(mode):
    """Inference (one forward) and checkpointing (one forward more) price the busiest block
    as training does (1.5x the even split in compute; its CSR block in memory), and the
    forward they add or keep carries its SpMMs' per-call and per-row terms: the checkpointed
    step is the plain one plus exactly the inference forward."""
    coef = Coefficients(spmm_s_per_nnz_col=1e-9, gemm_s_per_fma=0.0)
    even = Balance(100, {k: np.array([[20.0, 0.0], [0.0, 20.0]]) for k in ("A1", "A2")})
    args = (Grid3D(1, 1, 2), 0, 100, 4000, [16, 16, 4], 4, coef)
    flat, skew = rank_cost(*args, balance=even, **mode), rank_cost(*args, balance=_skewed(),
                                                                   **mode)
    assert flat.compute_s > 0 and skew.compute_s == pytest.approx(1.5 * flat.compute_s)
    assert skew.mem > flat.mem
    fixed = replace(coef, spmm_s_per_call=1e-3, spmm_s_per_row_col=1e-7)
    args = (Grid3D(1, 1, 2), 0, 100, 4000, [16, 16, 4], 4, fixed)
    plain, ck, inf = (rank_cost(*args, balance=even, **kw).compute_s
                      for kw in ({}, {"checkpoint": True}, {"inference": True}))
    assert inf > 2e-3  # two layers' forward SpMM calls at least
    assert ck - plain == pytest.approx(inf)

def test_a_node_partitioned_strategy_pays_its_fullest_row_block():
    """GP-AG's rank holds one of s row blocks (all their columns): its edge work grows with
    the imbalance; GP-A2A's ranks hold every edge (heads split): unchanged."""
    reg = default_registry()
    w = Workload("gt", 100, 4000, 16, 4, hidden=16, heads=4)
    wb = replace(w, balance=_skewed())
    sysm = SystemModel()
    ag, a2a = reg.get("gp_ag"), reg.get("gp_a2a")
    assert estimate(ag, wb, 2, sysm).compute_s > 1.2 * estimate(ag, w, 2, sysm).compute_s
    assert estimate(a2a, wb, 2, sysm).compute_s == pytest.approx(
        estimate(a2a, w, 2, sysm).compute_s)


def test_a_manifest_without_counts_falls_back_to_the_default():
    assert not Balance.from_manifest({"N": 10, "tile_nnz": {"A1": [[5]], "A2": [[5]]}}).known
    tiles = Balance.from_manifest({"N": 20, "tile_size": 10,
                                   "tile_nnz": {"A1": [[9, 1], [0, 10]],
                                                "A2": [[10, 0], [0, 10]]}})
    assert tiles.known and tiles.imbalance("A1", 1, 2) == pytest.approx(11 / 10)


def test_a_profile_without_the_new_fits_loads_with_a_note():
    """A profile as versions before the SpMM's per-call and per-row terms wrote it (SpMM
    samples without rows, four 'plexus' coefficients), made from the stored one: it loads,
    SpMM is priced per nonzero as it was, and the notes say so; the stored one fits them."""
    new = check_profile(json.loads(PROFILE.read_text()), "new")
    assert all(len(r) == 4 for r in new["kernels"]["spmm"])
    assert not any("SpMM" in n for n in profile_notes(new))
    assert Coefficients.from_profile(new).spmm_s_per_row_col > 0
    old = copy.deepcopy(new)
    old["kernels"]["spmm"] = [r[:3] for r in new["kernels"]["spmm"]]
    for k in ("spmm_s_per_call", "spmm_s_per_row_col"):
        del old["plexus"][k], old["kernel_fits"][k]
    old = check_profile(old, "old")
    coef = Coefficients.from_profile(old)
    assert coef.spmm_s_per_call == 0.0 and coef.spmm_s_per_row_col == 0.0
    assert coef.spmm_s_per_nnz_col == old["plexus"]["spmm_s_per_nnz_col"]
    sysm = SystemModel.from_profile(old)
    assert sysm.kernels["spmm_s_per_row_col"] == 0.0 and sysm.kernels["spmm_s_per_nnz_col"] > 0
    assert any("SpMM" in n for n in profile_notes(old))


def test_profile_has_the_compiled_kernels_before_it_times_anything(monkeypatch):
    """A build of the CPU extension inside the measurements holds a core for a minute (one
    made a profile measure 2 threads 0.11x as fast as 1): run_profile loads it first. Fails
    without the load at its start (the samples came first)."""
    from types import SimpleNamespace

    import torch

    from plexgt.plan import measure

    calls: list[str] = []

    class Stop(Exception):
        pass

    def samples(*args, **kwargs):
        calls.append("samples")
        raise Stop

    monkeypatch.setattr(measure.native, "load", lambda *a, **k: calls.append("load"))
    monkeypatch.setattr(measure, "kernel_samples", samples)
    ctx = SimpleNamespace(device=torch.device("cpu"), world_size=1, rank=0, local_size=1,
                          backend="gloo")
    with pytest.raises(Stop):
        measure.run_profile(ctx, quick=True)
    assert calls == ["load", "samples"]
