"""Distributed GPS (GP-AG / GP-A2A attention + a 1D or a 3D GCN path) against the reference.

Same harness as test_gt_dist: groups of the world (and of world - 1), float64, 1e-6
relative, forward, gradients, ledger bytes to the formula, and a 20-step loss curve. The 3D
path runs on grids of each group's ranks, with its redistribution all-to-alls in the ledger,
which equals AGP's priced step (group by group, call by call) on every rank.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import torch.distributed as dist

from plexgt.distributed.grid import parse_grid
from plexgt.models.gps import GPS
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.gps_dist import DistGPS
from plexgt.parallel.rows1d import all_reduce_gradients, row_cross_entropy
from plexgt.plan.agp import SystemModel, Workload, estimate, step_ops
from plexgt.plan.step_cost import step_bytes_named
from tests.parallel_helpers import build_axis_groups

from . import test_gt_dist as _gt
from .conftest import ALL_GRIDS, RANK, ROW_PARTITIONED, WORLD
from .test_gt_dist import (
    F_IN,
    HEADS,
    HIDDEN,
    LAYERS,
    SIZES,
    STRATEGIES,
    C,
    N,
    build_models,
    check_one_step,
    check_training,
    setup_rank,
)

prepared = _gt.prepared  # the fixtures, module-scoped here too
groups = _gt.groups
GRIDS = {1: ["1x1x1"], 2: ["2x1x1", "1x2x1", "1x1x2"], 3: ["3x1x1", "1x1x3"],
         4: ["2x2x1", "1x2x2", "4x1x1", "2x2x1:xyz"], 6: ["3x2x1", "1x2x3", "3x2x1:zxy"],
         8: ["2x2x2", "2x1x4", "2x2x2:zyx"]}
CASES = [(p, g) for p in SIZES for g in GRIDS.get(p, [f"{p}x1x1"])]


def _grid(text):
    return parse_grid(text)


@pytest.fixture(scope="module")
def axis_groups(groups):
    """grid text -> this rank's axis groups (created in the same order on every rank)."""
    return {g: build_axis_groups(_grid(g), RANK) for _, g in CASES}

pytestmark = pytest.mark.timeout(600)


@ROW_PARTITIONED
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("p", SIZES)
def test_gps_step_equals_reference(prepared, groups, p, strategy):
    check_one_step(prepared, groups, p, strategy, GPS, DistGPS, True)


# the gps curves are the slowest model tests at 6 and 8 ranks: they run up to 4 ranks
# (PLEXGT_ALL_GRIDS=1: everywhere), GP-AG's and GP-A2A's only (the rings' curves are gt's, in
# test_gt_dist and test_ring_dist: gps adds nothing to their attention); the one-step tests
# run every strategy at every size
CURVE_STRATEGIES = (STRATEGIES if ALL_GRIDS else ["gp_ag", "gp_a2a"] if WORLD < 6 else [])
PATH_STRATEGIES = STRATEGIES if ALL_GRIDS else ["gp_ag", "gp_a2a"]
"""The 3D GCN path is independent of the attention strategy: its tests run the node- and
the head-partitioned one (PLEXGT_ALL_GRIDS=1: every one)."""


@pytest.mark.parametrize("strategy", CURVE_STRATEGIES)
@pytest.mark.parametrize("p", _gt.CURVE_SIZES)
def test_gps_training_follows_reference(prepared, groups, p, strategy):
    check_training(prepared, groups, p, strategy, GPS, DistGPS, True)


@pytest.mark.parametrize("strategy", PATH_STRATEGIES)
@pytest.mark.parametrize("p,grid", CASES)
def test_gps_3d_path_step_equals_reference(prepared, groups, axis_groups, p, grid, strategy):
    check_one_step(prepared, groups, p, strategy, GPS, DistGPS, True, grid=_grid(grid),
                   axis_groups=axis_groups[grid])


@pytest.mark.parametrize("p", _gt.CURVE_SIZES if WORLD <= 4 or ALL_GRIDS else [
    pytest.param(WORLD, marks=pytest.mark.skip(reason="the 3D path's curve runs up to 4 ranks; "
                                               "its steps at every size"))])
def test_gps_3d_path_training_follows_reference(prepared, groups, axis_groups, p):
    grid = GRIDS.get(p, [f"{p}x1x1"])[0]
    check_training(prepared, groups, p, "gp_ag", GPS, DistGPS, True, grid=_grid(grid),
                   axis_groups=axis_groups[grid])


@pytest.mark.parametrize("strategy", PATH_STRATEGIES + ["gp_ring"])
@pytest.mark.parametrize("p,grid", CASES)
def test_gps_3d_step_ledger_equals_agp_step_ops(prepared, groups, axis_groups, p, grid,
                                               strategy):
    """One training step with the GCN path 3D: this rank's ledger, per (group name, op), in
    bytes sent, received and calls, equals the step AGP prices for this rank (attention and
    loss/gradient collectives over 'rows', the Plexus layer over the grid axes, and the four
    redistribution all-to-alls per layer over 'rows'); AGP's estimate reports the bytes of
    the rank whose collectives it priced."""
    g = _grid(grid)
    ledger, comm, graph, data = setup_rank(prepared, groups, p, strategy, True, g,
                                           axis_groups[grid])
    _, model = build_models(3, GPS, DistGPS)
    loss = row_cross_entropy(model(data.x, graph), data.labels, data.masks["train"], comm)
    loss.backward()
    all_reduce_gradients(model, comm)
    sent_by_rank = [None] * p
    dist.all_gather_object(sent_by_rank, ledger.total(kind="sent"), group=groups[p])
    # all collectives are done
    w = Workload("gps", N, prepared.E, F_IN, C, HIDDEN, HEADS, LAYERS, 2, 8, gcn_grid=g,
                 gcn_block_rows=4)
    assert w.num_params == sum(t.numel() for t in model.parameters())
    strat = default_registry().get(strategy)
    ops = step_ops(strat, w, p, comm.rank)
    for kind in ("sent", "recv"):
        want = defaultdict(int)
        for name, op in ops:
            want[name, op.op] += op.total_sent if kind == "sent" else op.total_recv
        got = {k: v for k, v in getattr(ledger, kind).items() if v}
        assert got == {k: v for k, v in want.items() if v}, kind
        assert got == step_bytes_named(strat, w.problem, comm.rank, p, LAYERS, w.num_params,
                                       True, kind, g, 4), kind
    calls: Counter = Counter()
    for n, o in ops:
        calls[n, o.op] += o.count
    assert {k: v for k, v in ledger.calls.items() if v} == calls
    att = sum(1 for o in strat.comm(w.problem, comm.rank, p) if o.op == "all_to_all")
    redistributions = 4 if p > 1 else 0  # 1D <-> 3D, in and out, forward and backward
    assert ledger.calls.get(("rows", "all_to_all"), 0) == LAYERS * (att + redistributions)
    est = estimate(strat, w, p, SystemModel())
    assert est.gcn_path == ("3d" if p > 1 else "1d")
    assert est.comm_bytes == sent_by_rank[est.comm_rank]
