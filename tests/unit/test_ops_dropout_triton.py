"""GPU dropout in one Triton pass draws exactly the counter form's bits (plexgt.ops.rng).

The GPU dispatch is selected by declaring the CPU a GPU type (``attention_triton.GPU_TYPES``,
as tests/unit/test_attention_strategies_fused.py does); the kernel then runs under Triton's
interpreter and is compared with the int64 tensor form of the hash, bit for bit: the kept set,
the multipliers, x · multipliers (signed zeros and NaNs included) and the gradient.
"""

from __future__ import annotations

import pytest
import torch

from plexgt.ops import attention_triton, dropout_triton
from plexgt.ops.rng import CounterRNG

pytestmark = [
    pytest.mark.skipif(attention_triton.triton is None
                       or not (torch.cuda.is_available() or attention_triton.interpreted()),
                       reason="needs a GPU or Triton's interpreter"),
    pytest.mark.timeout(120),
]
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ROWS = torch.tensor([0, 5, 2**31 + 7, 2**33 + 1, 110_000_000, 3, 99, 2**32 - 1, 17])
# (seed, step, site, col0, p, m): seeds past 2^32, column offsets, rates whose cut rounds to 0
# (everything kept) and to 2^32 (nothing kept), widths across tile edges
DRAWS = [(0, 0, 0, 0, 0.5, 1), (2**40 + 3, 17, 9, 100, 0.1, 300),
         (7, 2**33, 2, 2**31 + 5, 0.9, 257), (1, 1, 1, 3, 1e-12, 40),
         (5, 2, 4, 0, 1.0 - 1e-11, 33)]


def _bits(x: torch.Tensor) -> torch.Tensor:
    """The stored bits, NaNs mapped to one pattern (their payload is not torch's contract:
    CUDA and x86 make different ones)."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    return torch.where(x.isnan(), torch.zeros((), dtype=ints), x.view(ints))


def _declare_gpu(monkeypatch) -> None:
    if DEV.type == "cpu":
        monkeypatch.setattr(attention_triton, "GPU_TYPES", ("cpu",))


def _inputs(n: int, m: int, dtype: torch.dtype) -> torch.Tensor:
    """[n, m] with negatives, infinities and a NaN (x·0 keeps the sign, inf·0 is NaN), stored
    transposed (the kernel takes any strides)."""
    x = torch.randn(m, n, generator=torch.Generator().manual_seed(n * m), dtype=torch.float64)
    x.view(-1)[:3] = torch.tensor([float("inf"), -float("inf"), float("nan")])[: x.numel()]
    return x.to(dtype).t()


@pytest.mark.parametrize("dtype", dropout_triton.DTYPES)
def test_triton_dropout_draws_the_counter_forms_bits(dtype, monkeypatch):
    for seed, step, site, col0, p, m in DRAWS:
        rng = CounterRNG(seed, step, ROWS.to(DEV))
        x = _inputs(len(ROWS), m, dtype).to(DEV).requires_grad_()
        keep = rng.keep(site, m, col0, p, DEV)
        mult = rng.multipliers(site, m, col0, p, dtype, DEV, use_native=False)
        want = x * mult
        dy = _inputs(len(ROWS), m, dtype).to(DEV).flip(0)
        (want_dx,) = torch.autograd.grad(want, x, dy)
        with monkeypatch.context() as mp:
            _declare_gpu(mp)
            assert dropout_triton.serves(DEV, dtype)
            got_mult = rng.multipliers(site, m, col0, p, dtype, DEV)
            got = rng.dropout(x, p, site, col0)
            (got_dx,) = torch.autograd.grad(got, x, dy)
        what = f"seed {seed} step {step} site {site} col0 {col0} p {p} m {m}"
        assert torch.equal(got_mult != 0, keep), what
        assert torch.equal(_bits(got_mult), _bits(mult)), what
        assert torch.equal(got.isnan(), want.isnan()), what
        assert torch.equal(_bits(got), _bits(want)), what
        assert torch.equal(_bits(got_dx), _bits(want_dx)), what


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_sparse_dropout_draws_the_dense_matrix_bits(dtype, monkeypatch):
    g = torch.Generator().manual_seed(4)
    num = 700
    row_index = torch.randint(0, len(ROWS), (num,), generator=g).to(DEV)
    cols = torch.randint(0, 5000, (num,), generator=g, dtype=torch.int32).to(DEV)
    values = torch.randn(num, generator=g).to(dtype).to(DEV).requires_grad_()
    for seed, step, site, _, p, _ in DRAWS:
        rng = CounterRNG(seed, step, ROWS.to(DEV))
        want = rng.dropout_values(values, row_index, cols, p, site)
        (want_dv,) = torch.autograd.grad(want, values, torch.ones_like(want))
        with monkeypatch.context() as mp:
            _declare_gpu(mp)
            got = rng.dropout_values(values, row_index, cols, p, site)
            (got_dv,) = torch.autograd.grad(got, values, torch.ones_like(got))
        assert torch.equal(_bits(got), _bits(want)), (seed, p)
        assert torch.equal(_bits(got_dv), _bits(want_dv)), (seed, p)


def test_gpu_dispatch_takes_the_kernel_and_the_cpu_keeps_its_own(monkeypatch):
    calls = []
    real = dropout_triton._dropout_op
    monkeypatch.setattr(dropout_triton, "_dropout_op",
                        lambda *a: calls.append(a[-1]) or real(*a))
    monkeypatch.setenv("PLEXGT_NATIVE", "0")  # the tensor form: no C++ build in this test
    rng = CounterRNG(3, 4, ROWS)
    x = torch.randn(len(ROWS), 20, requires_grad=True)
    cpu = rng.dropout(x, 0.3, site=2)
    assert calls == [] and not dropout_triton.serves(torch.device("cpu"), torch.float32)
    monkeypatch.setattr(attention_triton, "GPU_TYPES", ("cpu",))
    assert dropout_triton.serves(torch.device("cpu"), torch.float32) \
        == attention_triton.interpreted()
    if not attention_triton.interpreted():
        return
    got = rng.dropout(x, 0.3, site=2)
    assert calls == [True]  # one pass: x read, the product written
    got.sum().backward()
    assert calls == [True, True]  # backward recomputes the multipliers: nothing [n, m] kept
    assert torch.equal(got, cpu)
    assert not dropout_triton.serves(torch.device("cpu"), torch.int64)
