"""Each autograd collective against a single-process simulation of its whole group.

Every rank builds every group member's input from a seed (the member's global rank), so it can
compute, in one process and with autograd, what the group as a whole computes; its own output
and its own input gradient must equal that simulation, and its ledger the byte formula.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from plexgt.distributed.collectives import (
    Comm,
    CommLedger,
    all_gather,
    all_reduce,
    all_to_all,
    reduce_scatter,
    shift,
)
from plexgt.distributed.grid import AXES, PLANES

from .conftest import WORLD, grids_for_world

pytestmark = pytest.mark.timeout(120)
ESIZE = 8  # float64


def _rand(seed: int, *shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _groups(dist_ctx, grid_groups, grid):
    gg = grid_groups(grid)
    out = {a: (gg.axis[a], grid.axis_members(dist_ctx.rank, a)) for a in AXES}
    out.update({p: (gg.plane[p], grid.plane_members(dist_ctx.rank, p)) for p in PLANES})
    out["world"] = (dist.group.WORLD, list(range(dist_ctx.world_size)))
    return out


def _check(mine_out, my_leaf, sim_outs, sim_leaves, members, me, weights):
    """Compare this rank's output and input gradient with the simulated group."""
    idx = members.index(me)
    torch.testing.assert_close(mine_out, sim_outs[idx], rtol=1e-12, atol=1e-12)
    (mine_out * weights[idx]).sum().backward()
    sum((o * w).sum() for o, w in zip(sim_outs, weights)).backward()
    torch.testing.assert_close(my_leaf.grad, sim_leaves[idx].grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("grid", grids_for_world(), ids=str)
@pytest.mark.parametrize("dim", [0, 1])
def test_all_gather_reduce_scatter_all_reduce(dist_ctx, grid_groups, grid, dim):
    me = dist_ctx.rank
    for name, (group, members) in _groups(dist_ctx, grid_groups, grid).items():
        p = len(members)
        ledger = CommLedger()
        comm = Comm.from_group(group, name, ledger)
        shape = (3, 4) if dim == 0 else (4, 3)

        def leaves(tag, shp, members=members):
            return [_rand(1000 * tag + m, *shp).requires_grad_() for m in members]

        def weights(tag, shp, members=members):
            return [_rand(7000 * tag + m, *shp) for m in members]

        # all-gather
        xs = leaves(1, shape)
        gshape = (3 * p, 4) if dim == 0 else (4, 3 * p)
        ws = weights(1, gshape)
        x = xs[members.index(me)].detach().clone().requires_grad_()
        out = all_gather(x, comm, dim)
        _check(out, x, [torch.cat(xs, dim)] * p, xs, members, me, ws)
        assert ledger.total(name, "all_gather") == (p - 1) * 12 * ESIZE
        # its adjoint ran in backward: reduce-scatter of the gathered gradient
        assert ledger.total(name, "reduce_scatter") == (p - 1) * (12 * p * ESIZE) // p

        # reduce-scatter
        ledger.reset()
        full = (3 * p, 4) if dim == 0 else (4, 3 * p)
        xs = leaves(2, full)
        ws = weights(2, shape)
        x = xs[members.index(me)].detach().clone().requires_grad_()
        out = reduce_scatter(x, comm, dim)
        total = sum(xs)
        _check(out, x, list(total.chunk(p, dim)), xs, members, me, ws)
        assert ledger.total(name, "reduce_scatter", "recv") == (p - 1) * 12 * p * ESIZE // p
        assert ledger.total(name, "all_gather") == (p - 1) * 12 * ESIZE

        # all-reduce (self-adjoint)
        ledger.reset()
        xs = leaves(3, (5, 3))
        ws = weights(3, (5, 3))
        x = xs[members.index(me)].detach().clone().requires_grad_()
        out = all_reduce(x, comm)
        _check(out, x, [sum(xs)] * p, xs, members, me, ws)
        assert ledger.total(name, "all_reduce") == 2 * 2 * ((p - 1) * 15 * ESIZE // p)
        assert ledger.calls[(name, "all_reduce")] == (2 if p > 1 else 0)


def _splits(p: int, sender: int) -> list[int]:
    """Uneven splits, some empty: rows rank-index ``sender`` sends to each receiver."""
    return [(sender + 2 * r) % 3 for r in range(p)]


@pytest.mark.parametrize("grid", grids_for_world(), ids=str)
def test_all_to_all_uneven(dist_ctx, grid_groups, grid):
    me = dist_ctx.rank
    for name, (group, members) in _groups(dist_ctx, grid_groups, grid).items():
        p = len(members)
        ledger = CommLedger()
        comm = Comm.from_group(group, name, ledger)
        send = {j: _splits(p, j) for j in range(p)}
        xs = [_rand(300 + m, sum(send[j]), 2, 3).requires_grad_() for j, m in enumerate(members)]
        pieces = [x.split(send[j], 0) for j, x in enumerate(xs)]
        sim = [torch.cat([pieces[j][r] for j in range(p)], 0) for r in range(p)]
        ws = [_rand(900 + m, s.shape[0], 2, 3) for m, s in zip(members, sim)]
        i = members.index(me)
        recv = [send[j][i] for j in range(p)]
        x = xs[i].detach().clone().requires_grad_()
        out = all_to_all(x, comm, send[i], recv, 0)
        _check(out, x, sim, xs, members, me, ws)
        row = 6 * ESIZE
        if p > 1:
            sent_fwd = (sum(send[i]) - send[i][i]) * row
            recv_fwd = (sum(recv) - recv[i]) * row
            assert ledger.total(name, "all_to_all", "sent") == sent_fwd + recv_fwd
            assert ledger.total(name, "all_to_all", "recv") == recv_fwd + sent_fwd


@pytest.mark.parametrize("grid", grids_for_world(), ids=str)
@pytest.mark.parametrize("offset", [1, -1, 2])
def test_shift(dist_ctx, grid_groups, grid, offset):
    me = dist_ctx.rank
    for name, (group, members) in _groups(dist_ctx, grid_groups, grid).items():
        p = len(members)
        ledger = CommLedger()
        comm = Comm.from_group(group, name, ledger)
        xs = [_rand(50 + m, 4, 2).requires_grad_() for m in members]
        sim = [xs[(r - offset) % p] for r in range(p)]
        ws = [_rand(60 + m, 4, 2) for m in members]
        i = members.index(me)
        x = xs[i].detach().clone().requires_grad_()
        out = shift(x, comm, offset)
        _check(out, x, sim, xs, members, me, ws)
        moved = 2 * 8 * ESIZE if offset % p else 0
        assert ledger.total(name, "send_recv") == moved


def test_world_size_matches_launcher(dist_ctx):
    assert dist_ctx.world_size == WORLD
    assert dist.get_world_size() == WORLD
