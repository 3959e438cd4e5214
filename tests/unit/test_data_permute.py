"""Permutation methods: valid, deterministic, and the block balance of ``balanced``."""

from __future__ import annotations

import numpy as np
import pytest

from plexgt.data.permute import (
    _refine_side,
    _side_vectors,
    balanced_permutations,
    block_counts,
    degree_permutations,
    inverse,
    is_permutation,
    permutations,
    processed_edges,
)
from plexgt.data.shard import default_balance_blocks
from plexgt.data.synthetic import rmat
from plexgt.distributed.grid import block_bounds
from tests.datagen import small_graph

pytestmark = pytest.mark.timeout(120)


def _imbalance(src, dst, p, q, n, g):
    b1, b2 = block_counts(src, dst, inverse(p), inverse(q), n, g)
    return max(b1.max(), b2.max()) / b1.mean()


@pytest.fixture(scope="module")
def skewed():
    """R-MAT, 2^14 nodes, 2^18 edges: ~4k nonzeros per 8x8 block, random leaves ~1.05+."""
    g = rmat(1 << 14, 1 << 18, seed=3)
    src, dst = processed_edges(g, symmetrize=False, self_loops=True)
    return g.num_nodes, src, dst


@pytest.mark.parametrize("n,blocks", [(37, 4), (100, 8), (101, 7), (10, 8), (6, 1), (6, 8)])
def test_balanced_is_a_permutation_with_unchanged_blocks(n, blocks):
    g = small_graph(n, 4 * n)
    src, dst = processed_edges(g, False, True)
    p, q, info = balanced_permutations(src, dst, n, blocks, seed=1)
    assert is_permutation(p, n) and is_permutation(q, n)
    assert p.dtype == q.dtype == np.int64
    b = info["blocks"]
    assert b == min(blocks, n)
    # block sizes are those of block_bounds: a position's block is position // ceil(n / b)
    size = -(-n // b)
    for perm in (p, q):
        own = inverse(perm) // size
        for i in range(b):
            lo, hi = block_bounds(n, b, i)
            assert np.count_nonzero(own == i) == hi - lo


def test_balanced_is_deterministic(skewed):
    n, src, dst = skewed
    p1, q1, i1 = balanced_permutations(src, dst, n, 8, seed=7)
    p2, q2, i2 = balanced_permutations(src.copy(), dst.copy(), n, 8, seed=7)
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(q1, q2)
    assert i1 == i2
    p3, _, _ = balanced_permutations(src, dst, n, 8, seed=8)
    assert not np.array_equal(p1, p3)


def test_balanced_beats_random_and_degree(skewed):
    n, src, dst = skewed
    deg = np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)
    p, q, info = balanced_permutations(src, dst, n, 8, seed=0)
    got = _imbalance(src, dst, p, q, n, 8)
    assert got == pytest.approx(info["imbalance"])
    assert info["swaps"] > 0 and info["imbalance_start"] > info["imbalance"]
    rnd = _imbalance(src, dst, *permutations(n, 0), n, 8)
    strat = _imbalance(src, dst, *degree_permutations(deg, 0), n, 8)
    assert got < strat < rnd
    assert got <= 1.01, (got, strat, rnd)
    # the coarser splits made of whole blocks inherit it
    assert _imbalance(src, dst, p, q, n, 4) <= 1.01
    assert _imbalance(src, dst, p, q, n, 2) <= 1.01


def test_refine_side_never_worsens(skewed):
    """One P step: the sum of squares of the block counts of A1 and A2 does not grow."""
    n, src, dst = skewed
    g, s = 8, -(-n // 8)
    deg = np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)
    p, q = degree_permutations(deg, 2)
    pinv, qinv = inverse(p), inverse(q)
    before = sum(float((b.astype(float) ** 2).sum())
                 for b in block_counts(src, dst, pinv, qinv, n, g))
    swaps = _refine_side(pinv, _side_vectors(dst, src, qinv // s, g, n), s, g, sweeps=3)
    after = sum(float((b.astype(float) ** 2).sum())
                for b in block_counts(src, dst, pinv, qinv, n, g))
    assert swaps > 0 and after < before
    assert is_permutation(inverse(pinv), n)


def test_default_balance_blocks():
    assert [default_balance_blocks(t) for t in (1, 2, 3, 4, 8, 12, 16, 24, 40, 100)] == \
        [8, 8, 24, 8, 8, 24, 16, 24, 40, 100]
