"""GA-CP's ring exchanges measured on a real group of ranks 0 and 1
(:func:`plexgt.plan.batch_profile.ring_samples`): every rank gets the same rows, one per
(B, N') point, each the bytes of one K/V exchange and a positive time for it; node sharing
(:func:`~plexgt.plan.batch_profile.contention_samples`): every rank the same κ per size the
world holds."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from plexgt.plan.batch_profile import RING_FLOOR_S, contention_samples, ring_samples
from plexgt.plan.batch_shape import BatchShape

from .conftest import WORLD

pytestmark = pytest.mark.timeout(300)

SHAPE = BatchShape(layers=2, hidden=16, heads=2, size=16, sequences=2, features=8,
                   classes=3, targets=4, global_nodes=1)


@pytest.mark.skipif(WORLD < 2, reason="needs a real group of 2")
def test_ring_samples_time_the_exchanges_on_a_real_group(dist_ctx):
    got = ring_samples(SHAPE, repeats=2, points=((1, 16), (2, 32)))
    assert [b for b, _ in got] == [2 * 1 * 8 * 16 * 4, 2 * 2 * 16 * 16 * 4]
    assert all(RING_FLOOR_S <= t < 1.0 for _, t in got)


def test_ring_samples_need_a_world(dist_ctx):
    if WORLD < 2:
        assert ring_samples(SHAPE) == []


def test_contention_is_measured_for_the_sizes_the_world_holds(dist_ctx):
    got = contention_samples(SHAPE, repeats=3, ranks=(2, 4, 64), seconds=0.01)
    if WORLD < 2:
        assert got == {}
        return
    assert set(got) == {p for p in (2, 4) if p <= WORLD}  # 64: no such world
    assert all(0.2 < k < 100 for k in got.values())  # a ratio of like times, not seconds
    seen: list = [None] * WORLD
    dist.all_gather_object(seen, got)
    assert all(s == got for s in seen)
