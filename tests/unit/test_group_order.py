"""Process groups are created in an order every rank shares.

With the world group bound to a GPU (``device_id``, as ``plexgt train`` binds it on NCCL),
every ``torch.distributed.new_group`` is an ``ncclCommSplit`` of the world's communicator: a
collective every world rank must join, in the same order. A non-member joins with no colour
(``new_group`` without local synchronisation) or by splitting off its own group at the same
step (with it, as grid.py's ranks do bound to a device); a rank that skips a step leaves the
others in it for ever. On gloo every rank creates every group of a partition, globally
synchronised (``partition_group``: members-only groups are named by how many groups each
rank holds, which differ after a group not every rank joined). Here each rank of a job is
simulated in turn with ``new_group`` recorded, and the sequences are checked against that rule.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.distributed.grid import build_groups, parse_grid
from plexgt.parallel.attention.gp_2d import factorisations, make_groups


class FakeGroup:
    def __init__(self, ranks):
        self.ranks = tuple(ranks)


def _job(monkeypatch, world: int, rank: int) -> list[tuple[tuple[int, ...], bool]]:
    """torch.distributed as rank ``rank`` of ``world`` sees it: new_group recorded as
    (ranks, use_local_synchronization)."""
    calls: list[tuple[tuple[int, ...], bool]] = []
    wg = FakeGroup(range(world))

    def new_group(ranks, use_local_synchronization=False, **kw):
        calls.append((tuple(sorted(ranks)), bool(use_local_synchronization)))
        return FakeGroup(sorted(ranks)) if rank in ranks else None

    def size(group=None):
        return world if group is None or group is dist.group.WORLD else len(group.ranks)

    def my_rank(group=None):
        return rank if group is None or group is dist.group.WORLD else group.ranks.index(rank)

    monkeypatch.setattr(dist, "new_group", new_group)
    monkeypatch.setattr(dist, "get_world_size", size)
    monkeypatch.setattr(dist, "get_rank", my_rank)
    monkeypatch.setattr(dist, "get_global_rank", lambda g, i: g.ranks[i])
    monkeypatch.setattr(dist, "group", type("G", (), {"WORLD": wg}))
    # gp_2d's sub-group check compares the groups its ranks hold: here they hold alike
    monkeypatch.setattr(dist, "all_gather", lambda out, t, group=None: [o.copy_(t) for o in out])
    return calls


def split_consistent(by_rank: dict[int, list[tuple[tuple[int, ...], bool]]],
                     world: int) -> None:
    """Every world rank made the same number of calls, and call i is one split of the world
    on every rank: all ranks name the same group (no local synchronisation: non-members
    join with no colour), or (with it) each rank names its own group and the members of a
    group all name it."""
    assert sorted(by_rank) == list(range(world))
    counts = {r: len(c) for r, c in by_rank.items()}
    assert len(set(counts.values())) == 1, f"calls per rank differ: {counts}"
    for i in range(counts[0]):
        step = {r: by_rank[r][i] for r in range(world)}
        assert len({local for _, local in step.values()}) == 1, f"call {i}: {step}"
        if not step[0][1]:
            assert len({g for g, _ in step.values()}) == 1, f"call {i}: {step}"
            continue
        for r, (g, _) in step.items():
            assert r in g, f"call {i}: rank {r} splits off {g}"
            assert all(step[m][0] == g for m in g), f"call {i}: {g} not named by its members"


def _bind(monkeypatch, bound: bool) -> None:
    """The world bound to a device (NCCL) or not (gloo), as partition_group and gp_2d see it."""
    from plexgt.distributed import collectives
    from plexgt.parallel.attention import gp_2d

    monkeypatch.setattr(collectives, "world_bound_to_device", lambda: bound)
    monkeypatch.setattr(gp_2d, "world_bound_to_device", lambda: bound)


def _gp_2d_calls(monkeypatch, world: int, a: int) -> dict[int, list]:
    by_rank = {}
    for r in range(world):
        calls = _job(monkeypatch, world, r)
        comm = Comm(dist.group.WORLD, world, r, "rows", CommLedger())
        groups = make_groups(comm, a, comm.ledger)
        assert groups["heads"].size == a and groups["ring"].size == world // a
        by_rank[r] = calls
    return by_rank


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize("world", [4, 6, 8, 12])
def test_gp_2d_ranks_create_the_same_groups_in_the_same_order(monkeypatch, world, bound):
    """gp_2d's groups through partition_group: on gloo every rank creates every head and ring
    group in one order, globally synchronised; bound to a device each rank splits off its own
    head group, then its own ring group, members-only."""
    _bind(monkeypatch, bound)
    for a in factorisations(world):
        by_rank = _gp_2d_calls(monkeypatch, world, a)
        first = by_rank[0]
        axes = [(world // a, a), (a, world // a)]  # (number of groups, extent) per axis
        if bound:
            assert len(first) == sum(1 for _, ext in axes if 1 < ext < world)
            assert all(local for _, local in first)
        else:
            assert all(calls == first for calls in by_rank.values()), a
            # one call per head group and per ring group, except axes of extent 1 or the world
            assert len(first) == sum(n for n, ext in axes if 1 < ext < world)
            assert not any(local for _, local in first)
        split_consistent(by_rank, world)


@pytest.mark.parametrize("bound", [False, True])
def test_grid_groups_are_one_split_of_the_world_per_call(monkeypatch, bound):
    """grid.py through partition_group: on gloo every rank creates every axis and plane group
    (globally synchronised, torch names them by a count all ranks share); bound to a device
    each rank its own six (local synchronisation). Either way the same calls in the same
    order on every rank, each one split of the world."""
    _bind(monkeypatch, bound)
    world, grid = 12, parse_grid("3x2x2")
    by_rank = {}
    for r in range(world):
        calls = _job(monkeypatch, world, r)
        gg = build_groups(grid, r, world)
        assert {a: gg.axis[a].ranks for a in "xyz"} == {
            a: tuple(grid.axis_members(r, a)) for a in "xyz"}
        assert {p: gg.plane[p].ranks for p in ("xy", "yz", "zx")} == {
            p: tuple(grid.plane_members(r, p)) for p in ("xy", "yz", "zx")}
        by_rank[r] = calls
    split_consistent(by_rank, world)
    if bound:
        assert len(by_rank[0]) == 6
    else:
        # x: 4 groups of 3, y: 6 of 2, z: 6 of 2, xy: 2, yz: 3, zx: 2
        assert len(by_rank[0]) == 4 + 6 + 6 + 2 + 3 + 2
        assert all(calls == by_rank[0] for calls in by_rank.values())


@pytest.mark.parametrize("bound", [False, True])
def test_a_gps_run_creates_grid_then_gp_2d_groups_in_step(monkeypatch, bound):
    """What a gps run on a 3D GCN path with gp_2d makes (tasks/attention.py: the grid's
    groups, then the strategy's), on every rank."""
    _bind(monkeypatch, bound)
    world, grid = 8, parse_grid("2x2x2")
    by_rank = {}
    for r in range(world):
        calls = _job(monkeypatch, world, r)
        build_groups(grid, r, world)
        make_groups(Comm(dist.group.WORLD, world, r, "rows", CommLedger()), 2, CommLedger())
        by_rank[r] = calls
    split_consistent(by_rank, world)


def test_gp_2d_groups_of_a_sub_group_are_refused_not_left_hanging(monkeypatch):
    """Only a sub-group's ranks call make_groups; with the world bound to a device their
    split of the world alone (local synchronisation) would leave the other ranks out of an
    ncclCommSplit: refused. Unbound (gloo), the sub-group makes its groups among its own
    ranks, with local synchronisation (what the multi-rank tests run p of P ranks on)."""
    from plexgt.parallel.attention import gp_2d

    world = 8
    calls = _job(monkeypatch, world, 1)
    sub = Comm(FakeGroup(range(4)), 4, 1, "rows", CommLedger())
    monkeypatch.setattr(gp_2d, "world_bound_to_device", lambda: True)
    with pytest.raises(ValueError, match="every rank of the job.* 4 of the 8 ranks"):
        make_groups(sub, 2, sub.ledger)
    assert calls == []
    monkeypatch.setattr(gp_2d, "world_bound_to_device", lambda: False)
    make_groups(sub, 2, sub.ledger)
    assert calls == [((0, 1), True), ((1, 3), True)]


def test_gp_2d_groups_of_a_sub_group_whose_ranks_hold_different_groups_are_refused(
        monkeypatch):
    """gloo, a sub-group comm whose ranks hold different numbers of groups (an earlier group
    joined by some only): their members-only groups would get different names and hang in
    the rendezvous; refused, naming the counts, before any group is created."""
    from plexgt.parallel.attention import gp_2d

    calls = _job(monkeypatch, 8, 1)
    monkeypatch.setattr(gp_2d, "world_bound_to_device", lambda: False)

    def all_gather(out, t, group=None):
        for i, o in enumerate(out):
            o.fill_(5 + (i == 3))

    monkeypatch.setattr(dist, "all_gather", all_gather)
    sub = Comm(FakeGroup(range(4)), 4, 1, "rows", CommLedger())
    with pytest.raises(ValueError, match=r"4 ranks of a sub-group comm hold \[5, 5, 5, 6\]"):
        make_groups(sub, 2, sub.ledger)
    assert calls == []


@pytest.mark.parametrize("bound", [False, True])
def test_mesh_groups_are_created_alike_on_every_rank(monkeypatch, bound):
    """mesh.py: on gloo every rank creates every group of the mesh in one order without local
    synchronisation (torch names them by a count all ranks share); bound to a device each rank
    splits off its own four groups (local synchronisation), the same number of calls on
    every rank. Either way each call is one split of the world."""
    from plexgt.distributed import mesh as mesh_mod

    _bind(monkeypatch, bound)
    world, mesh = 12, mesh_mod.Mesh(2, 3, 2)
    by_rank = {}
    for r in range(world):
        calls = _job(monkeypatch, world, r)
        mg = mesh_mod.build_mesh_groups(mesh, r, world)
        assert mg.cp.ranks == tuple(mesh.cp_members(r)) and mg.pipe.ranks == tuple(
            mesh.pipe_members(r))
        by_rank[r] = calls
    split_consistent(by_rank, world)
    if bound:
        assert len(by_rank[0]) == 4
    else:
        assert all(calls == by_rank[0] for calls in by_rank.values())
        assert len(by_rank[0]) == 2 * 3 + 3 + 3 * 2 + 2 * 2  # dp·pp + pp + pp·cp + dp·cp
