"""Node sequences of the hierarchical graph transformer, read per rank from the prepared tiles.

A sequence is N' = ``batch.size`` node ids in the prepared order P: its targets (at most
``batch.targets``) first, then context drawn uniformly from the targets' in-neighbours
('hop1') or those and theirs ('hop2'), filled up with uniformly drawn nodes where the
neighbourhoods are smaller; with its hop codes [N', N'] (the distance from j to i in the
induced subgraph: 0 the same node, 1, 2, 3 = farther or unreachable), features [N', F] and
the targets' labels.

Why every draw is a counter hash (:class:`~plexgt.ops.rng.CounterRNG`) of (seed, epoch,
sequence index, node or draw number, purpose): sequence i of an epoch is then the same
whichever rank builds it, in whatever order, with whatever cache: data-parallel replicas,
pipeline stages and context-parallel ranks each build the sequences they hold and all see the
single process's. An epoch permutes the split's targets by such a hash of (seed, epoch);
evaluation takes the valid / test nodes in order under a fixed epoch key (:data:`EVAL_EPOCH`).

What is read: the A2 rows (Q order, in-neighbours as P columns) and the feature rows (Q
order) of the nodes a sequence touches, in blocks of ``block_rows`` rows kept in a bounded LRU
cache, the split masks once, and the P -> Q position map (a node's A2 row and feature row)
in cached blocks of :data:`P2Q_BLOCK` entries: no array of the whole graph's size, every cache
bounded by :data:`CACHE_BYTES`. A directory prepared before nodes.h5 held that map is read as
before: both permutations once, the map kept whole (4 or 8 bytes a node).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from plexgt.config import BatchConfig
from plexgt.data.prepared_graph import PreparedGraph
from plexgt.errors import ConfigError, DataError
from plexgt.ops.rng import CounterRNG

SPLITS = ("train", "valid", "test")
EVAL_EPOCH = -1
"""The epoch key of evaluation sequences: the same context every time a split is evaluated."""
SITE_PERM, SITE_EXPAND, SITE_CONTEXT, SITE_FILL = ((1 << 21) + k for k in range(4))
"""Counter sites of the sampler's draws (far from the model's dropout and init sites)."""
FILL_ENUMERATE = 4
"""Fill by enumerating the unused nodes when N <= this x N' (rejection would crawl)."""
CACHE_BYTES = 1 << 30
"""Default budget of each block cache (adjacency, features, labels), in bytes of feature
rows: the cache holds ``max(64, CACHE_BYTES // (block_rows * 4 F))`` blocks. Why a byte budget
and not a fixed count: a sequence's nodes fall in most blocks of a small graph, gathered in
ascending block order, and an LRU cache of fewer blocks than that scan misses on every block
(Coauthor CS, 72 blocks of 256 rows against 64: 0.2 s a sequence of 128 nodes, 69 s an
epoch, against 4.3 s for Computers' 54 blocks that fit); a graph whose rows fit the budget is
read once, a larger one stays bounded by it."""


def check_batch(batch: BatchConfig) -> None:
    """One-line ConfigError naming the ``[batch]`` key that cannot make sequences."""
    if batch.size < 1:
        raise ConfigError(f"config key 'batch.size': {batch.size} must be >= 1")
    if not 1 <= batch.targets <= batch.size:
        raise ConfigError(f"config key 'batch.targets': {batch.targets} must be in "
                          f"[1, batch.size={batch.size}] (the targets open the sequence)")
    if batch.sequences < 1:
        raise ConfigError(f"config key 'batch.sequences': {batch.sequences} must be >= 1")
    if batch.global_nodes < 0:
        raise ConfigError(f"config key 'batch.global_nodes': {batch.global_nodes} must be "
                          ">= 0")
    if batch.context not in ("hop1", "hop2"):
        raise ConfigError(f"config key 'batch.context': {batch.context!r} is not one of "
                          "hop1, hop2")


@dataclass(frozen=True)
class Sequence:
    """One sequence of N' nodes (shapes below); ``targets`` = 0: an empty sequence that pads a
    short last step (computed, weighing nothing)."""

    index: int
    """Its index in the split's epoch (the model's dropout key)."""
    ids: torch.Tensor
    """[N'] int64 node ids, prepared order P: targets first."""
    targets: int
    codes: torch.Tensor
    """[N', N'] int8 hop codes."""
    features: torch.Tensor
    """[N', F] float32."""
    labels: torch.Tensor
    """[targets] int64."""


@dataclass(frozen=True)
class NodeBatch:
    """B sequences stacked as the model takes them (:func:`collate`)."""

    x: torch.Tensor
    """[B, N', F] float32."""
    ids: torch.Tensor
    """[B, N'] int64."""
    codes: torch.Tensor
    """[B, N', N'] int8."""
    targets: torch.Tensor
    """[B] int64."""
    seq: torch.Tensor
    """[B] int64 sequence indices (dropout keys)."""
    labels: torch.Tensor
    """[M] int64, M = targets.sum(): each sequence's labels in turn."""


def collate(seqs: list[Sequence]) -> NodeBatch:
    """Stack sequences into a :class:`NodeBatch`."""
    return NodeBatch(torch.stack([s.features for s in seqs]), torch.stack([s.ids for s in seqs]),
                     torch.stack([s.codes for s in seqs]),
                     torch.tensor([s.targets for s in seqs], dtype=torch.int64),
                     torch.tensor([s.index for s in seqs], dtype=torch.int64),
                     torch.cat([s.labels for s in seqs]))


P2Q_BLOCK = 1 << 16
"""Entries of the P -> Q map read at a time (256 KiB of int32)."""


class BlockCache:
    """At most ``capacity`` blocks read by ``read(b)``, least recently used evicted."""

    def __init__(self, read: Callable[[int], Any], capacity: int) -> None:
        self.read, self.capacity = read, capacity
        self.blocks: OrderedDict[int, Any] = OrderedDict()
        self.reads = 0
        """Blocks read so far (misses)."""

    def get(self, b: int) -> Any:
        if b in self.blocks:
            self.blocks.move_to_end(b)
            return self.blocks[b]
        value = self.read(b)
        self.reads += 1
        self.blocks[b] = value
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)
        return value


def keys(seed: int, epoch: int, site: int, rows: np.ndarray, col: int) -> np.ndarray:
    """[n] float64 uniforms: the hash of (seed, epoch, site, rows[i], col)."""
    rng = CounterRNG(seed, epoch, torch.from_numpy(np.ascontiguousarray(rows, np.int64)))
    return rng.uniform(site, 1, col, torch.device("cpu"))[:, 0].numpy()


def first_by_key(items: np.ndarray, k: np.ndarray, n: int) -> np.ndarray:
    """The n items of smallest key (ties: smaller item first), in key order: a uniform draw
    without replacement that no call order can change."""
    return items[np.lexsort((items, k))[:n]]


def by_block(pos: np.ndarray, rows: int, cache: BlockCache) -> list[Any]:
    """(block, local rows, where in pos) of each ``rows``-row block of ``cache`` the positions
    ``pos`` fall in, ascending blocks (one sort, not a pass over pos per block)."""
    pos = np.asarray(pos, dtype=np.int64)
    blk = pos // rows
    order = np.argsort(blk, kind="stable")
    sb = blk[order]
    cut = np.flatnonzero(sb[1:] != sb[:-1]) + 1
    out = []
    for where in np.split(order, cut) if order.size else []:
        b = int(blk[where[0]])
        out.append((cache.get(b), pos[where] - b * rows, where))
    return out


def raw_csr(m: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64, indices) of a CSR block, what :func:`csr_rows` gathers from."""
    return m.indptr.astype(np.int64, copy=False), m.indices


def gather_offsets(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Positions starts[i] .. starts[i] + lens[i] - 1 of every i, concatenated in order."""
    tot = int(lens.sum())
    ends = np.cumsum(lens)
    return np.repeat(starts - (ends - lens), lens) + np.arange(tot, dtype=np.int64)


def csr_rows(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, concatenated column indices) of CSR rows ``rows`` (in that order)."""
    starts = indptr[rows]
    lens = indptr[rows + 1] - starts
    return lens, indices[gather_offsets(starts, lens)]


def hop_codes(adj: sp.csr_matrix, ids: np.ndarray) -> np.ndarray:
    """[n, n] int8 codes of the sequence ``ids`` [n] from ``adj`` [n, N] (row i: ids[i]'s
    in-neighbours): code[i, j] = hop distance from ids[j] to ids[i] inside the sequence's
    induced subgraph, 0 for the same id, 3 for three hops or more / unreachable."""
    uniq, inv = np.unique(ids, return_inverse=True)
    rows = np.repeat(np.arange(ids.size), np.diff(adj.indptr))
    j = np.minimum(np.searchsorted(uniq, adj.indices), uniq.size - 1)
    keep = uniq[j] == adj.indices
    a = sp.csr_matrix((np.ones(int(keep.sum()), np.float32), (rows[keep], j[keep])),
                      shape=(ids.size, uniq.size))[:, inv]  # a[i, j] = 1: ids[j] -> ids[i]
    a.data[:] = 1
    codes = np.full((ids.size, ids.size), 3, dtype=np.int8)
    codes[(a @ a).toarray() > 0] = 2
    codes[a.toarray() > 0] = 1
    codes[ids[:, None] == ids[None, :]] = 0
    return codes


class NodeBatches:
    """The sequences of a prepared graph: ``sequence(split, epoch, index)``.

    ``cache_blocks`` blocks of ``block_rows`` rows each of the adjacency, features and labels
    stay cached (the results never depend on either; None: :data:`CACHE_BYTES`'s count).
    """

    def __init__(self, pg: PreparedGraph, batch: BatchConfig, seed: int,
                 block_rows: int = 256, cache_blocks: int | None = None) -> None:
        check_batch(batch)
        if pg.multilabel:
            raise DataError(f"{pg.path}: multi-label targets; node sequences train "
                            "single-label classification")
        if cache_blocks is None:
            cache_blocks = max(64, CACHE_BYTES // (max(1, block_rows) * 4 * max(1, pg.F)))
        if block_rows < 1 or cache_blocks < 1:
            raise ValueError(f"block_rows {block_rows} and cache_blocks {cache_blocks} must "
                             "be >= 1")
        self.pg, self.batch, self.seed, self.block_rows = pg, batch, seed, block_rows
        n = pg.N
        self._split = {s: self._mask_ids(s) for s in SPLITS}
        self._p2q: np.ndarray | None = None
        self._p2q_blocks = BlockCache(
            lambda b: pg.read_p2q((b * P2Q_BLOCK, min(n, (b + 1) * P2Q_BLOCK))),
            max(1, CACHE_BYTES // (P2Q_BLOCK * 8)))
        if not pg.has_p2q:  # prepared before nodes.h5 held the map: both permutations whole
            perm_p, perm_q = pg.read_perm("P"), pg.read_perm("Q")
            qinv = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
            qinv[perm_q] = np.arange(n, dtype=qinv.dtype)
            self._p2q = qinv[perm_p]
            del perm_p, perm_q, qinv
        self._adj = BlockCache(lambda b: raw_csr(pg.read_adjacency("A2", self._block(b))),
                               cache_blocks)
        self._feat = BlockCache(lambda b: pg.read_features(self._block(b)), cache_blocks)
        self._labels = BlockCache(lambda b: pg.read_labels(self._block(b), "P"), cache_blocks)
        self._perm: tuple[int, np.ndarray] | None = None

    def _block(self, b: int) -> tuple[int, int]:
        return b * self.block_rows, min(self.pg.N, (b + 1) * self.block_rows)

    def _mask_ids(self, split: str, chunk: int = 1 << 20) -> np.ndarray:
        """[k] int64 P ids of the split's nodes, ascending (the mask read in chunks)."""
        parts = [np.flatnonzero(self.pg.read_mask(split, (lo, min(self.pg.N, lo + chunk))))
                 + lo for lo in range(0, self.pg.N, chunk)]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    # -- counts ---------------------------------------------------------------------
    def count(self, split: str) -> int:
        """Target nodes of ``split``."""
        return int(self._ids(split).size)

    def sequences(self, split: str) -> int:
        """Sequences with targets in one pass over ``split``."""
        return math.ceil(self.count(split) / self.batch.targets)

    def steps(self, split: str) -> int:
        """Steps of ``batch.sequences`` sequences in one pass (the last padded with empty
        sequences)."""
        return math.ceil(self.sequences(split) / self.batch.sequences)

    def step(self, split: str, epoch: int, step: int) -> list[Sequence]:
        """The ``batch.sequences`` sequences of step ``step`` of the epoch."""
        g = self.batch.sequences
        return [self.sequence(split, epoch, i) for i in range(step * g, (step + 1) * g)]

    def step_targets(self, split: str, step: int) -> int:
        """Targets of step ``step`` (what its loss is divided by; every rank knows it)."""
        g, t = self.batch.sequences, self.batch.targets
        return max(0, min(self.count(split), (step + 1) * g * t) - step * g * t)

    def _ids(self, split: str) -> np.ndarray:
        if split not in self._split:
            raise DataError(f"split {split!r}: expected train, valid or test")
        return self._split[split]

    def _targets(self, split: str, epoch: int) -> np.ndarray:
        """The split's targets in the epoch's order (evaluation: ascending)."""
        ids = self._ids(split)
        if split != "train":
            return ids
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, first_by_key(ids, keys(self.seed, epoch, SITE_PERM, ids, 0),
                                              ids.size))
        return self._perm[1]

    # -- reads ------------------------------------------------------------------------
    def q_positions(self, ids: np.ndarray) -> np.ndarray:
        """[len(ids)] int64 Q positions (A2 rows, feature rows) of the P ids ``ids``, from the
        map's cached blocks."""
        if self._p2q is not None:
            return self._p2q[ids].astype(np.int64)
        out = np.empty(ids.size, dtype=np.int64)
        for block, local, where in by_block(ids, P2Q_BLOCK, self._p2q_blocks):
            out[where] = block[local]
        return out

    def _gather(self, cache: BlockCache, ids: np.ndarray, q: bool) -> list[Any]:
        """(block, local rows, where in ids) of each block the nodes ``ids`` fall in,
        ascending blocks."""
        return by_block(self.q_positions(ids) if q else ids, self.block_rows, cache)

    def in_neighbours(self, ids: np.ndarray) -> sp.csr_matrix:
        """[len(ids), N] CSR: row i the in-neighbours (P ids) of node ids[i].

        Gathered with numpy from the cached blocks' raw (indptr, indices): scipy's row
        indexing cost ~50 us a call, one call per block a sequence touches (~50 blocks on
        Computers, three gathers a sequence), and was three quarters of the sampler's time."""
        n = ids.size
        lens = np.zeros(n, dtype=np.int64)
        chunks, order = [], []
        for (indptr, indices), local, w in self._gather(self._adj, ids, True):
            ln, got = csr_rows(indptr, indices, local)
            lens[w] = ln
            chunks.append(got)
            order.append(w)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        if not chunks:
            return sp.csr_matrix((np.ones(0, np.float32), np.zeros(0, np.int64), indptr),
                                 shape=(n, self.pg.N))
        cat, wcat = np.concatenate(chunks), np.concatenate(order)
        first = np.empty(n, dtype=np.int64)  # row i's start in cat (rows in block order)
        cl = lens[wcat]
        first[wcat] = np.cumsum(cl) - cl
        out = cat[gather_offsets(first, lens)]
        return sp.csr_matrix((np.ones(out.size, np.float32), out, indptr),
                             shape=(n, self.pg.N))

    def features(self, ids: np.ndarray) -> np.ndarray:
        """[len(ids), F] float32 feature rows of ``ids``."""
        out = np.empty((ids.size, self.pg.F), dtype=np.float32)
        for x, local, w in self._gather(self._feat, ids, True):
            out[w] = x[local]
        return out

    def labels(self, ids: np.ndarray) -> np.ndarray:
        """[len(ids)] int64 labels of ``ids``."""
        out = np.empty(ids.size, dtype=np.int64)
        for y, local, w in self._gather(self._labels, ids, False):
            out[w] = y[local]
        return out

    # -- sequences --------------------------------------------------------------------
    def sequence(self, split: str, epoch: int, index: int) -> Sequence:
        """Sequence ``index`` of ``split`` in ``epoch`` (ignored for valid / test): indices
        past the split's sequences, up to the last step's end, are empty."""
        tg = self._targets(split, epoch)
        t = self.batch.targets
        end = self.steps(split) * self.batch.sequences
        if not 0 <= index < end:
            raise IndexError(f"sequence {index} of split {split!r}: it has {end} "
                             f"({self.steps(split)} steps of {self.batch.sequences})")
        ep = epoch if split == "train" else EVAL_EPOCH
        targets = tg[index * t:(index + 1) * t]
        ids = np.concatenate([targets, self._context(targets, ep, index)])
        ids = np.concatenate([ids, self._fill(ids, ep, index)])
        codes = hop_codes(self.in_neighbours(ids), ids)
        return Sequence(index, torch.from_numpy(ids), int(targets.size),
                        torch.from_numpy(codes), torch.from_numpy(self.features(ids)),
                        torch.from_numpy(self.labels(targets)))

    def _context(self, targets: np.ndarray, ep: int, index: int) -> np.ndarray:
        """Up to N' - t context nodes drawn uniformly from the targets' neighbourhood: hop1,
        and for hop2 the in-neighbours of (a uniform N'-subset of) hop1."""
        need = self.batch.size - targets.size
        if need <= 0 or targets.size == 0:
            return np.zeros(0, np.int64)
        h1 = np.setdiff1d(self.in_neighbours(targets).indices, targets).astype(np.int64)
        cand = h1
        if self.batch.context == "hop2" and h1.size:
            grow = h1 if h1.size <= self.batch.size else first_by_key(
                h1, keys(self.seed, ep, SITE_EXPAND, h1, index), self.batch.size)
            h2 = np.setdiff1d(self.in_neighbours(grow).indices,
                              np.concatenate([targets, h1])).astype(np.int64)
            cand = np.concatenate([h1, h2])
        return first_by_key(cand, keys(self.seed, ep, SITE_CONTEXT, cand, index), need)

    def _fill(self, ids: np.ndarray, ep: int, index: int) -> np.ndarray:
        """N' - len(ids) nodes drawn uniformly, none already in the sequence while any is
        left (a graph of fewer than N' nodes repeats them)."""
        k, n = self.batch.size - ids.size, self.pg.N
        if k <= 0:
            return np.zeros(0, np.int64)
        if n <= FILL_ENUMERATE * self.batch.size:
            free = np.setdiff1d(np.arange(n, dtype=np.int64), ids)
            if free.size == 0:
                free = np.arange(n, dtype=np.int64)
            order = first_by_key(free, keys(self.seed, ep, SITE_FILL, free, index), free.size)
            return np.resize(order, k)
        got: list[np.ndarray] = []
        have, c0 = set(ids.tolist()), 0
        while sum(g.size for g in got) < k:
            draws = np.arange(c0, c0 + 2 * k, dtype=np.int64)
            c0 += 2 * k
            cand = np.minimum((keys(self.seed, ep, SITE_FILL, draws, index) * n)
                              .astype(np.int64), n - 1)
            fresh = [v for v in cand.tolist() if v not in have and not have.add(v)]
            got.append(np.asarray(fresh, dtype=np.int64))
        return np.concatenate(got)[:k]
