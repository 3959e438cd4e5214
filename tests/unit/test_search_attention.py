"""gt / gps's whole-space search and the one choice train and plan share (plan.choose)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from plexgt.distributed.grid import Grid3D
from plexgt.errors import ConfigError
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.ring import ring_comm
from plexgt.parallel.attention.strategy import AttentionProblem, graph_bytes, score_terms
from plexgt.plan.agp import SystemModel, Workload, estimate, gcn_grid_for, memory_of
from plexgt.plan.choose import GraphSizes, ModelShape, choose
from plexgt.plan.machine import load_machine
from plexgt.plan.plexus_cost import Coefficients
from plexgt.plan.search import search_gcn
from plexgt.plan.search_attention import comm_sample, search_attention, variants
from plexgt.tasks.task import system_model_for

REG = list(default_registry())


def _machine(p: int) -> tuple[SystemModel, Coefficients, int]:
    m = load_machine("perlmutter")
    prof = m.profile(p)
    return system_model_for(prof), Coefficients.from_profile(prof), m.memory_per_gpu_bytes


@pytest.mark.parametrize("model", ["gt", "gps"])
@pytest.mark.parametrize("n,e", [(2_449_029, 126_167_053), (34_493, 530_417),
                                 (232_965, 114_848_857)])
def test_two_stage_search_chooses_as_full_enumeration(model, n, e):
    """On a machine description at P = 24 the shortcut's choice is full enumeration's, and
    every scale's best is a configuration full enumeration also priced, never faster."""
    sysm, coef, _ = _machine(24)
    w = Workload(model, n, e, 128, 40, 128, 8, 3, esize=2)

    def grid_at(s):
        return gcn_grid_for(s, n, e, 128, 2, coef)

    fast = search_attention(w, REG, 24, sysm, gcn_grid_at=grid_at)
    full = search_attention(w, REG, 24, sysm, gcn_grid_at=grid_at, refine=False)
    assert fast.priced < full.priced
    assert fast.chosen.label == full.chosen.label and fast.chosen.scale == full.chosen.scale
    by_scale = {c.scale: c for c in full.best_per_scale}
    for c in fast.best_per_scale:
        assert c.est.time_s >= by_scale[c.scale].est.time_s
    assert [c.scale for c in full.best_per_scale] == list(range(1, 25))
    assert all(c.est.time_s >= full.chosen.est.time_s for c in full.best_per_scale)
    # the frontier: nothing else both faster and smaller
    for f in full.frontier:
        assert not any(c.est.time_s < f.est.time_s and c.memory_bytes < f.memory_bytes
                       for c in full.best_per_scale)


def test_memory_is_checked_before_pricing_and_blocking_makes_room():
    """A limit below the whole attention's memory: those configurations are dropped unpriced,
    and what is chosen fits, by more ring pieces or attention row blocks where it must."""
    sysm, _, _ = _machine(8)
    w = Workload("gt", 400_000, 40_000_000, 128, 40, 128, 8, 2)
    free = search_attention(w, REG, 8, sysm, scales=[8])
    need = {(c.strategy, c.head_parallel): memory_of(c_, w, 8, c.head_parallel)["total"]
            for c_ in REG for c in [free.chosen] if c_.name == c.strategy}
    limit = int(0.7 * min(need.values()))
    tight = search_attention(w, REG, 8, sysm, limit, scales=[8])
    assert tight.pruned > 0 and tight.chosen is not None
    assert tight.chosen.memory_bytes <= limit
    assert tight.chosen.ring_chunks > 1 or tight.chosen.block_rows > 0
    for c in tight.best_per_scale:
        assert c.memory_bytes <= limit
    assert search_attention(w, REG, 8, sysm, 1 << 20, scales=[8]).chosen is None


def test_blocked_attention_keeps_the_lse_and_redoes_the_sddmm():
    prob = AttentionProblem(10_000, 200_000, 64, 4, 4)
    blocked = replace(prob, block_rows=1000)
    assert score_terms(prob, 10_000, 200_000, 4) == (800_000, 800_000, 1)
    assert score_terms(blocked, 10_000, 200_000, 4) == (40_000, 80_000, 10)
    for name in ("gp_ag", "gp_a2a"):
        c = default_registry().get(name)
        assert c.memory(blocked, 2).total < c.memory(prob, 2).total
        wk, wb = c.work(prob, 2), c.work(blocked, 2)
        assert (wk.recompute, wb.recompute) == (0, 1) and wb.launches > wk.launches == 1
    w = Workload("gt", 10_000, 200_000, 16, 4, 64, 4, 2)
    sysm = SystemModel()
    c = default_registry().get("gp_ag")
    assert estimate(c, replace(w, attention_block_rows=1000), 2, sysm).compute_s > \
        estimate(c, w, 2, sysm).compute_s


def test_variants_and_rank_sample():
    c = {s.name: s for s in REG}
    w = Workload("gt", 1000, 10_000, 8, 2, 16, 4, 1)
    assert variants(c["gp_ring"], w, 4) == [(1, 0), (2, 0), (4, 0)]
    assert variants(c["gp_ring"], w, 4, (False, True)) == [(1, 0)]
    assert variants(c["gp_ag"], w, 4) == [(1, 0), (1, 32)]
    assert variants(c["gp_a2a"], w, 4) == [(1, 0), (1, 125)]
    assert comm_sample(10) == list(range(10))
    big = comm_sample(2048)
    assert big[0] == 0 and big[-1] == 2047 and len(big) == 16


def test_ring_steps_are_one_op_with_a_count():
    """b - 1 identical sends are one CommOp of count b - 1: a 2048-rank ring costs O(1) to
    price, and the bytes (ledger's view) are unchanged."""
    ops = ring_comm(100, 4, 8, 2048, 1, 4)
    assert len(ops) == 3 and {o.count for o in ops} == {2047}
    assert sum(o.total_sent for o in ops) == 3 * 2047 * (2 * 100 * 4 * 8 * 4)  # K/V, dK/dV, acc


def test_choose_keeps_what_is_given_and_searches_the_rest():
    sizes = GraphSizes(50_000, 1_000_000, 64, 8)
    sysm, coef, _ = _machine(8)
    gcn = ModelShape("gcn", 64, 3)
    rp, found = choose(sizes, gcn, 8, sysm, coef)
    assert rp.scale == 8 and rp.grid.size == 8 and found.chosen.grid == rp.grid
    assert rp.gcn_order in ("auto", "aggregate_first", "gemm_first")
    every = search_gcn(sizes.n, sizes.e, [64, 64, 64, 8], 4, coef, 8, scales=[8], refine=None)
    assert rp.time_s == pytest.approx(every.chosen.est.time_s)
    fixed = choose(sizes, replace(gcn, gcn_order="gemm_first", block_rows=500), 8, sysm, coef,
                   grid="2x2x2").plan
    assert (fixed.grid, fixed.gcn_order, fixed.block_rows) == (Grid3D(2, 2, 2), "gemm_first",
                                                                500)
    anyscale = choose(sizes, gcn, 8, sysm, coef, any_scale=True).plan
    assert anyscale.time_s <= rp.time_s
    gt = ModelShape("gt", 64, 2, 4, ring_chunks=0)
    rp = choose(sizes, gt, 8, sysm, coef, strategy="gp_ring").plan
    assert (rp.strategy, rp.scale, rp.ring_chunks) == ("gp_ring", 8, 1)
    rp = choose(sizes, ModelShape("gps", 64, 2, 4), 8, sysm, coef, grid="2x2x2").plan
    assert rp.grid == Grid3D(2, 2, 2)
    with pytest.raises(ConfigError, match="no configuration fits 0.00 GiB per rank on 8"):
        choose(sizes, gt, 8, sysm, coef, memory_per_rank=1000)


def test_sparse_input_is_priced_by_its_nonzeros():
    """A CSR input (prep's sparse features): the input projection is an SpMM over F·density
    nonzeros a row, and the features' memory what a graph used both ways keeps
    (test_agp.test_a_sparse_input_costs_what_its_graph_keeps)."""
    sysm = SystemModel()
    c = default_registry().get("gp_ag")
    dense = Workload("gt", 30_000, 500_000, 8000, 5, 64, 4, 2)
    sparse = replace(dense, feature_density=0.004)
    ed, es = estimate(c, dense, 2, sysm), estimate(c, sparse, 2, sysm)
    k = sysm.kernels
    n_loc = 15_000
    want = n_loc * 8000 * 64 * 2 * (k["gemm_s_per_fma"] - 0.004 * k["spmm_s_per_nnz_col"])
    assert ed.compute_s - es.compute_s == pytest.approx(want)
    nnz = int(n_loc * 8000 * 0.004)  # a graph's bytes and both value arrays
    assert es.memory["features"] == graph_bytes(n_loc, 8000, nnz) + 2 * nnz * 4
    assert ed.memory["features"] == n_loc * 8000 * 4
