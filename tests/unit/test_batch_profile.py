"""The node-sequence planner's Profile step (plexgt/plan/batch_profile.py) and the profile
file's ``batch`` table: fits that recover what generated the samples, a measurement that
runs the registry's real block and gives every cp a positive fit, and a table that reads
back as measured at its own shape and carried by counted ratios to another."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from plexgt.plan.batch_cost import stage_costs
from plexgt.plan.batch_fits import BlockFit, default_profile
from plexgt.plan.batch_profile import (
    fit_batch_profile,
    fit_blocks,
    fit_rows,
    measure_batch_profile,
    memory_samples,
    sampler_bytes,
    with_collectives,
)
from plexgt.plan.batch_shape import BatchMesh, BatchShape
from plexgt.plan.batch_table import from_table, profile_table

SHAPE = BatchShape(layers=2, hidden=16, heads=2, size=16, sequences=2, features=8,
                   classes=3, targets=4, global_nodes=1)


def test_fit_blocks_recovers_the_terms_that_made_the_samples():
    """Samples made exactly by a BlockFit per cp (rows = N'/cp + N_s, cols = N' + N_s) fit
    back to it: the regression's columns are the model's own."""
    truth = {1: BlockFit(1e-3, 2e-6, 3e-9), 2: BlockFit(2e-3, 1e-6, 5e-9)}
    samples = []
    for cp, f in truth.items():
        for b in (1, 2, 4):
            for n in (32, 64, 128):
                rows, cols = n // cp + SHAPE.global_nodes, n + SHAPE.global_nodes
                samples.append([cp, b, n, f.time(b, rows, cols)])
    got = fit_blocks(samples, SHAPE)
    for cp, f in truth.items():
        assert got[cp].per_call_s == pytest.approx(f.per_call_s, rel=1e-6)
        assert got[cp].per_row_s == pytest.approx(f.per_row_s, rel=1e-6)
        assert got[cp].per_score_s == pytest.approx(f.per_score_s, rel=1e-6)
    rows = [[b, r, 5e-4 + 7e-7 * b * r] for b in (1, 3) for r in (10, 40, 90)]
    f = fit_rows(rows)
    assert (f.per_call_s, f.per_row_s) == (pytest.approx(5e-4), pytest.approx(7e-7))


def test_a_measured_profile_prices_every_cp_and_reads_back_from_its_table():
    prof, raw = measure_batch_profile(SHAPE, cps=(1, 2), repeats=1, memory=False,
                                      contention={2: 1.3, 4: 2.4})
    assert {int(r[0]) for r in raw["block"]} == {1, 2}
    assert prof.contention == {2: 1.3, 4: 2.4}  # the run's own κ, kept by the table below
    for cp in (1, 2):
        f = prof.block_fit(cp)
        assert min(f.per_call_s, f.per_row_s, f.per_score_s) >= 0
        assert f.time(2, 8 + 1, 17) > 0
    assert prof.optimizer_s_per_param > 0
    table = profile_table(prof, SHAPE)
    assert from_table(table, SHAPE) == replace(prof, host=from_table(table, SHAPE).host)
    assert from_table(table, SHAPE).contention == {2: 1.3, 4: 2.4}
    # at twice the width, each per-row term scales by what the counts scale it by; the
    # per-call terms are kept
    wide = replace(SHAPE, hidden=32)
    got = from_table(table, wide)
    a, b = default_profile(SHAPE).block_fit(1), default_profile(wide).block_fit(1)
    m = prof.block_fit(1)
    assert got.block_fit(1).per_call_s == m.per_call_s
    assert got.block_fit(1).per_row_s == pytest.approx(m.per_row_s * b.per_row_s / a.per_row_s)
    assert "carried from hidden 16" in got.source
    assert np.isfinite(got.block_fit(2).per_row_s)
    assert got.block_samples == {}  # measured at another width: the fits carry, not samples


def test_a_block_measured_at_a_micro_batch_is_priced_as_measured_there():
    """Where the profile timed (P_cp, B, N') the block costs what was measured (a working
    set the linear fit misses), read back from the table; elsewhere the fit."""
    samples = [[cp, b, n, 1e-3 + 1e-6 * b * n * (1.0 + 0.5 * (b == 4))]
               for cp in (1, 2) for b in (1, 2, 4) for n in (32, 64)]
    raw = {"block": samples, "embed": [[1, 8, 1e-4], [2, 8, 2e-4]],
           "head": [[1, 4, 1e-4], [2, 4, 2e-4]], "optimizer_s_per_param": 1e-9}
    prof = fit_batch_profile(default_profile(SHAPE), raw, SHAPE)
    ns = SHAPE.global_nodes
    for cp, b, n, t in samples:
        assert prof.block_seconds(cp, b, n // cp + ns, n + ns) == t
    fit = prof.block_fit(1).time(3, 32 + ns, 32 + ns, 1)
    assert prof.block_seconds(1, 3, 32 + ns, 32 + ns) == fit  # not sampled: the fit
    back = from_table(profile_table(prof, SHAPE), SHAPE)
    assert back.block_samples == prof.block_samples
    other_input = from_table(profile_table(prof, SHAPE), replace(SHAPE, features=99, classes=7))
    assert other_input.block_samples == prof.block_samples  # a block never sees them
    mesh = BatchMesh(1, 1, 1, 1)
    big = replace(SHAPE, size=64, sequences=4)
    one = stage_costs(big, fit_batch_profile(default_profile(big), raw, big), mesh)
    assert one.block_s == pytest.approx(samples[5][3] * one.profile.compute_factor(1))


def test_memory_samples_discard_the_processs_first_measurement():
    """A process's first training step grows it once (measured here: 130 MiB for a stage
    measured first, 38 MiB measured again); the predicted runs pay that in their warm-up,
    so the first measurement is thrown away (without it, the fit took the inflated one)."""
    calls = []

    def peak(shape, mesh, n, pos, dropout):
        calls.append((mesh, n, pos))
        return 100 if len(calls) == 1 else 10

    got = memory_samples(SHAPE, peak=peak, points=((1, 1, 1, 2, 3), (2, 1, 1, 2, 3)))
    assert [r[-1] for r in got] == [10, 10]
    assert len(calls) == 3 and calls[0] == calls[1]


class _Sampler:
    """Builds a sequence by touching its own 4 MiB cache; the first sequence any instance
    builds in the process also fills 24 MiB of process-wide state, as the real sampler's
    first use maps the graph's files and numpy's/scipy's first-use state."""

    shared: list = []

    def __init__(self) -> None:
        self.batch = SHAPE_BATCH
        self.cache: list = []

    def sequences(self, split: str) -> int:
        return 8

    def sequence(self, split: str, epoch: int, index: int) -> None:
        if not _Sampler.shared:
            _Sampler.shared.append(np.ones(24 << 18, dtype=np.float32))
        if not self.cache:
            self.cache.append(np.ones(4 << 18, dtype=np.float32))


class _Batch:
    sequences = 2


SHAPE_BATCH = _Batch()


def test_sampler_bytes_count_the_cache_not_the_processs_first_use():
    _Sampler.shared.clear()
    warm = sampler_bytes(_Sampler(), warm=_Sampler())
    assert 3 << 20 < warm < 8 << 20  # the cache's 4 MiB (and the allocator's rounding)
    _Sampler.shared.clear()
    cold = sampler_bytes(_Sampler())
    assert cold > 26 << 20  # without a warm-up, the 24 MiB of first use counted too


def test_the_ring_is_priced_from_gacps_exchanges_when_measured():
    coll = {"p2p": [[4096.0, 3e-4], [1 << 20, 3e-3]],
            "allreduce": {"2": [[4096.0, 4e-4], [1 << 20, 3e-3]]}}
    prof = default_profile(SHAPE)
    plain = with_collectives(prof, coll)
    assert plain.ring == plain.p2p
    ring = [[65536.0, 1.5e-3], [262144.0, 2.0e-3], [524288.0, 2.5e-3]]
    got = with_collectives(prof, {**coll, "ring": ring})
    assert got.p2p == plain.p2p
    assert got.ring.time(262144) == pytest.approx(2.0e-3, rel=0.05)
    assert got.ring.time(262144) > 3 * plain.ring.time(262144) / 2
