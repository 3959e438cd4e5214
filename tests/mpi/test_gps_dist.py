"""Distributed GPS (GP-AG / GP-A2A attention + a 1D or a 3D GCN path) against the reference.

Same harness as test_gt_dist: groups of p = 1, 2, 3, 4, 8 and the world, float64, 1e-6
relative, forward, gradients, ledger bytes to the formula, and a 20-step loss curve. The 3D
path runs on grids of each group's ranks, with its redistribution all-to-alls in the ledger.
"""

from __future__ import annotations

import pytest

from plexgt.dist.grid import Grid3D
from plexgt.models.gps import GPS
from plexgt.parallel.gps_dist import DistGPS
from plexgt.parallel.redistribute import build_axis_groups

from . import test_gt_dist as _gt
from .conftest import RANK
from .test_gt_dist import SIZES, STRATEGIES, check_one_step, check_training

prepared = _gt.prepared  # the fixtures, module-scoped here too
groups = _gt.groups
GRIDS = {1: ["1x1x1"], 2: ["2x1x1", "1x2x1", "1x1x2"], 3: ["3x1x1", "1x1x3"],
         4: ["2x2x1", "1x2x2", "4x1x1"], 6: ["3x2x1", "1x2x3"], 8: ["2x2x2", "2x1x4"]}
CASES = [(p, g) for p in SIZES for g in GRIDS.get(p, [f"{p}x1x1"])]


def _grid(text):
    return Grid3D(*(int(v) for v in text.split("x")))


@pytest.fixture(scope="module")
def axis_groups(groups):
    """grid text -> this rank's axis groups (created in the same order on every rank)."""
    return {g: build_axis_groups(_grid(g), RANK) for _, g in CASES}

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("p", SIZES)
def test_gps_step_equals_reference(prepared, groups, p, strategy):
    check_one_step(prepared, groups, p, strategy, GPS, DistGPS, True)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("p", SIZES)
def test_gps_training_follows_reference(prepared, groups, p, strategy):
    check_training(prepared, groups, p, strategy, GPS, DistGPS, True)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("p,grid", CASES)
def test_gps_3d_path_step_equals_reference(prepared, groups, axis_groups, p, grid, strategy):
    check_one_step(prepared, groups, p, strategy, GPS, DistGPS, True, grid=_grid(grid),
                   axis_groups=axis_groups[grid])


@pytest.mark.parametrize("p", SIZES)
def test_gps_3d_path_training_follows_reference(prepared, groups, axis_groups, p):
    grid = GRIDS.get(p, [f"{p}x1x1"])[0]
    check_training(prepared, groups, p, "gp_ag", GPS, DistGPS, True, grid=_grid(grid),
                   axis_groups=axis_groups[grid])
