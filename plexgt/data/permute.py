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

Methods (``plexgt prep --permutation``): ``random`` (uniform, Plexus), ``degree`` (stratified
by degree: heavy nodes spread evenly over every block of every split), ``balanced`` (degree,
then refined by local search on the edges until the blocks of one split hold equal nonzero
counts: below 1.001 max/mean where random leaves 1.07-1.11 on graphs of ~1M edges).
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


#: refinement rounds (one P step and one Q step each) and pair sweeps per step, at most
BALANCE_ROUNDS = 6
BALANCE_SWEEPS = 40
#: at most this many swap candidates per block pair and sweep
BALANCE_CANDIDATES = 4096


def _side_vectors(dst: np.ndarray, src: np.ndarray, other: np.ndarray, g: int, n: int
                  ) -> np.ndarray:
    """[N, 2g] float64 (exact counts): what node u adds to its block on one side.

    For the P side (``other`` = Q block of every node): columns [0, g) count u's in-edges
    (A1 row u) by the Q block of their source, columns [g, 2g) its out-edges (A2 column u) by
    the Q block of their target; i.e. u's share of row block bp(u) of A1 and of column block
    bp(u) of A2. The Q side is the same with P and Q exchanged.
    """
    v = np.empty((n, 2 * g), dtype=np.float64)
    v[:, :g] = np.bincount(dst * g + other[src], minlength=n * g).reshape(n, g)
    v[:, g:] = np.bincount(src * g + other[dst], minlength=n * g).reshape(n, g)
    return v


def _smallest(x: np.ndarray, k: int) -> np.ndarray:
    """``np.argsort(x, kind="stable")[:k]`` in O(len(x)): the k smallest, ties by index."""
    if k >= x.size:
        return np.argsort(x, kind="stable")
    thr = np.partition(x, k - 1)[k - 1]
    idx = np.flatnonzero(x < thr)
    idx = np.concatenate([idx, np.flatnonzero(x == thr)[: k - idx.size]])
    return idx[np.argsort(x[idx], kind="stable")]


def _refine_side(pos: np.ndarray, v: np.ndarray, s: int, g: int, sweeps: int) -> int:
    """Swap nodes between the g blocks of ``pos`` (in place) to even out their sums of ``v``.

    ``pos`` [N] is a position array (original id -> new position), block = pos // s; ``v``
    [N, 2g] the node vectors of :func:`_side_vectors`. Objective: the sum of squares of all
    block sums S[a] = sum of v over block a (the totals are fixed, so this is their spread).
    For each block pair (a, b) every node gets the gain of moving alone to the other block,
    2 v.(S_other - S_own) + 2|v|^2; the best movers of each side are paired in order of gain
    (a pair of two improving moves is an improving swap) and the prefix of pairs whose
    cumulative effect lowers the objective most is applied exactly. Swapped nodes exchange
    positions, so block sizes never change. Returns the number of swaps.

    All arithmetic is on integers held exactly in float64 (while nnz * max degree and the
    squared block sums stay below 2^53), so the result does not depend on the BLAS or its
    summation order.
    """
    own = pos // s
    order = np.argsort(own, kind="stable")
    members = np.split(order, np.searchsorted(own[order], np.arange(1, g)))
    sq = np.einsum("ij,ij->i", v, v)
    big = np.stack([v[m].sum(0) for m in members])
    pairs = [(a, b) for a in range(g) for b in range(a + 1, g)]
    swaps = 0
    for _ in range(sweeps):
        # [g, N]: S_b . v_u as of the sweep's start; later pairs of the sweep rank their
        # candidates by it (slightly stale), but accept swaps on the exact current sums
        dots = big @ v.T
        moved = 0
        for a, b in pairs:
            ma, mb = members[a], members[b]
            if not ma.size or not mb.size:
                continue
            # half the gain of moving u: a -> b, and of w: b -> a (lower is better)
            ga = sq[ma] - dots[a, ma] + dots[b, ma]
            gb = sq[mb] - dots[b, mb] + dots[a, mb]
            if ga.min() + gb.min() >= 0:
                continue
            k = min(ma.size, mb.size, BALANCE_CANDIDATES)
            ia, ib = _smallest(ga, k), _smallest(gb, k)
            k = int(np.count_nonzero(ga[ia] + gb[ib] < 0))  # nondecreasing: a prefix
            ia, ib = ia[:k], ib[:k]
            cum = np.cumsum(v[mb[ib]] - v[ma[ia]], axis=0)  # what block a gains, swap by swap
            f = (np.einsum("ij,ij->i", big[a] + cum, big[a] + cum)
                 + np.einsum("ij,ij->i", big[b] - cum, big[b] - cum))
            j = int(np.argmin(f))
            if f[j] >= big[a] @ big[a] + big[b] @ big[b] - 0.5:
                continue
            u, w = ma[ia[: j + 1]], mb[ib[: j + 1]]
            pos[u], pos[w] = pos[w], pos[u].copy()
            ma[ia[: j + 1]], mb[ib[: j + 1]] = w, u
            big[a] += cum[j]
            big[b] -= cum[j]
            moved += j + 1
        swaps += moved
        if not moved:
            break
    return swaps


def block_counts(src: np.ndarray, dst: np.ndarray, pinv: np.ndarray, qinv: np.ndarray,
                 n: int, g: int) -> tuple[np.ndarray, np.ndarray]:
    """([g, g], [g, g]) nonzeros per block of A1 and A2 for blocks of ceil(n/g) (block_bounds)."""
    s = -(-n // g)
    b1 = np.bincount((pinv[dst] // s) * g + qinv[src] // s, minlength=g * g).reshape(g, g)
    b2 = np.bincount((qinv[dst] // s) * g + pinv[src] // s, minlength=g * g).reshape(g, g)
    return b1, b2


def balanced_permutations(src: np.ndarray, dst: np.ndarray, n: int, blocks: int, seed: int,
                          rounds: int = BALANCE_ROUNDS, sweeps: int = BALANCE_SWEEPS
                          ) -> tuple[np.ndarray, np.ndarray, dict]:
    """(perm_p, perm_q, info): degree-stratified P, Q refined until A1's and A2's blocks balance.

    ``src``, ``dst``: the nonzeros of A exactly as stored (duplicates merged, self loops added:
    :func:`processed_edges`), so the counts balanced are the tiles' nnz. ``blocks``: the split
    balanced, ``blocks`` x ``blocks`` blocks of ceil(n/blocks) rows and columns (as
    grid.block_bounds and the prep tiles cut N); coarser splits whose blocks are unions of
    these (blocks / 2, / 4, ...) inherit the balance up to a row at each boundary.

    Why: uniform or stratified permutations leave a sampling imbalance of ~2.4/sqrt(nnz per
    block) (1.02-1.1 on graphs of ~1M edges), which no permutation drawn independently of the
    edges can beat. Starting from the stratified P, Q, alternate: with Q fixed, swap pairs of
    nodes between P blocks (:func:`_refine_side`; a P block is a row block of A1 and a column
    block of A2, so both are balanced at once), then the same for Q with P fixed; every step
    lowers sum(B1^2) + sum(B2^2) over the block counts B1, B2. Deterministic for a seed.
    Memory O(N * blocks + E); time ~ rounds * sweeps * N * blocks.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    weights = np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)
    p, q = degree_permutations(weights, seed)
    g = max(1, min(int(blocks), n))
    info: dict = {"blocks": g, "rounds": 0, "swaps": 0}
    if g == 1:
        return p, q, info
    s = -(-n // g)
    pinv, qinv = inverse(p), inverse(q)

    def imbalance() -> float:
        b1, b2 = block_counts(src, dst, pinv, qinv, n, g)
        mean = max(b1.mean(), 1e-300)
        return float(max(b1.max(), b2.max()) / mean)

    info["imbalance_start"] = imbalance()
    for _ in range(rounds):
        moved = _refine_side(pinv, _side_vectors(dst, src, qinv // s, g, n), s, g, sweeps)
        moved += _refine_side(qinv, _side_vectors(dst, src, pinv // s, g, n), s, g, sweeps)
        info["rounds"] += 1
        info["swaps"] += moved
        if not moved:
            break
    info["imbalance"] = imbalance()
    return inverse(pinv), inverse(qinv), info


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


def process_edges(src: np.ndarray, dst: np.ndarray, n: int, symmetrize: bool, self_loops: bool
                  ) -> tuple[np.ndarray, np.ndarray]:
    """What prep stores of the edges src -> dst: symmetrised, self loops added, deduplicated."""
    if symmetrize:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    if self_loops:
        ids = np.arange(n, dtype=np.int64)
        src, dst = np.concatenate([src, ids]), np.concatenate([dst, ids])
    return dedup_edges(src, dst, n)


def processed_edges(g: GraphData, symmetrize: bool, self_loops: bool
                    ) -> tuple[np.ndarray, np.ndarray]:
    """In memory, what prep stores: (src, dst) after symmetrising, self loops and dedup."""
    return process_edges(g.src, g.dst, g.num_nodes, symmetrize, self_loops)


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


def _mix(x: np.ndarray) -> np.ndarray:
    x = x + _GOLD
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def edge_hash(dst: np.ndarray, src: np.ndarray, n: int, features: np.ndarray | None = None
              ) -> int:
    """Order-independent 64-bit hash of an edge set: sum of splitmix64(dst * N + src) mod 2^64
    (with ``features`` [E, F_e] float32, each edge's hash chained through its features' bits).

    Why: verify checks A2 against A1 (and symmetry) out of core, one tile at a time, by
    comparing the hashes of the original-id edge sets they encode (and the features each
    edge carries in both).
    """
    x = _mix(dst.astype(np.uint64) * np.uint64(n) + src.astype(np.uint64))
    if features is not None:
        bits = np.ascontiguousarray(features, dtype=np.float32).view(np.uint32)
        for k in range(bits.shape[1]):
            x = _mix(x ^ bits[:, k].astype(np.uint64))
    return int(np.sum(x, dtype=np.uint64))
