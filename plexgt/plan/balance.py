"""How unevenly a partition of the stored pattern spreads its nonzeros: max over blocks / mean.

Every distributed layout cuts the stored (permuted or not) pattern into contiguous node
blocks of ceil(N/G) rows (and columns): the 3D GCN's adjacency block is [rows over Gc,
columns over Ga] of A1 (even layers) or A2 (odd ones); GP-AG and the rings give each rank one
of p (gp_2d: b) row blocks and all its columns. Each layer ends in collectives, so the step
waits for the rank with the most nonzeros: the planner prices the **max** block, the mean
times :meth:`Balance.imbalance`.

Where the numbers come from, in order:

* ``block_nnz`` of the prepared manifest (``plexgt prep`` counts the nonzeros of each matrix
  on a K x K grid of equal node blocks, K <= 64, whatever the permutation): a partition's
  blocks are summed from the cells they overlap, a cell's nonzeros taken as spread evenly
  inside it, so a partition finer than K x K is priced smoother than it is.
* the manifest's ``tile_nnz`` (the T x T tiles prep writes) where it has no ``block_nnz``
  and T > 1 (an older prep of a big graph): the same sum on the coarser grid.
* otherwise :data:`DEFAULT_IMBALANCE`, said so in :attr:`Balance.source`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DEFAULT_IMBALANCE = 1.0
"""Max / mean nonzeros of a block where nothing about the graph's layout is known (sizes typed
for ``plexgt plan``, a prepared graph without block counts): what prep's default balanced
permutation reaches (manifest ``permutation.balance.imbalance``: 1.0001 on Coauthor Physics
at 8 x 8 blocks; a random one leaves ~2.4/sqrt(nonzeros per block), under 1% at a thousand
ranks on papers100M). A graph prepped without permutation can be far worse: prep it with
this version to have it counted."""
MATRICES = ("A1", "A2")


@dataclass(frozen=True, eq=False)
class Balance:
    """Nonzero counts of the stored matrices on a K x K grid of node blocks (cell (i, j):
    rows [ceil(i·N/K), ceil((i+1)·N/K)), columns likewise), or none: then every partition is
    :data:`DEFAULT_IMBALANCE`. Hashed by identity (a search caches per object)."""

    n: int = 0
    counts: Mapping[str, np.ndarray] = field(default_factory=dict)
    """matrix ('A1', 'A2') -> [K, K] nonzeros."""
    source: str = f"default {DEFAULT_IMBALANCE:g} (no block counts)"
    """Where the counts come from (the manifest's field), or the default's statement."""
    edges: np.ndarray | None = None
    """The cells' node edges (K + 1, 0 to N) where they are not ceil(i·N/K) (tiles)."""
    _cache: dict[tuple[str, int, int], float] = field(default_factory=dict, repr=False)

    @classmethod
    def from_manifest(cls, m: Mapping[str, Any]) -> Balance:
        """A prepared manifest's counts: ``block_nnz`` (cells of ceil(i·N/K)), else
        ``tile_nnz`` when it has more than one tile (tiles of ``tile_size`` rows), else
        none."""
        n = int(m.get("N", 0))
        blk = m.get("block_nnz")
        if isinstance(blk, dict) and all(k in blk for k in MATRICES) and n > 0:
            return cls(n, {k: np.asarray(blk[k], dtype=np.float64) for k in MATRICES},
                       f"manifest block_nnz ({len(blk['A1'])}x{len(blk['A1'])} blocks)")
        tiles = m.get("tile_nnz")
        if (isinstance(tiles, dict) and all(k in tiles for k in MATRICES) and n > 0
                and len(tiles["A1"]) > 1):
            # tiles are tile_size rows, the last short: their true edges
            t = len(tiles["A1"])
            size = int(m.get("tile_size", -(-n // t)))
            return cls(n, {k: np.asarray(tiles[k], dtype=np.float64) for k in MATRICES},
                       f"manifest tile_nnz ({t}x{t} tiles)",
                       np.minimum(np.arange(t + 1) * size, n).astype(np.float64))
        return cls(n)

    @property
    def known(self) -> bool:
        """Whether the counts come from the graph (else the default)."""
        return bool(self.counts)

    def _cell_edges(self, k: int) -> np.ndarray:
        if self.edges is not None:
            return self.edges
        return np.ceil(np.arange(k + 1) * self.n / k)

    def imbalance(self, matrix: str, rows: int, cols: int = 1) -> float:
        """Max over the blocks of a [rows x cols] partition of ``matrix`` (blocks of ceil(N/G)
        nodes, as every layout cuts them) of its nonzeros, over the mean (>= 1)."""
        if rows * cols <= 1 or matrix not in self.counts:
            return 1.0 if rows * cols <= 1 else DEFAULT_IMBALANCE
        key = (matrix, rows, cols)
        got = self._cache.get(key)
        if got is None:
            c = self.counts[matrix]
            edges = self._cell_edges(c.shape[0])
            est = overlap(edges, self.n, rows) @ c @ overlap(edges, self.n, cols).T
            mean = c.sum() / (rows * cols)
            got = float(max(1.0, est.max() / mean)) if mean > 0 else 1.0
            self._cache[key] = got
        return got


def overlap(edges: np.ndarray, n: int, parts: int) -> np.ndarray:
    """[parts, K] share of each cell (nodes [edges[j], edges[j+1])) inside each of ``parts``
    blocks of ceil(n/parts) nodes (trailing ones short or empty)."""
    size = -(-n // parts)
    lo = np.minimum(np.arange(parts) * size, n)[:, None].astype(np.float64)
    hi = np.minimum(lo + size, n)
    c0, c1 = edges[None, :-1], edges[None, 1:]
    width = np.maximum(c1 - c0, 1.0)
    return np.clip(np.minimum(hi, c1) - np.maximum(lo, c0), 0.0, None) / width
