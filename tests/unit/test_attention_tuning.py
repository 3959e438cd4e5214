"""Autotuned launch configurations of the fused attention kernels.

On a GPU each edge launch is timed at a few candidate configurations (:func:`candidates`:
BLOCK_R, BLOCK_E, HG, STAGES, num_warps) on the first use of its key (d', heads, degree
bucket, flags, dtypes) and the fastest kept by ``triton.autotune``; under Triton's interpreter
and under ``torch.use_deterministic_algorithms`` one fixed configuration (:func:`blocks`).
Here the tuned path itself runs under the interpreter (timed by the wall clock): launches
that add into their outputs (the residual, ring blocks' dK/dV) must be restored after every
timed candidate, or the result holds several copies of y.
"""

import pytest
import torch

from plexgt.ops import attention_triton as at
from tests.unit.test_ops_attention_fused_bias import _inputs, _reference, _run
from tests.unit.test_ops_attention_hubs import NAMES, NR, hub_and_super_graph

pytestmark = [pytest.mark.skipif(at.triton is None, reason="triton is not installed"),
              pytest.mark.timeout(180)]


def test_candidates_start_at_the_fixed_blocks_and_keep_the_tile_cap():
    for d in (8, 16, 24, 64, 256):
        for h in (1, 3, 8):
            for degree in (1, 4, 32, 1024):
                configs = at.candidates(d, h, degree)
                base = at.blocks(1, degree, d, h)
                first = configs[0].kwargs
                assert (first["BLOCK_R"], first["BLOCK_E"], first["HG"]) == base[:3]
                assert len(configs) >= 2 and len(set(configs)) == len(configs)
                for c in configs:
                    br, be, hg = c.kwargs["BLOCK_R"], c.kwargs["BLOCK_E"], c.kwargs["HG"]
                    assert br * be * hg * base.block_d <= at.TILE_ELEMS, (d, h, degree, c)
                    assert all(x & (x - 1) == 0 for x in (br, be, hg))
                    assert hg <= base.heads and c.num_warps in at.TUNE_WARPS
                    assert c.kwargs["STAGES"] == at.EDGE_STAGES


def test_fixed_configuration_under_the_interpreter_and_deterministic_runs(monkeypatch):
    assert not at.tuning()  # the interpreter runs blocks()' configuration
    monkeypatch.setattr(at, "interpreted", lambda: False)
    assert at.tuning()
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not at.tuning()  # a timed choice could differ in a resumed run
    finally:
        torch.use_deterministic_algorithms(was)


def test_tuned_launches_equal_the_reference_and_restore_what_they_add_into(monkeypatch):
    """Two candidates per key (the fixed one and one with half the head group and twice the
    edges per step), hub rows and super columns split, bias, residual; then a ring block's
    backward adding dK/dV into given tensors. float64 against torch's kernels."""
    monkeypatch.setattr(at, "SPLIT_STEPS", 1)
    monkeypatch.setattr(at, "tuning", lambda: True)
    real = at.candidates

    def two(d, h, degree):
        c = real(d, h, degree)
        return [c[0], c[-1]]

    monkeypatch.setattr(at, "candidates", two)
    for tuned in (at.fwd_tuned, at.bwd_rows_tuned, at.bwd_cols_tuned):
        monkeypatch.setattr(tuned, "cache", {})
    graph = hub_and_super_graph()
    h, d = 3, 8
    args = _inputs(graph, h, d, torch.float64, seed=21)
    res = torch.randn(NR, h * d, dtype=torch.float64)
    y_ref, g_ref = _reference(graph, *args, 0.3, res)
    y, grads = _run(graph, *args, 0.3, "fused", res)
    for a, b, what in zip((y, *grads), (y_ref.reshape(y.shape), *g_ref), NAMES):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=what)
    for tuned in (at.fwd_tuned, at.bwd_rows_tuned, at.bwd_cols_tuned):
        assert len(tuned.cache) >= 2  # the light and the split launch, keyed apart
        assert all(c in two(d, h, key[2]) for key, c in tuned.cache.items())
    q, k, v = (t.clone() for t in args[:3])
    dy = args[5]
    yy, lse = at.fused_forward(graph, q, k, v, 0.3)
    dk0, dv0 = torch.randn_like(k), torch.randn_like(v)
    acc = (dk0.clone(), dv0.clone())
    at.fused_backward(graph, q, k, v, lse, at.row_delta(yy, dy), dy, 0.3,
                      (False, True, True), dkv=acc)
    _, dk, dv = at.fused_backward(graph, q, k, v, lse, at.row_delta(yy, dy), dy, 0.3,
                                  (False, True, True))[:3]
    torch.testing.assert_close(acc[0], dk0 + dk, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(acc[1], dv0 + dv, rtol=1e-12, atol=1e-12)
