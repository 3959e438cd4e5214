"""The process groups built on every rank have exactly the members the pure functions predict."""

import pytest
import torch
import torch.distributed as dist

from plexgt.distributed.grid import AXES, PLANES

from .conftest import grids_for_world

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("grid", grids_for_world(), ids=str)
def test_groups_match_rank_arithmetic(dist_ctx, grid_groups, grid):
    gg = grid_groups(grid)
    for a in AXES:
        assert dist.get_process_group_ranks(gg.axis[a]) == grid.axis_members(dist_ctx.rank, a)
        # a real collective over the group sums exactly its members' ranks
        t = torch.tensor([float(dist_ctx.rank)])
        dist.all_reduce(t, group=gg.axis[a])
        assert t.item() == sum(grid.axis_members(dist_ctx.rank, a))
    for p in PLANES:
        assert dist.get_process_group_ranks(gg.plane[p]) == grid.plane_members(dist_ctx.rank, p)
    assert gg.coords == grid.coords(dist_ctx.rank)
