"""Rank arithmetic of the dp x pp x cp mesh, the layer partition, and the byte formulas,
without MPI."""

import itertools

import pytest

from plexgt.distributed.mesh import (
    Mesh,
    check_batch,
    check_world_size,
    even_partition,
    factorizations,
    meshes_for,
    micro_batch,
    parse_extent,
    parse_mesh,
    partition,
)
from plexgt.distributed.p2p import pipeline_p2p_bytes
from plexgt.errors import ConfigError, GridError
from plexgt.parallel.pipeline import bucket_sizes, gradient_bytes

SHAPES = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 2), (3, 1, 1), (2, 3, 1),
          (1, 3, 2), (2, 3, 4), (4, 1, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rank_coords_roundtrip_cp_innermost(shape):
    m = Mesh(*shape)
    seen = set()
    for r in range(m.size):
        d, p, c = m.coords(r)
        assert m.rank(d, p, c) == r == (d * m.pp + p) * m.cp + c
        seen.add((d, p, c))
    assert seen == set(itertools.product(range(m.dp), range(m.pp), range(m.cp)))
    # a cp group is consecutive ranks (one node's GPUs)
    for r in range(0, m.size, m.cp):
        assert m.cp_members(r) == list(range(r, r + m.cp))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_groups_partition_the_world_and_hold_what_they_say(shape):
    m = Mesh(*shape)
    for members, same, size in ((m.cp_members, (0, 1), m.cp),
                                (m.stage_members, (1,), m.dp * m.cp),
                                (m.dp_members, (1, 2), m.dp),
                                (m.pipe_members, (0, 2), m.pp)):
        groups = {tuple(members(r)) for r in range(m.size)}
        assert sorted(r for g in groups for r in g) == list(range(m.size))  # a partition
        for r in range(m.size):
            g = members(r)
            assert len(g) == size and r in g and g == sorted(g)
            for o in g:
                assert all(m.coords(o)[i] == m.coords(r)[i] for i in same)
    for r in range(m.size):
        d, p, c = m.coords(r)
        assert m.pipe_members(r) == [m.rank(d, s, c) for s in range(m.pp)]
        assert m.prev_rank(r) == (m.rank(d, p - 1, c) if p else None)
        assert m.next_rank(r) == (m.rank(d, p + 1, c) if p < m.pp - 1 else None)


def test_factorizations_are_every_ordered_triple():
    for world in (1, 3, 4, 6, 8, 12):
        got = {m.shape for m in factorizations(world)}
        want = {t for t in itertools.product(range(1, world + 1), repeat=3)
                if t[0] * t[1] * t[2] == world}
        assert got == want and len(got) == len(factorizations(world))


def test_bad_meshes_one_line_errors():
    with pytest.raises(GridError, match="cp=0"):
        Mesh(1, 1, 0)
    with pytest.raises(GridError,
                       match=r"dp=2 \* pp=3 \* cp=1 = 6 ranks, but the world size is 4"):
        check_world_size(Mesh(2, 3, 1), 4)
    with pytest.raises(GridError, match="DPxPPxCP"):
        parse_mesh("2x3")
    assert parse_mesh("2x3x1") == Mesh(2, 3, 1)
    with pytest.raises(GridError, match="outside mesh"):
        Mesh(2, 2, 1).coords(4)
    with pytest.raises(ConfigError, match="'parallel.cp': 'two' is not 'auto'"):
        parse_extent("two", "parallel.cp")
    with pytest.raises(ConfigError, match="'parallel.pp': '0' is not 'auto'"):
        parse_extent("0", "parallel.pp")
    assert parse_extent("auto", "parallel.dp") is None and parse_extent(" 3", "x") == 3
    assert [m.shape for m in meshes_for(8, dp="2", cp="2")] == [(2, 2, 2)]
    assert {m.shape for m in meshes_for(4, pp=2)} == {(1, 2, 2), (2, 2, 1)}
    with pytest.raises(GridError, match="parallel.dp=3 .* world size 8"):
        meshes_for(8, dp="3")


def test_partition_parses_and_checks():
    assert partition("3,7,7,7", 24, 4) == (range(0, 3), range(3, 10), range(10, 17),
                                           range(17, 24))
    assert partition([1, 2, 3], 6, 3) == (range(0, 1), range(1, 3), range(3, 6))
    assert partition("auto", 7, 3) == (range(0, 2), range(2, 4), range(4, 7))
    assert even_partition(6, 3) == (range(0, 2), range(2, 4), range(4, 6))
    assert even_partition(5, 1) == (range(0, 5),)
    cases = {("3,7,7", 24, 4): "is 3 stages, parallel.pp=4",
             ("3,7,7,6", 24, 4): "sums to 23 layers, not model.layers=24",
             ("0,6,6", 12, 3): "has a stage with no layer \\(stage 0",
             ("6,0,6", 12, 3): "has a stage with no layer \\(stage 1",
             ("3;3", 6, 2): "comma-separated",
             ("", 6, 1): "comma-separated"}
    for (text, layers, pp), msg in cases.items():
        with pytest.raises(ConfigError, match=msg) as e:
            partition(text, layers, pp)
        assert "parallel.stages" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="'parallel.pp': 3 stages for model.layers=2"):
        partition("auto", 2, 3)


def test_p2p_and_gradient_formulas():
    # first, middle, last stage of 3; two micro-batches of 80 and 40 bytes
    assert pipeline_p2p_bytes(0, 3, [80, 40]) == {"activation": (120, 0), "gradient": (0, 120)}
    assert pipeline_p2p_bytes(1, 3, [80, 40]) == {"activation": (120, 120),
                                                   "gradient": (120, 120)}
    assert pipeline_p2p_bytes(2, 3, [80, 40]) == {"activation": (0, 120), "gradient": (120, 0)}
    assert pipeline_p2p_bytes(0, 1, [80]) == {"activation": (0, 0), "gradient": (0, 0)}
    assert bucket_sizes([10, 10, 10], 25) == [20, 10]
    assert bucket_sizes([30, 10, 10], 25) == [30, 20]
    assert bucket_sizes([], 25) == []
    assert gradient_bytes([30, 10, 10], 4, 25) == 2 * (3 * 30 // 4) + 2 * (3 * 20 // 4)
    assert gradient_bytes([30, 10, 10], 1, 25) == 0


def test_step_split_over_replicas_and_micro_batches():
    mesh = Mesh(2, 3, 2)
    check_batch(8, 1024, mesh, 4)
    got = [micro_batch(8, 2, 2, d, k) for d in range(2) for k in range(2)]
    assert got == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    for args, msg in (((7, 1024, mesh, 1), "'parallel.dp': 2 does not divide batch.sequences=7"),
                      ((8, 1024, mesh, 3), "micro_batches': 3 does not divide a replica's 4"),
                      ((8, 1024, mesh, 0), "'parallel.micro_batches': 0 does not divide"),
                      ((8, 1001, mesh, 1), "'parallel.cp': 2 does not divide batch.size=1001")):
        with pytest.raises(ConfigError, match=msg):
            check_batch(*args)
