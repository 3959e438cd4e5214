"""Seeded synthetic graphs: R-MAT (power-law, for scale) and a learnable stochastic block model.

R-MAT (Chakrabarti et al. 2004) is streamed: chunk k of ``RMAT_CHUNK`` edges is drawn from its
own seed ``[seed, k]``, so the graph is identical whatever the chunking or number of ranks, and
no rank ever holds more than one chunk. N need not be a power of two: ids are drawn at scale
ceil(log2 N) and folded modulo N.

The SBM plants C classes with intra-class edge probability ``p_intra`` (homophily) and features
= class centroid + unit Gaussian noise, with the centroids close enough that features alone
classify poorly but neighbourhood averages classify well: a GCN learns it to high accuracy,
an MLP does not, which is what a demo of graph learning needs.
"""

from __future__ import annotations

import math

import numpy as np

from plexgt.data.graph import GraphData, random_split
from plexgt.data.source import GraphSource, MemorySource, check_memory
from plexgt.errors import DataError

#: edges per independently seeded R-MAT chunk
RMAT_CHUNK = 1 << 20
#: Graph500 quadrant probabilities (a, b, c); d = 1 - a - b - c
RMAT_ABC = (0.57, 0.19, 0.19)


def _rmat_chunk(n: int, m: int, seed: int, k: int, abc: tuple[float, float, float]
                ) -> tuple[np.ndarray, np.ndarray]:
    """(src [m], dst [m]) int64 of chunk ``k``: one quadrant draw per bit of the scale."""
    scale = max(1, math.ceil(math.log2(n)))
    a, b, c = abc
    ab, abc_ = np.float32(a + b), np.float32(a + b + c)
    a32 = np.float32(a)
    rng = np.random.default_rng([seed, k])
    src = np.zeros(m, dtype=np.int64)
    dst = np.zeros(m, dtype=np.int64)
    u = np.empty(m, dtype=np.float32)
    for _ in range(scale):
        rng.random(out=u, dtype=np.float32)
        hi_src = u >= ab
        hi_dst = (u >= a32) & ~hi_src | (u >= abc_)
        src <<= 1
        src |= hi_src
        dst <<= 1
        dst |= hi_dst
    if n & (n - 1):
        src %= n
        dst %= n
    return src, dst


class RmatSource(GraphSource):
    """A streamed R-MAT graph of ``num_edges`` directed edges on ``num_nodes`` nodes (with
    ``edge_features`` = F_e > 0, N(0, 1) float32 edge features, chunk k drawn from its own
    seed like its edges)."""

    def __init__(self, num_nodes: int, num_edges: int, seed: int = 0,
                 abc: tuple[float, float, float] = RMAT_ABC, edge_features: int = 0) -> None:
        if num_nodes < 1 or num_edges < 1:
            raise DataError(f"rmat: empty graph (nodes={num_nodes}, edges={num_edges})")
        if edge_features < 0:
            raise DataError(f"rmat: edge features={edge_features} must be >= 0")
        m = min(num_edges, RMAT_CHUNK)
        check_memory(f"rmat: --edge-features {edge_features}", f"drawing a chunk of {m} "
                     f"edges x {edge_features} float32 edge features", m * edge_features * 4)
        self.num_nodes, self.num_edges, self.seed, self.abc = num_nodes, num_edges, seed, abc
        self.num_edge_features = edge_features
        extra = f", edge_features={edge_features}" if edge_features else ""
        self.name = f"rmat(nodes={num_nodes}, edges={num_edges}, seed={seed}{extra})"
        self.files = []

    def num_edges_hint(self) -> int:
        return self.num_edges

    def edge_chunks(self, part, nparts, chunk):  # noqa: ANN001, ANN201 - see base
        for k, lo in enumerate(range(0, self.num_edges, RMAT_CHUNK)):
            if k % nparts == part:
                m = min(RMAT_CHUNK, self.num_edges - lo)
                yield _rmat_chunk(self.num_nodes, m, self.seed, k, self.abc)

    def edge_attr_chunks(self, part, nparts, chunk):  # noqa: ANN001, ANN201 - see base
        for k, lo in enumerate(range(0, self.num_edges, RMAT_CHUNK)):
            if k % nparts == part:
                m = min(RMAT_CHUNK, self.num_edges - lo)
                s, d = _rmat_chunk(self.num_nodes, m, self.seed, k, self.abc)
                rng = np.random.default_rng([self.seed, 13, k])
                yield s, d, rng.standard_normal((m, self.num_edge_features), dtype=np.float32)


def rmat(num_nodes: int, num_edges: int, seed: int = 0) -> GraphData:
    """An in-memory R-MAT graph (the concatenation of :class:`RmatSource`'s chunks)."""
    s = RmatSource(num_nodes, num_edges, seed)
    chunks = list(s.edge_chunks(0, 1, RMAT_CHUNK))
    src = np.concatenate([c[0] for c in chunks])
    dst = np.concatenate([c[1] for c in chunks])
    return GraphData(s.name, num_nodes, src, dst)


def sbm(num_nodes: int = 50_000, num_edges: int = 1_000_000, num_classes: int = 8,
        num_features: int = 64, seed: int = 0, p_intra: float = 0.8,
        centroid_scale: float = 0.25, edge_features: int = 0) -> GraphData:
    """An undirected SBM graph: ``num_edges`` directed edges (both directions of each pair).

    Labels [N] in [0, C); features [N, F] float32 = centroid[label] * ``centroid_scale`` +
    N(0, 1); a seeded 60/20/20 split. Duplicate pairs may occur (prep merges them, summing
    their edge features). ``edge_features`` = F_e > 0: [E, F_e] float32 edge features, the
    same for both directions of a pair: column 0 is 1 on edges inside a community and 0
    across (a signal an edge bias can learn), the rest N(0, 1).
    """
    if num_nodes < 1 or num_edges < 2:
        raise DataError(f"sbm: empty graph (nodes={num_nodes}, edges={num_edges})")
    if num_classes < 1 or num_classes > num_nodes:
        raise DataError(f"sbm: classes={num_classes} must be in [1, nodes={num_nodes}]")
    if num_features < 1:
        raise DataError(f"sbm: features={num_features} must be positive")
    if edge_features < 0:
        raise DataError(f"sbm: edge features={edge_features} must be >= 0")
    # what numpy holds at the peak: the features and the noise added to them; both halves
    # of the edge features and their concatenation
    check_memory(f"sbm: --features {num_features}", f"drawing {num_nodes} nodes x "
                 f"{num_features} float32 features", 2 * num_nodes * num_features * 4)
    check_memory(f"sbm: --edge-features {edge_features}", f"drawing {num_edges} edges x "
                 f"{edge_features} float32 edge features",
                 3 * (num_edges // 2) * edge_features * 4)
    rng = np.random.default_rng([seed, 11])
    labels = rng.integers(0, num_classes, num_nodes, dtype=np.int64)
    order = np.argsort(labels, kind="stable")
    sizes = np.bincount(labels, minlength=num_classes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    m = num_edges // 2
    a = rng.integers(0, num_nodes, m, dtype=np.int64)
    intra = rng.random(m) < p_intra
    la = labels[a]
    pick = starts[la] + np.minimum((rng.random(m) * sizes[la]).astype(np.int64), sizes[la] - 1)
    b = np.where(intra, order[pick], rng.integers(0, num_nodes, m, dtype=np.int64))
    centroids = rng.standard_normal((num_classes, num_features), dtype=np.float32)
    feats = centroids[labels] * np.float32(centroid_scale)
    feats += rng.standard_normal((num_nodes, num_features), dtype=np.float32)
    attr = None
    if edge_features:
        half = np.random.default_rng([seed, 12]).standard_normal((m, edge_features),
                                                                 dtype=np.float32)
        half[:, 0] = labels[a] == labels[b]
        attr = np.concatenate([half, half])
    extra = f", edge_features={edge_features}" if edge_features else ""
    g = GraphData(
        name=f"sbm(nodes={num_nodes}, edges={num_edges}, classes={num_classes}, "
        f"features={num_features}, seed={seed}{extra})",
        num_nodes=num_nodes,
        src=np.concatenate([a, b]),
        dst=np.concatenate([b, a]),
        features=feats,
        labels=labels,
        splits=random_split(num_nodes, seed),
        edge_attr=attr,
    )
    g.validate()
    return g


def sbm_source(**kw: object) -> GraphSource:
    """:func:`sbm` as a prep source."""
    return MemorySource(sbm(**kw))  # type: ignore[arg-type]
