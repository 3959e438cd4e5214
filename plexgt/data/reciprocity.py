"""How many of a graph's edges have their reverse: what ``--symmetrize auto`` decides from.

Why: an undirected graph published as an edge list usually lists each edge once (the
web-graph and heterophily benchmark files of issue 39 do), and a GNN trained on that one-sided
list silently loses accuracy (2.5 to 4.9 points there). Prep reads every edge anyway, so it
counts, over the distinct edges that are not self loops, the share whose reverse is present
(the *reciprocity*), and ``auto`` symmetrizes when that share is below
:data:`AUTO_SYMMETRIZE_BELOW`.

Scale: the count must not hold the edge list. Each rank keeps a *canonical-pair sample* of the
edges it streams: an edge (s, d) is kept when a hash of the unordered pair {s, d} falls below a
threshold, so an edge and its reverse are always kept or dropped together and the sample's
reciprocity is an unbiased estimate of the graph's. Up to :data:`SAMPLE_EDGES` edges the
threshold keeps everything and the count is exact; beyond, the sample holds about that many
edges (the standard error of the share is then below 0.14 points). Rank 0 gathers the
samples, counts, and broadcasts the decision: every rank takes the same one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plexgt.distributed.hostcomm import HostComm

AUTO_SYMMETRIZE_BELOW = 0.01
"""``--symmetrize auto`` adds the reverse edges when fewer than this share (1%) of the distinct
non-loop edges have their reverse. Why 1%: a file listing each undirected edge once has none
(a few stray duplicates at most), while a graph stored with both directions has all; a
genuinely directed graph with almost no reciprocated edge (a citation graph: a paper cites
only older ones) is one GNNs train on symmetrized anyway (``data_prep/ogbn-arxiv.sh``)."""

SAMPLE_EDGES = 1 << 17
"""Edges the sample aims at (over all ranks): exact below, about 2 MiB of edges on rank 0 (a
few MiB while it counts) beyond, so prep's memory stays bounded whatever the graph: with
131,072 sampled edges the share's standard error is at most 0.14 points, far inside the 1%
the decision needs. (4M edges, the first choice, grew a 2M-edge prep's peak memory by
197 MB: tests/unit/test_data_streaming.py bounds it at 16 MB.)"""

_FULL = (1 << 64) - 1
"""The threshold that keeps every edge."""


def pair_hash(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """[k] uint64 hash of each unordered pair {src, dst} (splitmix64 of min·φ + max): the same
    for an edge and its reverse, spread uniformly."""
    lo = np.minimum(src, dst).astype(np.uint64)
    hi = np.maximum(src, dst).astype(np.uint64)
    x = lo * np.uint64(0x9E3779B97F4A7C15) + hi
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def count_reciprocal(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[int, int]:
    """(distinct non-loop edges whose reverse is among them, distinct non-loop edges) of the
    edges src -> dst over ``n`` nodes, exactly (sorts them: O(k log k), in memory)."""
    keep = src != dst
    s, d = src[keep].astype(np.int64), dst[keep].astype(np.int64)
    if n <= 3_000_000_000:  # s * n + d fits an int64
        key = np.unique(s * n + d)
        rev = (key % n) * n + key // n
    else:  # a 64-bit hash of the ordered pair: collisions are negligible at any sample size
        fwd = pair_hash(s, d) ^ (s.astype(np.uint64) << np.uint64(1))
        bwd = pair_hash(d, s) ^ (d.astype(np.uint64) << np.uint64(1))
        key, idx = np.unique(fwd, return_index=True)
        rev = bwd[idx]
    if key.size == 0:
        return 0, 0
    pos = np.searchsorted(key, rev)
    pos[pos == key.size] = 0
    return int(np.count_nonzero(key[pos] == rev)), int(key.size)


class ReverseSample:
    """One rank's canonical-pair sample of the edges it streams (module docstring).

    ``edges_hint``: about how many edges all ranks stream together (sets the threshold). Should
    the sample outgrow twice its share (a hint far too low), the threshold halves and the
    sample is filtered again; the ranks' thresholds are reconciled when they are gathered.
    """

    def __init__(self, edges_hint: int, nparts: int) -> None:
        rate = SAMPLE_EDGES / max(1, edges_hint)
        self.threshold = _FULL if rate >= 1 else int(rate * _FULL)
        self.cap = max(1, 2 * SAMPLE_EDGES // max(1, nparts))
        self._src: list[np.ndarray] = []
        self._dst: list[np.ndarray] = []
        self._size = 0
        self.seen = 0
        """Edges streamed through :meth:`add` (before sampling)."""

    def add(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Offer a chunk of edges src -> dst."""
        self.seen += int(src.size)
        if self.threshold != _FULL:
            keep = pair_hash(src, dst) <= np.uint64(self.threshold)
            src, dst = src[keep], dst[keep]
        if not src.size:
            return
        self._src.append(np.asarray(src, dtype=np.int64))
        self._dst.append(np.asarray(dst, dtype=np.int64))
        self._size += int(src.size)
        while self._size > self.cap:
            self._narrow(self.threshold // 2)

    def _narrow(self, threshold: int) -> None:
        """Keep only the pairs whose hash is at most ``threshold``."""
        self.threshold = threshold
        s, d = self.edges()
        keep = pair_hash(s, d) <= np.uint64(threshold)
        self._src, self._dst = [s[keep]], [d[keep]]
        self._size = int(np.count_nonzero(keep))

    @property
    def exact(self) -> bool:
        """Every edge offered was kept: the count is exact."""
        return self.threshold == _FULL

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """The sample: (src, dst) int64."""
        if not self._src:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(self._src), np.concatenate(self._dst)


def reciprocity(src: np.ndarray, dst: np.ndarray, n: int, exact: bool, seen: int
                ) -> dict[str, Any]:
    """The record prep keeps of edges (a sample when not ``exact``): ``fraction`` with their
    reverse, ``counted`` (distinct non-loop edges counted), ``exact``, ``edges_seen``."""
    both, total = count_reciprocal(src, dst, n)
    return {"fraction": round(both / total, 6) if total else 0.0, "counted": total,
            "exact": exact, "edges_seen": seen}


def gather_reciprocity(sample: ReverseSample, n: int, comm: HostComm) -> dict[str, Any]:
    """Collective: every rank's sample to rank 0, counted there; the record on every rank."""
    parts = comm.gather((sample.threshold, sample.seen, *sample.edges()))
    info = None
    if comm.rank == 0:
        assert parts is not None
        t = min(p[0] for p in parts)
        src = np.concatenate([p[2] for p in parts])
        dst = np.concatenate([p[3] for p in parts])
        if t != _FULL:
            keep = pair_hash(src, dst) <= np.uint64(t)
            src, dst = src[keep], dst[keep]
        info = reciprocity(src, dst, n, t == _FULL, sum(p[1] for p in parts))
    return comm.bcast(info)


def decide(asked: bool | None, info: dict[str, Any]) -> bool:
    """Whether to symmetrize: ``asked`` (True/False), or for ``auto`` (None) whether the
    share of edges with their reverse is below :data:`AUTO_SYMMETRIZE_BELOW`."""
    if asked is not None:
        return asked
    return info["fraction"] < AUTO_SYMMETRIZE_BELOW
