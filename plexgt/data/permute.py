"""The double permutation of Plexus: A1 = P A Q^T and A2 = Q A P^T.

A is the aggregation matrix, A[dst, src] = 1 (row = destination). P and Q are independent
seeded random permutations of the N nodes, stored as arrays ``perm_p``/``perm_q`` mapping new
position -> original id (P[i, perm_p[i]] = 1). So::

    A1[i, j] = A[perm_p[i], perm_q[j]]     consumes node data in Q order, produces P order
    A2[i, j] = A[perm_q[i], perm_p[j]]     consumes P order, produces Q order

Layer 0 uses A1 (input features are stored in Q order), layer 1 A2, alternating, so no layer
ever re-permutes its activations. Why two permutations and not one: a single symmetric
permutation P A P^T leaves the diagonal blocks correlated with the diagonal of A (hubs with
self loops, community structure near the diagonal); independent P and Q make every block's
nonzero count concentrate at nnz / G^2 (Plexus: max/mean 7.70 -> 1.001 on ogbn-papers100M).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from plexgt.data.graph import GraphData, dedup_edges


def permutations(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(perm_p [N], perm_q [N]) int64, new position -> original id, independent streams."""
    p = np.random.default_rng([seed, 1]).permutation(n).astype(np.int64)
    q = np.random.default_rng([seed, 2]).permutation(n).astype(np.int64)
    return p, q


def van_der_corput(n: int) -> np.ndarray:
    """[n] float64: the base-2 van der Corput sequence (bit-reversed k / 2^bits), k = 0..n-1.

    Every prefix of it is spread evenly over [0, 1): any interval holds its share of the
    first k points up to O(log k), whatever the interval. That is what makes the degree
    stratified permutation balanced for every block split at once, not one grid.
    """
    k = np.arange(n, dtype=np.uint64)
    out = np.zeros(n, dtype=np.float64)
    f = 0.5
    while k.any():
        out += f * (k & np.uint64(1))
        k >>= np.uint64(1)
        f *= 0.5
    return out


def stratified_permutation(weights: np.ndarray, seed: list[int]) -> np.ndarray:
    """[N] new position -> original id: heavy nodes spread evenly over the positions.

    Nodes are ranked by weight (degree), heaviest first, ties in random order; rank k goes to
    the position of the k-th van der Corput point after a random rotation. Any contiguous
    range of positions (any block of any grid) then gets its share of every degree stratum,
    so block nonzero counts no longer depend on where the few hubs happened to land (the
    residual imbalance of uniform permutations on small power-law graphs).
    """
    n = weights.shape[0]
    rng = np.random.default_rng(seed)
    ranked = np.lexsort((rng.random(n), -np.asarray(weights, dtype=np.float64)))
    key = (van_der_corput(n) + rng.random()) % 1.0
    return ranked[np.argsort(key, kind="stable")].astype(np.int64)


def degree_permutations(weights: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(perm_p, perm_q) stratified by ``weights`` with independent tie-breaks and rotations."""
    return (stratified_permutation(weights, [seed, 3]),
            stratified_permutation(weights, [seed, 4]))


def inverse(perm: np.ndarray) -> np.ndarray:
    """[N] original id -> new position."""
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.shape[0], dtype=perm.dtype)
    return inv


def is_permutation(perm: np.ndarray, n: int) -> bool:
    """True when ``perm`` holds each of 0..n-1 exactly once."""
    if perm.shape != (n,) or (n and (perm.min() < 0 or perm.max() >= n)):
        return False
    return bool(np.all(np.bincount(perm, minlength=n) == 1))


def permute_edges(src: np.ndarray, dst: np.ndarray, pinv: np.ndarray, qinv: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Coordinates of the edges src -> dst in A1 and A2: (r1, c1, r2, c2)."""
    return pinv[dst], qinv[src], qinv[dst], pinv[src]


def processed_edges(g: GraphData, symmetrize: bool, self_loops: bool
                    ) -> tuple[np.ndarray, np.ndarray]:
    """In memory, what prep stores: (src, dst) after symmetrising, self loops and dedup."""
    src, dst = g.src, g.dst
    if symmetrize:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    if self_loops:
        ids = np.arange(g.num_nodes, dtype=np.int64)
        src, dst = np.concatenate([src, ids]), np.concatenate([dst, ids])
    return dedup_edges(src, dst, g.num_nodes)


def reference_matrices(g: GraphData, seed: int, symmetrize: bool = False,
                       self_loops: bool = True) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """(A1, A2) built in memory: the oracle the prepared tiles are tested against."""
    n = g.num_nodes
    src, dst = processed_edges(g, symmetrize, self_loops)
    p, q = permutations(n, seed)
    pinv, qinv = inverse(p), inverse(q)
    ones = np.ones(src.shape[0], dtype=np.float32)
    a1 = sp.csr_matrix((ones, (pinv[dst], qinv[src])), shape=(n, n))
    a2 = sp.csr_matrix((ones, (qinv[dst], pinv[src])), shape=(n, n))
    a1.sort_indices()
    a2.sort_indices()
    return a1, a2


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def edge_hash(dst: np.ndarray, src: np.ndarray, n: int) -> int:
    """Order-independent 64-bit hash of an edge set: sum of splitmix64(dst * N + src) mod 2^64.

    Why: verify checks A2 against A1 (and symmetry) out of core, one tile at a time, by
    comparing the hashes of the original-id edge sets they encode.
    """
    x = dst.astype(np.uint64) * np.uint64(n) + src.astype(np.uint64) + _GOLD
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    x ^= x >> np.uint64(31)
    return int(np.sum(x, dtype=np.uint64))
