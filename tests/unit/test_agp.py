"""AGP cost and memory models (Table 1 of Lin et al.) and the Algorithm 3 selection, no MPI."""

from __future__ import annotations

import math

import pytest
import torch

from plexgt.models.gps import GPS
from plexgt.models.gt import GraphTransformer
from plexgt.parallel.agp import SystemModel, Workload, count_params, estimate, plan, scales_for
from plexgt.parallel.attention_cost import gp_a2a_memory, gp_ag_memory, step_bytes, table1
from plexgt.parallel.plexus_cost import Coefficients
from plexgt.parallel.strategies import (
    AttentionProblem,
    AttentionStrategy,
    StrategyRegistry,
    default_registry,
    head_splits,
)


@pytest.mark.parametrize("model", ["gt", "gps"])
def test_parameter_count_matches_the_modules(model):
    cls = GraphTransformer if model == "gt" else GPS
    m = cls(37, 16, 5, num_layers=3, heads=4, ffn_mult=3)
    assert count_params(model, 37, 16, 5, 3, 3) == sum(p.numel() for p in m.parameters())


def test_head_splits_balanced_and_complete():
    assert head_splits(4, 3) == (2, 1, 1)
    assert head_splits(4, 8) == (1, 1, 1, 1, 0, 0, 0, 0)
    assert head_splits(8, 4) == (2, 2, 2, 2)
    for h in range(1, 9):
        for p in range(1, 10):
            hs = head_splits(h, p)
            assert sum(hs) == h and max(hs) - min(hs) <= 1


@pytest.mark.parametrize("p", [2, 4, 8])
def test_table1_bytes_when_p_divides_everything(p):
    prob = AttentionProblem(n=64 * p, e=1000 * p, d=32, heads=8, esize=4)
    reg = default_registry()
    ag = reg.get("gp_ag").comm(prob, 0, p)
    a2a = reg.get("gp_a2a").comm(prob, 1, p)
    assert [o.op for o in ag] == ["all_gather"] * 2 + ["reduce_scatter"] * 2
    assert len(a2a) == 8 and {o.op for o in a2a} == {"all_to_all"}
    t1 = table1(prob, p)
    frac = (p - 1) / p  # ring collectives move (p-1)/p of the paper's N·d
    assert sum(o.sent for o in ag) == t1["gp_ag"]["comm_elems"] * frac * prob.esize
    assert sum(o.sent for o in a2a) == t1["gp_a2a"]["comm_elems"] * frac * prob.esize
    assert gp_ag_memory(prob, p).activation_elems == t1["gp_ag"]["act_elems"]
    assert gp_a2a_memory(prob, p).activation_elems == t1["gp_a2a"]["act_elems"]
    assert gp_ag_memory(prob, p).graph_bytes < gp_a2a_memory(prob, p).graph_bytes


@pytest.mark.parametrize("heads,p", [(4, 3), (3, 4), (5, 2), (2, 8)])
def test_a2a_uneven_heads_conserve_bytes(heads, p):
    """Every byte sent is received somewhere: totals over ranks agree, per phase and op."""
    prob = AttentionProblem(n=23, e=100, d=heads * 3, heads=heads, esize=8)
    s = reg_a2a = default_registry().get("gp_a2a")
    sent = sum(o.sent for r in range(p) for o in s.comm(prob, r, p))
    recv = sum(o.recv for r in range(p) for o in reg_a2a.comm(prob, r, p))
    assert sent == recv > 0


def test_step_bytes_adds_loss_and_gradient_all_reduce():
    prob = AttentionProblem(n=40, e=300, d=8, heads=2, esize=8)
    ag = default_registry().get("gp_ag")
    got = step_bytes(ag, prob, 0, 4, layers=2, num_params=100, gcn=True)
    assert got["all_reduce"] == 2 * (3 * 16 // 4) + 2 * (3 * 800 // 4)
    assert got["all_gather"] == 2 * (2 + 1) * 3 * 10 * 8 * 8
    assert step_bytes(ag, prob, 0, 1, 2, 100) == {}


def test_registry_is_extensible_and_local():
    reg = default_registry()
    assert reg.names() == ["gp_ag", "gp_a2a"]
    mine = AttentionStrategy("mine", "test", reg.get("gp_ag").forward, reg.get("gp_ag").comm,
                             reg.get("gp_ag").memory, False)
    reg.register(mine)
    assert "mine" in reg and "mine" not in default_registry()
    with pytest.raises(ValueError):
        reg.register(mine)
    with pytest.raises(KeyError, match="known: gp_ag, gp_a2a, mine"):
        reg.get("nope")
    assert len(StrategyRegistry()) == 0


def _sysm(latency: float = 1e-4, spb: float = 1e-9, cores: int = 64) -> SystemModel:
    coll = {op: {2: (latency, spb), 8: (latency * 2, spb)}
            for op in ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")}
    return SystemModel(collectives=coll, cores=cores, device="cpu")


def test_collective_time_interpolates_and_extrapolates():
    s = _sysm(1e-4, 1e-9)
    assert s.collective_time("all_gather", 1, 10**6) == 0.0
    assert s.collective_time("all_gather", 2, 10**6) == pytest.approx(1e-4 + 1e-3)
    assert s.collective_time("all_gather", 5, 0) == pytest.approx(1.5e-4)
    assert s.collective_time("all_gather", 15, 0) == pytest.approx(2e-4 * 14 / 7)
    assert SystemModel().collective_time("x", 4, 0) == Coefficients().latency_s


def test_slowdown_oversubscribed_cpu_only():
    assert _sysm(cores=2).slowdown(4) == 2.0
    assert _sysm(cores=64).slowdown(4) == 1.0
    assert SystemModel().slowdown(64) == 1.0
    assert SystemModel(contention={2: 1.3}, cores=4, device="cpu").slowdown(2) == 1.3
    assert SystemModel(contention={4: 1.0}, cores=2, device="cpu").slowdown(4) == 2.0


def _work(n=100_000, e=3_000_000, heads=4) -> Workload:
    return Workload("gt", n, e, 128, 10, hidden=64, heads=heads, layers=2)


def test_estimate_is_alpha_e_plus_beta_n():
    strategies = list(default_registry())
    for c in strategies:
        for s in (1, 2, 8):
            est = estimate(c, _work(), s, _sysm())
            assert est.time_s == pytest.approx(est.alpha * 3_000_000 + est.beta * 100_000)
    one = estimate(strategies[0], _work(), 1, _sysm())
    eight = estimate(strategies[0], _work(), 8, _sysm())
    assert eight.alpha == pytest.approx(one.alpha / 8, rel=1e-3)  # α(sp) ≈ α(p)/s


def test_algorithm3_cheap_network_takes_all_ranks():
    pl = plan(_work(), list(default_registry()), scales_for(8), _sysm(1e-7, 1e-13))
    assert pl.choice.est.scale == 8
    for r in pl.rows:
        assert r.passes == (r.est.scale == 1 or r.score <= pl.k)


def test_algorithm3_expensive_network_stays_on_one_rank():
    pl = plan(_work(n=2000, e=10_000), list(default_registry()), scales_for(8),
              _sysm(1.0, 1e-3))
    assert pl.choice.est.scale == 1
    assert all(not r.passes for r in pl.rows if r.est.scale > 1)
    assert "overhead eats the speedup" in pl.rows[1].why


def test_memory_limit_is_never_exceeded():
    w = _work(n=1_000_000, e=200_000_000, heads=8)
    free = plan(w, list(default_registry()), [8], _sysm(1e-7, 1e-13))
    ag = next(r for r in free.rows if r.est.strategy == "gp_ag")
    a2a = next(r for r in free.rows if r.est.strategy == "gp_a2a")
    # the full graph on every rank costs GP-A2A more than GP-AG's gathered K, V
    assert a2a.est.memory["total"] > ag.est.memory["total"]
    limit = (ag.est.memory["total"] + a2a.est.memory["total"]) // 2
    pl = plan(w, list(default_registry()), [1, 8], _sysm(1e-7, 1e-13), limit)
    assert pl.choice.est.strategy == "gp_ag" and pl.choice.est.scale == 8
    assert all(r.est.memory["total"] <= limit for r in pl.rows if r.chosen)
    none = plan(w, list(default_registry()), [1, 8], _sysm(), memory_limit=1)
    assert none.choice is None and all(not r.fits for r in none.rows)


def test_plexus_coefficients_from_a_profile_build():
    from plexgt.profile import fit_linear, plexus_coefficients

    fit = fit_linear([[1e3, 1e-4 + 1e-6], [1e6, 1e-4 + 1e-3], [1e7, 1e-4 + 1e-2]])
    assert fit["latency_s"] == pytest.approx(1e-4, rel=1e-3)
    assert fit["s_per_byte"] == pytest.approx(1e-9, rel=1e-3)
    coef = Coefficients(**plexus_coefficients(
        {"spmm_s_per_nnz_col": 1e-9, "gemm_s_per_fma": 1e-11},
        {"all_gather": {"2": fit, "4": fit}}))
    assert coef.latency_s == pytest.approx(1e-4, rel=1e-3) and math.isfinite(coef.s_per_byte)
    assert torch.tensor(coef.gemm_s_per_fma) > 0


@pytest.mark.parametrize("grid", ["2x2x1", "1x3x2", "2x2x2", "4x1x1"])
def test_layouts_partition_the_matrix_and_redistribution_conserves_bytes(grid):
    from plexgt.dist.grid import Grid3D
    from plexgt.parallel.redistribute import (
        plexus_in_layout,
        plexus_out_layout,
        redistribute_bytes,
        row_layout,
    )

    g = Grid3D(*(int(v) for v in grid.split("x")))
    n, d, p = 29, 10, g.size
    layouts = [row_layout(n, d, p), plexus_in_layout(g, n, d), plexus_out_layout(g, n, d)]
    for lay in layouts:
        cover = torch.zeros(n, d, dtype=torch.int64)
        for r in range(p):
            b = lay(r)
            cover[b.rows[0]:b.rows[1], b.cols[0]:b.cols[1]] += 1
            assert b.rows[1] - b.rows[0] <= b.shape[0] and b.cols[1] - b.cols[0] <= b.shape[1]
        assert torch.all(cover == 1)
    for src, dst in ((layouts[0], layouts[1]), (layouts[2], layouts[0])):
        moved = [redistribute_bytes(src, dst, p, r, 4) for r in range(p)]
        assert sum(s for s, _ in moved) == sum(r for _, r in moved)
        assert all(s <= 4 * n * d for s, _ in moved)
