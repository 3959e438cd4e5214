"""Groups built after a group that not every rank joined still work (gloo names them alike).

torch names a members-only group (``use_local_synchronization``) by a hash of its ranks and of
how many groups the calling rank holds, and a rank holds no group it is not a member of. After
a group of all ranks but the last, the members of such a group named it differently and waited
for each other in gloo's rendezvous until the store timed out: build_groups hung this way when
tests/mpi/test_pipeline.py (which makes that group) ran before test_grid_groups.py in one
session at 3 ranks. The groups here are built fresh (not the session's cached ones) right after
such a group.
"""

import pytest
import torch
import torch.distributed as dist

from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.distributed.grid import AXES, PLANES, build_groups, factorizations
from plexgt.parallel.attention.gp_2d import factorisations, make_groups

from .conftest import WORLD

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(WORLD < 3, reason="needs a group that not every rank joins")]


def _sums_members(group, members: list[int], rank: int) -> None:
    """A real collective over ``group`` sums exactly its ``members``' ranks."""
    assert dist.get_process_group_ranks(group) == members
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=group)
    assert t.item() == sum(members)


def test_grid_and_gp_2d_groups_work_after_a_group_not_every_rank_joined(dist_ctx):
    me = dist_ctx.rank
    dist.new_group(list(range(WORLD - 1)))  # every rank creates it; the last is no member
    for grid in factorizations(WORLD):
        gg = build_groups(grid, me, WORLD)
        for a in AXES:
            _sums_members(gg.axis[a], grid.axis_members(me, a), me)
        for p in PLANES:
            _sums_members(gg.plane[p], grid.plane_members(me, p), me)
    dist.new_group(list(range(1, WORLD)))  # and another: now the first rank is left out
    world = Comm.from_group(dist.group.WORLD, "rows", CommLedger())
    for a in factorisations(WORLD):
        groups = make_groups(world, a, world.ledger)
        heads = [me // a * a + j for j in range(a)]
        ring = [j * a + me % a for j in range(WORLD // a)]
        for name, members in (("heads", heads), ("ring", ring)):
            c = groups[name]
            assert c.size == len(members)
            if 1 < c.size:
                _sums_members(c.group, members, me)
