"""Rank arithmetic of Grid3D, without MPI."""

import itertools

import pytest

from plexgt.distributed.grid import (
    AXES,
    PLANES,
    Grid3D,
    block_bounds,
    check_world_size,
    factorizations,
    layer_roles,
    padded,
    parse_grid,
)
from plexgt.errors import GridError

SHAPES = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 2), (3, 1, 1), (3, 2, 1),
          (1, 3, 2), (5, 1, 1), (2, 3, 4), (4, 1, 3)]


@pytest.mark.parametrize("shape", SHAPES)
def test_rank_coords_roundtrip_and_y_fastest(shape):
    g = Grid3D(*shape)
    seen = set()
    for r in range(g.size):
        x, y, z = g.coords(r)
        assert g.rank(x, y, z) == r
        assert r == y + g.gy * (x + g.gx * z)
        seen.add((x, y, z))
    assert seen == set(itertools.product(range(g.gx), range(g.gy), range(g.gz)))
    # Y fastest: consecutive ranks of one Y group
    for r in range(0, g.size, g.gy):
        assert g.axis_members(r, "y") == list(range(r, r + g.gy))


@pytest.mark.parametrize("shape", SHAPES)
def test_axis_groups_partition_world(shape):
    g = Grid3D(*shape)
    for axis in AXES:
        groups = g.all_axis_groups(axis)
        assert len(groups) == g.size // g.dim(axis)
        assert sorted(itertools.chain(*groups)) == list(range(g.size))
        for members in groups:
            assert members == sorted(members)
            i = AXES.index(axis)
            assert [g.coords(m)[i] for m in members] == list(range(g.dim(axis)))
            others = {tuple(c for j, c in enumerate(g.coords(m)) if j != i) for m in members}
            assert len(others) == 1


@pytest.mark.parametrize("shape", SHAPES)
def test_plane_groups(shape):
    g = Grid3D(*shape)
    for plane in PLANES:
        fixed = AXES.index(next(a for a in AXES if a not in plane))
        groups = g.all_plane_groups(plane)
        assert sorted(itertools.chain(*groups)) == list(range(g.size))
        for members in groups:
            assert members == sorted(members)
            assert len({g.coords(m)[fixed] for m in members}) == 1
            assert len(members) == g.size // g.shape[fixed]


def test_layer_roles_rotate():
    assert layer_roles(0) == ("x", "y", "z")
    assert layer_roles(1) == ("z", "x", "y")
    assert layer_roles(2) == ("y", "z", "x")
    assert layer_roles(3) == ("x", "y", "z")
    for l in range(6):
        a, b, c = layer_roles(l)
        a2, b2, _ = layer_roles(l + 1)
        # output [rows over c, dims over a] is the next input [rows over a', dims over b']
        assert (a2, b2) == (c, a)


def test_validation_names_every_factor():
    with pytest.raises(GridError, match=r"gx=3 \* gy=2 \* gz=1 = 6 ranks.*world size is 4"):
        check_world_size(Grid3D(3, 2, 1), 4)
    for bad in ("2x2", "axbxc", "2x2x0", "2*2*2"):
        with pytest.raises(GridError):
            parse_grid(bad)
    with pytest.raises(GridError):
        Grid3D(0, 1, 1)
    with pytest.raises(GridError):
        Grid3D(2, 2, 2).coords(8)
    assert parse_grid("3X2x1") == Grid3D(3, 2, 1)


@pytest.mark.parametrize("n,parts", [(10, 3), (7, 5), (2, 4), (0, 3), (9, 3), (1, 1)])
def test_block_bounds_cover_with_equal_stride(n, parts):
    spans = [block_bounds(n, parts, i) for i in range(parts)]
    covered = [i for lo, hi in spans for i in range(lo, hi)]
    assert covered == list(range(n))
    assert padded(n, parts) % parts == 0 and padded(n, parts) >= n
    size = padded(n, parts) // parts
    assert all(hi - lo <= size for lo, hi in spans)


@pytest.mark.parametrize("p", [1, 6, 8, 12, 7])
def test_factorizations(p):
    fs = factorizations(p)
    assert all(g.size == p for g in fs)
    assert len(set(fs)) == len(fs)
    assert Grid3D(p, 1, 1) in fs and Grid3D(1, 1, p) in fs


@pytest.mark.parametrize("order", ["yxz", "xyz", "yzx", "zyx", "xzy", "zxy"])
def test_every_axis_order_numbers_each_rank_once_with_the_innermost_consecutive(order):
    from plexgt.distributed.grid import Grid3D, parse_grid

    g = Grid3D(2, 3, 4, order)
    assert sorted(g.rank(*g.coords(r)) for r in range(g.size)) == list(range(g.size))
    inner = order[0]
    members = g.axis_members(0, inner)
    assert members == list(range(g.dim(inner)))  # consecutive ranks: one node's GPUs
    outer = order[2]
    assert g.stride(outer) == g.size // g.dim(outer)
    assert parse_grid(str(g)) == g and (":" in str(g)) == (order != "yxz")
    for axis in "xyz":  # group-rank order stays ascending global rank (torch's)
        ms = g.axis_members(5, axis)
        assert ms == sorted(ms)


def test_a_bad_axis_order_is_refused():
    from plexgt.distributed.grid import Grid3D, parse_grid
    from plexgt.errors import GridError

    with pytest.raises(GridError, match="axis order 'xxz' must name x, y and z once each"):
        Grid3D(2, 2, 2, "xxz")
    with pytest.raises(GridError, match="must name x, y and z"):
        parse_grid("2x2x2:ab")
