"""Counter-based dropout: masks are a pure function of (seed, step, site, node id, column).

What the distributed models rely on: a block of rows and columns draws exactly the block of the
whole activation's mask, a sparse matrix's stored entries draw what the dense matrix draws, and
a model run on permuted rows (with their node ids) is the permuted run.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from plexgt.models.gps import GPS
from plexgt.models.gt import GraphTransformer
from plexgt.models.layers import Drop, ModelGraph, sparse_features
from plexgt.ops import native
from plexgt.ops.rng import M32, CounterRNG, mix32, mix32_, threshold

CPU = torch.device("cpu")


def _keep_scalar(seed: int, step: int, site: int, row: int, col: int, p: float) -> bool:
    """The documented keep/drop decision in plain Python integers (the specification)."""
    k = mix32(seed ^ mix32((seed >> 32) ^ mix32(step ^ mix32(site))))
    kr, kc = mix32(k ^ 0x5EED), mix32(k ^ 0xC011)
    hr = mix32(mix32((row & M32) ^ kr) ^ (row >> 32))
    hc = mix32((col & M32) ^ kc)
    return mix32(hr ^ hc) >= threshold(p)


def test_tensor_hash_equals_the_integer_hash_without_overflow():
    x = torch.cat([torch.tensor([0, 1, M32, M32 - 1, 0x80000000]),
                   torch.randint(0, M32 + 1, (4000,), dtype=torch.int64,
                                 generator=torch.Generator().manual_seed(0))])
    got = mix32_(x.clone())
    assert got.tolist() == [mix32(int(v)) for v in x]
    assert int(got.min()) >= 0 and int(got.max()) <= M32


def test_keep_equals_the_specification_entry_by_entry():
    rows = torch.tensor([0, 5, 2**31 + 7, 2**33 + 1, 110_000_000])
    rng = CounterRNG(seed=2**40 + 3, step=17, rows=rows)
    keep = rng.keep(site=9, m=6, col0=100, p=0.4, device=CPU)
    want = [[_keep_scalar(2**40 + 3, 17, 9, int(r), 100 + j, 0.4) for j in range(6)]
            for r in rows]
    assert keep.tolist() == want


def test_a_block_of_rows_and_columns_draws_the_block_of_the_whole_mask():
    n, m = 97, 23
    whole = CounterRNG(5, 3, torch.arange(n)).keep(2, m, 0, 0.5, CPU)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    for rows in (perm[:40], perm[40:], torch.arange(10, 11)):
        for c0, c1 in ((0, 23), (7, 15), (22, 23)):
            part = CounterRNG(5, 3, rows).keep(2, c1 - c0, c0, 0.5, CPU)
            assert torch.equal(part, whole[rows][:, c0:c1])


def test_sparse_entries_draw_what_the_dense_matrix_draws():
    dense = sp.random(30, 40, density=0.2, format="csr", random_state=3, dtype=np.float64)
    x = sparse_features(dense, dtype=torch.float64)
    drop = Drop(CounterRNG(1, 4, torch.arange(30)), 0.3, site=0)
    got = drop.features(x)
    want = drop(torch.from_numpy(dense.toarray()))
    back = sp.csr_matrix((got.values.numpy(), got.indices.numpy(), got.indptr.numpy()),
                         shape=(30, 40)).toarray()
    torch.testing.assert_close(torch.from_numpy(back), want, rtol=0, atol=0)


def test_rate_and_independence_across_steps_sites_and_seeds():
    n, m, p = 2000, 500, 0.3
    base = CounterRNG(0, 0, torch.arange(n)).keep(0, m, 0, p, CPU)
    drop_rate = 1 - base.double().mean().item()
    assert abs(drop_rate - p) < 5 * (p * (1 - p) / (n * m)) ** 0.5
    for other in (CounterRNG(0, 1, torch.arange(n)).keep(0, m, 0, p, CPU),
                  CounterRNG(0, 0, torch.arange(n)).keep(1, m, 0, p, CPU),
                  CounterRNG(1, 0, torch.arange(n)).keep(0, m, 0, p, CPU)):
        agree = (other == base).double().mean().item()
        assert abs(agree - (p * p + (1 - p) ** 2)) < 0.005  # as independent draws agree
    # neighbouring rows and columns are not correlated either
    a, b = base[:-1].double(), base[1:].double()
    assert abs(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()) < 0.01


def test_dropout_scales_kept_entries_and_p_zero_or_eval_is_the_identity():
    x = torch.randn(50, 8, dtype=torch.float64)
    rng = CounterRNG(0, 0, torch.arange(50))
    y = rng.dropout(x, 0.25, site=3)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / 0.75)
    assert rng.dropout(x, 0.0, site=3) is x
    assert Drop(None, 0.5)(x) is x
    with pytest.raises(ValueError, match="ids for 49"):
        CounterRNG(0, 0, torch.arange(49)).dropout(x, 0.5, site=0)


@pytest.mark.parametrize("cls", [GraphTransformer, GPS])
def test_a_model_on_permuted_rows_with_their_ids_is_the_permuted_model(cls):
    """The single-process form of grid invariance: relabelling the rows (and handing the model
    the original ids) permutes a training forward with dropout on, entry for entry."""
    n, f = 40, 6
    g = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, n, (200,), generator=g), torch.randint(0, n, (200,), generator=g)
    x = torch.randn(n, f, generator=g, dtype=torch.float64)
    perm = torch.randperm(n, generator=g)  # position -> original id
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(n)
    torch.manual_seed(3)
    model = cls(f, 8, 3, num_layers=2, heads=2, dropout=0.4, seed=3).double().train()
    ref = model(x, ModelGraph.from_edges(dst, src, n))
    model.step = 0
    pg = ModelGraph.from_edges(inv[dst], inv[src], n)
    pg.node_ids = perm
    got = model(x[perm], pg)
    torch.testing.assert_close(got, ref[perm], rtol=1e-10, atol=1e-12)
    assert model.step == 1
    model.step = 1
    assert not torch.allclose(model(x[perm], pg), got)  # the next step draws anew


@pytest.mark.skipif(native.load() is None, reason="compiled kernels unavailable here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_multipliers_equal_the_tensor_form(dtype):
    rng = CounterRNG(2**35 + 9, 12, torch.tensor([0, 3, 2**32 + 5, 77_000_000] * 40))
    for p, m, col0 in ((0.5, 37, 0), (0.1, 8, 1000), (0.9, 1, 5)):
        got = rng.multipliers(4, m, col0, p, dtype, CPU)
        want = rng.multipliers(4, m, col0, p, dtype, CPU, use_native=False)
        assert got.dtype == dtype and torch.equal(got, want)
