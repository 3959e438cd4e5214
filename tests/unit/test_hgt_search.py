"""hgt's search: the partition programme against brute force, memory pruning, the frontier,
and what the default model implies for MegaGraph's two qualitative claims."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from plexgt.errors import ConfigError
from plexgt.plan.batch_fits import BatchProfile, BlockFit, Fit, default_profile
from plexgt.plan.batch_search import (
    NoBatchPlan,
    best_partition,
    choose_batch,
    enumerate_partitions,
    meshes,
    minmax_partition,
    partitions,
    pipeline_partition,
    price,
    search_batch,
)
from plexgt.plan.batch_shape import BatchMesh, BatchShape, position

MIB = 2**20


def test_minmax_programme_equals_enumeration_on_arbitrary_costs():
    rng = np.random.default_rng(0)
    for _ in range(60):
        layers, pp = int(rng.integers(1, 9)), int(rng.integers(1, 5))
        if pp > layers:
            continue
        cost = rng.random((4, layers + 1))
        cost[rng.random(cost.shape) < 0.2] = np.inf  # pruned segments
        v, st = minmax_partition(cost, pp, layers)
        brute = min((max(cost[position(i, pp), n] for i, n in enumerate(p)), p)
                    for p in partitions(layers, pp))
        assert v == brute[0]
        if v < np.inf:
            assert st is not None and sum(st) == layers and len(st) == pp
            assert max(cost[position(i, pp), n] for i, n in enumerate(st)) == v


def test_pipeline_programme_equals_enumeration_on_arbitrary_costs():
    """GPipe's critical path sum + (K - 1) max, minimised exactly by the time-cap loop (the
    min-max programme alone picks the partition of least max, which the sum can lose)."""
    rng = np.random.default_rng(1)
    differs = 0
    for _ in range(200):
        layers, pp, k = int(rng.integers(1, 9)), int(rng.integers(1, 5)), int(rng.integers(1, 5))
        if pp > layers:
            continue
        cost = rng.random((4, layers + 1)) * rng.integers(1, 4, size=(4, layers + 1))
        cost[rng.random(cost.shape) < 0.2] = np.inf
        v, st = pipeline_partition(cost, pp, k, layers)

        def crit(p, cost=cost, pp=pp, k=k):
            per = [cost[position(i, pp), n] for i, n in enumerate(p)]
            return np.inf if max(per) == np.inf else sum(per) + (k - 1) * max(per)

        brute = min(crit(p) for p in partitions(layers, pp))
        assert v == pytest.approx(brute, rel=1e-12) if brute < np.inf else v == np.inf
        if v < np.inf:
            assert st is not None and sum(st) == layers and len(st) == pp
            assert crit(st) == pytest.approx(v, rel=1e-12)
            _, mm = minmax_partition(cost, pp, layers)
            differs += crit(mm) > v * (1 + 1e-9)
    assert differs > 10  # the two objectives really do disagree on these costs


def test_partitions_are_every_composition():
    assert len(list(partitions(24, 4))) == 1771
    assert sorted(partitions(4, 2)) == [(1, 3), (2, 2), (3, 1)]


def _random_case(r: random.Random) -> tuple[BatchShape, BatchProfile]:
    shape = BatchShape(layers=r.randint(2, 8), hidden=8 * r.randint(1, 4), heads=2,
                     size=8 * r.randint(1, 4), sequences=r.choice([1, 2, 4]),
                     features=r.randint(1, 40), classes=r.randint(2, 9),
                     global_nodes=r.randint(0, 2), nodes=r.choice([0, 200, 5000]),
                     embed_dim=r.choice([0, 16]), targets=r.randint(1, 8))
    u = r.uniform
    prof = BatchProfile(
        {0: BlockFit(u(0, 1e-3), u(0, 1e-5), u(0, 1e-7), u(0, 1e-6)),
         2: BlockFit(u(0, 1e-3), u(0, 1e-5), u(0, 1e-7), u(0, 1e-6))},
        BlockFit(u(0, 1e-2), u(0, 1e-4), u(0, 1e-7)), BlockFit(u(0, 1e-2), u(0, 1e-4)),
        Fit(u(0, 1e-4), u(0, 1e-8)), Fit(u(0, 1e-4), u(0, 1e-8)),
        {2: Fit(u(0, 1e-3), u(0, 1e-7)), 8: Fit(u(0, 1e-3), u(0, 1e-7))},
        optimizer_s_per_param=u(1e-10, 1e-6),
        depth=((r.randint(1, 4), u(0.5, 2.0)),) if r.random() < 0.5 else (),
        memory_scale=u(0.8, 1.3), memory_base_bytes=r.randint(0, 10**6))
    return shape, prof


def test_programme_equals_brute_force_on_random_profiles():
    r = random.Random(1)
    checked = pruned = 0
    for _ in range(150):
        shape, prof = _random_case(r)
        world = r.choice([2, 4, 6, 8])
        for mesh in meshes(shape, world):
            if mesh.pp < 2:
                continue
            every = [price(shape, prof, mesh, p) for p in partitions(shape.layers, mesh.pp)]
            mems = sorted(c.peak_bytes for c in every)
            # no limit, a binding one, and one between the leanest and the rest
            for limit in (float("inf"), mems[0], mems[len(mems) // 2] + 0.5):
                got, _ = best_partition(shape, prof, mesh, limit)
                want = enumerate_partitions(shape, prof, mesh, limit)
                assert (got is None) == (want is None)
                if want is None:
                    continue
                assert got.step_s == pytest.approx(want.step_s, rel=1e-12)
                assert got.peak_bytes == want.peak_bytes, (mesh, got, want)
                assert got.peak_bytes <= limit
                checked += 1
                pruned += limit < mems[-1]
    assert checked > 300 and pruned > 100


def test_search_prices_every_mesh_and_never_exceeds_the_limit():
    shape = BatchShape(12, 64, 8, 512, 8, 100, 7, nodes=20000, embed_dim=64)
    prof = default_profile(shape)
    free = search_batch(shape, 8, prof)
    limit = sorted(c.peak_bytes for c in free.candidates)[len(free.candidates) // 3]
    found = search_batch(shape, 8, prof, limit)
    assert found.meshes == free.meshes == len(list(meshes(shape, 8)))
    assert found.candidates and all(max(c.stage_bytes) <= limit for c in found.candidates)
    assert found.best.step_s >= free.best.step_s
    # the frontier: nothing in it dominated, everything outside dominated or tied
    for c in found.candidates:
        beaten = [f for f in found.frontier if f.step_s <= c.step_s and
                  f.peak_bytes <= c.peak_bytes]
        assert beaten
        if c in found.frontier:
            assert all(f == c or f.step_s > c.step_s or f.peak_bytes > c.peak_bytes
                       for f in found.candidates if f.step_s <= c.step_s
                       and f.peak_bytes <= c.peak_bytes)
    assert found.best == found.frontier[0]
    with pytest.raises(NoBatchPlan, match="the least any configuration needs is"):
        choose_batch(shape, 8, prof, found.least_memory - 1)
    assert choose_batch(shape, 8, prof, found.least_memory).peak_bytes <= found.least_memory


# MegaGraph: a 24-layer GT on 4 GPUs; the node table (|V| = 116,331 x 128, AdamW states)
# sized so that an even split puts ~65% more memory on stage 0 than on stage 1
TABLE = BatchShape(24, 128, 8, 1024, 8, 767, 10, nodes=116_331, embed_dim=128)


def test_a_big_table_moves_layers_off_stage_zero():
    prof = default_profile(TABLE)
    mesh = BatchMesh(1, 4, 1, 8)
    even = price(TABLE, prof, mesh, (6, 6, 6, 6))
    assert even.stage_bytes[0] / even.stage_bytes[1] == pytest.approx(1.65, abs=0.03)
    # unlimited, the fastest is the even split (the default prices stage 0's embedding at
    # a small fraction of a block): memory alone moves layers
    free, _ = best_partition(TABLE, prof, mesh, float("inf"))
    assert free.stages == (6, 6, 6, 6)
    # a GPU that holds 7 blocks of a middle stage but not the even split's stage 0
    limit = 520 * MIB
    assert even.peak_bytes > limit
    plan = choose_batch(TABLE, 4, prof, limit, {"pp": 4, "cp": 1, "dp": 1})
    assert plan.stages == (3, 7, 7, 7)
    assert max(plan.stage_bytes) <= limit < even.stage_bytes[0]
    # and stage 0's excess is gone: within 20% of the others (65% in the even split)
    assert plan.stage_bytes[0] / plan.stage_bytes[1] < 1.2


# MegaGraph's ablation: Amazon Computers (13,752 nodes, 767 features, 10 classes), 32
# layers, hidden 128, 32 heads, sequences of 256 nodes, 2 GPUs; 2 sequences a step so that
# DP has a share to split
ABLATION = BatchShape(32, 128, 32, 256, 2, 767, 10, targets=64)


def test_ablation_what_the_default_model_implies():
    prof = default_profile(ABLATION)
    found = search_batch(ABLATION, 2, prof)
    by = {(c.dp, c.pp, c.cp, c.micro_batches, c.stages): c for c in found.candidates}
    cp = {k: by[1, 1, 2, k, (32,)] for k in (1, 2)}
    even = {k: by[1, 2, 1, k, (16, 16)] for k in (1, 2)}
    # CP is faster than the even pipeline at every K (the pipeline's bubble, (K+1)/K slots
    # of half the model, against half the rows' work on each rank)
    assert all(cp[k].step_s < even[k].step_s for k in (1, 2))
    # at K = 1 the even split is dominated by CP: slower and larger (both halve the saved
    # activations; PP halves the states, CP the score workspace)
    assert even[1].step_s > cp[1].step_s and even[1].peak_bytes > cp[1].peak_bytes
    assert even[1] not in found.frontier
    # at K = 2 PP's smaller micro-batch halves its workspace too: it trades time for memory
    assert even[2].peak_bytes < min(c.peak_bytes for c in cp.values())
    # the model prices DP (half the step's sequences per replica) fastest here
    assert (found.best.dp, found.best.pp, found.best.cp) == (2, 1, 1)


def test_fixed_choices_are_honoured_and_checked():
    shape = BatchShape(8, 32, 4, 64, 4, 10, 3)
    prof = default_profile(shape)
    plan = choose_batch(shape, 6, prof, fixed={"stages": "1,3,4", "micro_batches": 2})
    assert (plan.stages, plan.pp, plan.micro_batches) == ((1, 3, 4), 3, 2)
    assert plan.dp * plan.cp == 2
    for got in itertools.islice(search_batch(shape, 8, prof, fixed={"cp": 2}).candidates, 20):
        assert got.cp == 2
    with pytest.raises(ConfigError, match="sums to 9 layers, not model.layers=8"):
        choose_batch(shape, 4, prof, fixed={"stages": (2, 3, 4)})
    with pytest.raises(ConfigError, match="no mesh with parallel.cp=3 fits the world size 4"):
        choose_batch(shape, 4, prof, fixed={"cp": 3})
    with pytest.raises(ConfigError, match="'4,4' is 2 stages, parallel.pp=4"):
        choose_batch(shape, 4, prof, fixed={"stages": "4,4", "pp": 4})
    with pytest.raises(ConfigError, match="unknown fixed choice"):
        choose_batch(shape, 4, prof, fixed={"tp": 2})
