"""The node-sequence planner's Profile step (plexgt/plan/batch_profile.py) and the profile
file's ``batch`` table: fits that recover what generated the samples, a measurement that
runs the registry's real block and gives every cp a positive fit, and a table that reads
back as measured at its own shape and carried by counted ratios to another."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from plexgt.plan.batch_cost import BatchShape, BlockFit, default_profile
from plexgt.plan.batch_profile import fit_blocks, fit_rows, measure_batch_profile
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
    prof, raw = measure_batch_profile(SHAPE, cps=(1, 2), repeats=1, memory=False)
    assert {int(r[0]) for r in raw["block"]} == {1, 2}
    for cp in (1, 2):
        f = prof.block_fit(cp)
        assert min(f.per_call_s, f.per_row_s, f.per_score_s) >= 0
        assert f.time(2, 8 + 1, 17) > 0
    assert prof.optimizer_s_per_param > 0
    table = profile_table(prof, SHAPE)
    assert from_table(table, SHAPE) == replace(prof, host=from_table(table, SHAPE).host)
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
