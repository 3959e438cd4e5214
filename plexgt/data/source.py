"""Graph sources: what ``plexgt prep`` streams from, in chunks, without holding the edge list.

A source knows N, and yields edges and feature rows in chunks, each chunk already validated
(ids in range, features finite). ``part``/``nparts`` split the chunks over MPI ranks: every
chunk goes to exactly one part. Node-sized arrays (labels, splits) are returned whole: prep
memory is O(N + chunk), never O(E) or O(N * F).

Readers that return a :class:`GraphData` are wrapped by :class:`MemorySource` (gnn-benchmark
npz, SBM); R-MAT, the OGB layouts (npz and csv.gz), SNAP edge lists and MatrixMarket files have
their own streaming sources, which parse text block by block.

Counts a text source can only check once every part has been read (a header's claimed edge
count, split over ranks) go through :meth:`GraphSource.edge_pass_stats` and
:meth:`GraphSource.check_edge_pass`: prep sums the former over ranks after its bucketing pass
and hands the sums to the latter.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from plexgt.data.graph import GraphData, first_id_error
from plexgt.data.textio import Comments, block_bytes_for, estimate_data_lines, max_data_lines
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import DataError
from plexgt.util.system import physical_memory


class GraphSource:
    """Base class: a graph streamed in chunks (see module docstring)."""

    name: str = "graph"
    num_nodes: int = 0
    num_features: int = 0
    num_edge_features: int = 0
    """F_e: columns of the edges' features (0: none); then :meth:`edge_attr_chunks` works."""
    feature_dtype: np.dtype | None = None
    files: list[Path] = []
    """Input files (their sha256 go into the manifest)."""

    def num_edges_hint(self) -> int:
        """Approximate stored edge count (chooses the default tile count)."""
        raise NotImplementedError

    def edge_chunks(self, part: int, nparts: int, chunk: int
                    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (src [k], dst [k]) int64 blocks of this part's share of the edges."""
        raise NotImplementedError

    def feature_chunks(self, part: int, nparts: int, chunk_rows: int
                       ) -> Iterator[tuple[int, np.ndarray]]:
        """Yield (first row, rows [k, F]) blocks, original node order; none when F == 0. A
        source whose rows come in any order yields (original ids [k] int64, rows) instead."""
        return iter(())

    def edge_attr_chunks(self, part: int, nparts: int, chunk: int
                         ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Yield (src [k], dst [k], features [k, F_e] float32): :meth:`edge_chunks` with each
        edge's features (only when ``num_edge_features`` > 0)."""
        raise NotImplementedError(f"{self.name}: no edge features")

    def edge_pass_stats(self) -> np.ndarray:
        """int64 counters of this process's last complete :meth:`edge_chunks` pass (e.g. the
        entries it read); the same length on every rank. Empty: nothing to check."""
        return np.zeros(0, dtype=np.int64)

    def check_edge_pass(self, totals: np.ndarray) -> None:
        """Check :meth:`edge_pass_stats` summed over the parts of one pass (raise DataError).

        A source checks a pass over all parts (``nparts == 1``) itself, at its end; this hook
        covers a pass split over ranks, where no rank saw every edge.
        """

    def counted_degrees(self, part: int, nparts: int) -> np.ndarray | None:
        """[num_nodes] int64 in + out degrees of part ``part`` of ``nparts``'s share of the
        edges when an earlier pass over them already counted them (then handed over once),
        else None: prep's degree permutation then makes its own pass."""
        return None

    #: True when :meth:`feature_rows` works (prep then gathers rows, skipping the buckets)
    random_access_features: bool = False

    def feature_density(self) -> float | None:
        """The share of nonzero feature values, when the source can tell it without a pass
        over the features (None: it cannot; prep then measures it on its pass)."""
        return None

    def feature_rows(self, ids: np.ndarray) -> np.ndarray:
        """[len(ids), F] rows of the given original ids (only if random_access_features)."""
        raise NotImplementedError

    def labels(self) -> np.ndarray | None:
        """[N] int64 class ids (-1 unlabelled) or None."""
        return None

    def splits(self) -> dict[str, np.ndarray]:
        """Node-index arrays keyed train/valid/test, or {} (prep then draws a random split)."""
        return {}

    def stored_splits(self) -> list[dict[str, np.ndarray]]:
        """Every split the source stores, each like :meth:`splits` (the first is it), when
        the run keeps them all (``prep --split-index all``: prep writes each); [] otherwise."""
        return []

    def split_origin(self) -> dict[str, Any]:
        """Where :meth:`splits` come from, for the manifest: ``{"origin": "dataset"}`` (the
        source's own), or ``"column"``, ``"file"``, ``"random"`` with what names them."""
        return {"origin": "dataset"}

    def label_names(self) -> list[str] | None:
        """The class names of class id 0..C-1 when the source named its classes (a node
        table's string column), else None; valid once :meth:`labels` has been called."""
        return None

    def close(self) -> None:
        """Release open files."""


class TextEdgeSource(GraphSource):
    """A text edge list parsed block by block (SNAP, MatrixMarket, OGB csv.gz).

    A format supplies :meth:`_edge_blocks` (checked (src, dst) arrays per parsed block, and how
    many stored lines the block held) and :meth:`_check_total`; the chunking, the count of a
    pass and its check (at once for a whole pass, summed over ranks for a split one) are here.
    """

    line_bytes: int = 16
    """Bytes of a typical line: sizes a parse block from a chunk of edges."""
    _pass: int = 0

    def _edge_blocks(self, part: int, nparts: int, block_bytes: int
                     ) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        raise NotImplementedError

    def _check_total(self, count: int) -> None:
        """Raise DataError unless ``count`` stored lines is what the file claims."""
        raise NotImplementedError

    def edge_chunks(self, part, nparts, chunk):  # noqa: ANN001, ANN201 - see base

        count = 0
        for src, dst, stored in self._edge_blocks(part, nparts,
                                                  block_bytes_for(chunk, self.line_bytes)):
            count += stored
            for lo in range(0, src.size, chunk):
                yield src[lo : lo + chunk], dst[lo : lo + chunk]
        self._pass = count
        if nparts == 1:
            self._check_total(count)

    def edge_pass_stats(self) -> np.ndarray:
        return np.array([self._pass], dtype=np.int64)

    def check_edge_pass(self, totals: np.ndarray) -> None:
        self._check_total(int(totals[0]))


def check_edge_total(path: Path, count: int, claimed_e: int | None) -> None:
    """Refuse an edge list with no edges, or with fewer or more than its header claims."""
    if count == 0:
        raise DataError(f"{path}: empty graph (no edges)")
    if claimed_e is not None and claimed_e != count:
        raise DataError(f"{path}: header claims {claimed_e} edges but the file holds {count} "
                        "(truncated?)")


class CountedEdgeSource(TextEdgeSource):
    """A text edge list whose N, unless the caller fixes it, comes from a *counting pass*:
    the whole file parsed once for the edge count and the largest id (split over the MPI
    ranks of ``comm``), before prep's stages start. With ``count_degrees`` that pass also
    keeps this rank's share of the degrees ([N] int64, what prep's own degree pass holds),
    handed over once by :meth:`counted_degrees`.

    A format supplies :meth:`_parsed`, its [k, 2] int64 (src, dst) blocks of one part with ids
    checked against [0, n) (n None: only >= 0), and may set ``claimed_n`` / ``claimed_e``
    (a header's counts) before calling this constructor.
    """

    claimed_n: int | None = None
    claimed_e: int | None = None
    comments: Comments = "#"
    """What starts a comment in the format's lines (estimates of the edge count skip them)."""

    def __init__(self, path: str | Path, num_nodes: int | None, comm: HostComm | None,
                 chunk_edges: int, count_degrees: bool, line_bytes: int) -> None:
        self.path = Path(path)
        self.name = str(self.path)
        self.files = [self.path]
        self.counted: int | None = None
        self.line_bytes = line_bytes
        self._degrees: tuple[int, int, np.ndarray] | None = None
        if num_nodes is None:
            self.counted, hi = self._count(comm or HostComm(None), chunk_edges, count_degrees)
            self.num_nodes = max(hi + 1, self.claimed_n or 0)
        else:
            self.num_nodes = num_nodes

    def _parsed(self, part: int, nparts: int, block_bytes: int, n: int | None
                ) -> Iterator[np.ndarray]:
        raise NotImplementedError

    def _count(self, comm: HostComm, chunk: int, degrees: bool) -> tuple[int, int]:
        """The counting pass: (edges, largest id) over all parts (collective over ``comm``)."""
        def count_part() -> tuple[int, int]:
            count, hi = 0, -1
            deg = np.zeros(0, dtype=np.int64)
            for arr in self._parsed(comm.rank, comm.size,
                                    block_bytes_for(chunk, self.line_bytes), None):
                count += arr.shape[0]
                hi = max(hi, int(arr.max()))
                if degrees:
                    b = np.bincount(arr.ravel())
                    if b.size > deg.size:  # N unknown yet: grow by doubling
                        deg = np.concatenate(
                            [deg, np.zeros(max(b.size, 2 * deg.size) - deg.size, np.int64)])
                    deg[:b.size] += b
            if degrees:
                self._degrees = (comm.rank, comm.size, deg)
            return count, hi

        stats = comm.allgather(comm.run(count_part))
        count, hi = sum(s[0] for s in stats), max(s[1] for s in stats)
        check_edge_total(self.path, count, self.claimed_e)
        return count, hi

    def counted_degrees(self, part: int, nparts: int) -> np.ndarray | None:
        """This part's degrees from the counting pass, once (then freed), when it counted them
        over the same ``nparts`` parts."""
        if self._degrees is None or self._degrees[:2] != (part, nparts):
            return None
        deg = self._degrees[2]
        self._degrees = None
        out = np.zeros(self.num_nodes, dtype=np.int64)
        k = min(deg.size, self.num_nodes)
        out[:k] = deg[:k]
        return out

    def num_edges_hint(self) -> int:
        if self.counted is not None:
            return self.counted
        if self.claimed_e is not None:
            return min(self.claimed_e, max_data_lines(self.path))
        return estimate_data_lines(self.path, self.comments)

    def _edge_blocks(self, part, nparts, block_bytes):  # noqa: ANN001, ANN202 - see base
        for arr in self._parsed(part, nparts, block_bytes, self.num_nodes):
            src, dst = np.ascontiguousarray(arr.T)
            yield src, dst, src.size

    def _check_total(self, count: int) -> None:
        check_edge_total(self.path, count, self.claimed_e)


def parts_of(total: int, chunk: int, part: int, nparts: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) ranges of ``chunk`` items, the k-th belonging to part k % nparts."""
    for k, lo in enumerate(range(0, total, max(1, chunk))):
        if k % nparts == part:
            yield lo, min(total, lo + chunk)


class MemorySource(GraphSource):
    """A :class:`GraphData` already in memory (the small readers' output)."""

    def __init__(self, g: GraphData, files: list[Path] | None = None,
                 split_origin: dict[str, Any] | None = None) -> None:
        g.validate()
        if g.num_edges == 0:
            raise DataError(f"{g.name}: empty graph (no edges)")
        self.g = g
        self.name = g.name
        self.num_nodes = g.num_nodes
        self.num_features = g.num_features
        self.feature_dtype = None if g.features is None else g.features.dtype
        self.num_edge_features = g.num_edge_features
        self.files = list(files or [])
        self.random_access_features = g.features is not None
        self._split_origin = split_origin or {"origin": "dataset"}

    def split_origin(self) -> dict[str, Any]:
        return dict(self._split_origin)

    def num_edges_hint(self) -> int:
        return self.g.num_edges

    def feature_density(self) -> float | None:
        x = self.g.features
        return None if x is None or x.size == 0 else float(np.count_nonzero(x)) / x.size

    def edge_chunks(self, part, nparts, chunk):  # noqa: ANN001, ANN201 - see base
        for lo, hi in parts_of(self.g.num_edges, chunk, part, nparts):
            s, d = self.g.src[lo:hi], self.g.dst[lo:hi]
            check_ids(s, d, self.num_nodes, f"{self.name}: edges [{lo}, {hi})")
            yield s, d

    def edge_attr_chunks(self, part, nparts, chunk):  # noqa: ANN001, ANN201 - see base
        assert self.g.edge_attr is not None, f"{self.name}: no edge features"
        for lo, hi in parts_of(self.g.num_edges, chunk, part, nparts):
            s, d = self.g.src[lo:hi], self.g.dst[lo:hi]
            check_ids(s, d, self.num_nodes, f"{self.name}: edges [{lo}, {hi})")
            yield s, d, self.g.edge_attr[lo:hi].astype(np.float32, copy=False)

    def feature_chunks(self, part, nparts, chunk_rows):  # noqa: ANN001, ANN201 - see base
        if self.g.features is None:
            return
        for lo, hi in parts_of(self.num_nodes, chunk_rows, part, nparts):
            yield lo, self.g.features[lo:hi]

    def feature_rows(self, ids: np.ndarray) -> np.ndarray:
        return self.g.features[ids]

    def labels(self) -> np.ndarray | None:
        return self.g.labels

    def splits(self) -> dict[str, np.ndarray]:
        return dict(self.g.splits)

    def stored_splits(self) -> list[dict[str, np.ndarray]]:
        return [dict(s) for s in self.g.stored_splits]


class NodeDataOver(GraphSource):
    """A source whose edges are ``self.base``'s, passed through unchanged; a subclass gives
    the nodes' features and labels (generated ones, a node table's)."""

    base: GraphSource

    def num_edges_hint(self) -> int:
        return self.base.num_edges_hint()

    def edge_chunks(self, part, nparts, chunk):  # noqa: ANN001, ANN201 - see base
        return self.base.edge_chunks(part, nparts, chunk)

    def edge_attr_chunks(self, part, nparts, chunk):  # noqa: ANN001, ANN201 - see base
        return self.base.edge_attr_chunks(part, nparts, chunk)

    def edge_pass_stats(self) -> np.ndarray:
        return self.base.edge_pass_stats()

    def counted_degrees(self, part: int, nparts: int) -> np.ndarray | None:
        return self.base.counted_degrees(part, nparts)

    def check_edge_pass(self, totals: np.ndarray) -> None:
        self.base.check_edge_pass(totals)

    def labels(self) -> np.ndarray | None:
        return self.base.labels()

    def label_names(self) -> list[str] | None:
        return self.base.label_names()

    def splits(self) -> dict[str, np.ndarray]:
        return self.base.splits()

    def stored_splits(self) -> list[dict[str, np.ndarray]]:
        return self.base.stored_splits()

    def split_origin(self) -> dict[str, Any]:
        return self.base.split_origin()

    def close(self) -> None:
        self.base.close()


FEATURE_CHUNK_ROWS = 1 << 16
"""Rows of one :class:`GeneratedFeatures` chunk (chunk k from seed [seed, 7, k])."""


class GeneratedFeatures(NodeDataOver):
    """Wrap a featureless source with seeded uniform [-1, 1) features [N, F], labels in [0, C).

    Only used when asked (``--features``/``--classes`` on a featureless input): the values carry
    no signal, they exist so that benchmarks can run models on real topologies. Chunk k of rows
    is drawn from its own seed, so any rank regenerates any chunk identically.
    """

    def __init__(self, base: GraphSource, num_features: int, num_classes: int, seed: int) -> None:
        self.base, self.seed = base, seed
        self.name = f"{base.name} + generated features"
        self.num_nodes = base.num_nodes
        self.files = base.files
        self.num_features = num_features if num_features else base.num_features
        self.num_edge_features = base.num_edge_features
        self.feature_dtype = np.dtype(np.float32) if num_features else base.feature_dtype
        self._gen_f = num_features > 0
        self._classes = num_classes
        self.random_access_features = not self._gen_f and base.random_access_features
        if num_features:
            rows = min(self.num_nodes, FEATURE_CHUNK_ROWS)
            check_memory(f"--features {num_features}", f"drawing a chunk of {rows} rows x "
                         f"{num_features} float32 features", rows * num_features * 4)


    def feature_chunks(self, part, nparts, chunk_rows):  # noqa: ANN001, ANN201 - see base
        if not self._gen_f:
            yield from self.base.feature_chunks(part, nparts, chunk_rows)
            return
        step = FEATURE_CHUNK_ROWS
        for k, lo in enumerate(range(0, self.num_nodes, step)):
            if k % nparts == part:
                hi = min(self.num_nodes, lo + step)
                rng = np.random.default_rng([self.seed, 7, k])
                x = rng.random((hi - lo, self.num_features), dtype=np.float32)
                x *= 2
                x -= 1
                yield lo, x

    def feature_rows(self, ids: np.ndarray) -> np.ndarray:
        return self.base.feature_rows(ids)

    def feature_density(self) -> float | None:
        """The base's features' (None for generated ones: prep measures them, all nonzero)."""
        return None if self._gen_f else self.base.feature_density()

    def labels(self) -> np.ndarray | None:
        if not self._classes:
            return self.base.labels()
        rng = np.random.default_rng([self.seed, 8])
        return rng.integers(0, self._classes, self.num_nodes, dtype=np.int64)

    def label_names(self) -> list[str] | None:
        return None if self._classes else self.base.label_names()


FEATURE_NORMALIZATIONS = ("none", "row")
"""What ``plexgt prep --normalize-features`` offers (:class:`RowNormalizedFeatures`)."""


def row_normalized(x: np.ndarray) -> np.ndarray:
    """[k, F] rows each divided by its sum (a row summing to 0 left as it is), in float32 (a
    float16 chunk comes back float16): PyG's ``T.NormalizeFeatures``."""
    x32 = np.asarray(x, dtype=np.float32)
    s = x32.sum(axis=1, dtype=np.float64, keepdims=True)
    s[s == 0] = 1.0
    out = (x32 / s).astype(np.float32, copy=False)
    return out.astype(x.dtype, copy=False) if x.dtype == np.float16 else out


class RowNormalizedFeatures(NodeDataOver):
    """``base`` with every feature row divided by its sum (``--normalize-features row``).

    Why at prep: the published recipes of Amazon / Coauthor (tunedGNN, PyG's examples) train
    on ``T.NormalizeFeatures()`` rows, and a row's sum needs the whole row, which every chunk
    of a source holds (chunks split rows, never columns); so the dense and the CSR feature
    tiles get the same normalised values, and nothing at training time depends on it.
    """

    def __init__(self, base: GraphSource) -> None:
        self.base = base
        self.name = base.name
        self.num_nodes = base.num_nodes
        self.files = base.files
        self.num_features = base.num_features
        self.num_edge_features = base.num_edge_features
        self.feature_dtype = base.feature_dtype
        self.random_access_features = base.random_access_features

    def feature_chunks(self, part, nparts, chunk_rows):  # noqa: ANN001, ANN201 - see base
        for first, x in self.base.feature_chunks(part, nparts, chunk_rows):
            yield first, row_normalized(x)

    def feature_rows(self, ids: np.ndarray) -> np.ndarray:
        return row_normalized(self.base.feature_rows(ids))

    def feature_density(self) -> float | None:
        """The base's: dividing a row by its nonzero sum keeps its zeros and nonzeros."""
        return self.base.feature_density()


def collect_edges(blocks: Iterable[tuple[np.ndarray, np.ndarray]]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Every (src, dst) block of a pass as two whole int64 arrays (empty when none).

    Why: the in-memory readers and ``--permutation balanced`` need the edge list whole, O(E)
    by design; everything else streams.
    """
    parts = list(blocks)
    if not parts:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    src = np.concatenate([p[0] for p in parts]).astype(np.int64, copy=False)
    dst = np.concatenate([p[1] for p in parts]).astype(np.int64, copy=False)
    return src, dst


def check_ids(src: np.ndarray, dst: np.ndarray, n: int, where: str) -> None:
    """Raise naming ``where`` and the first bad edge's id when an id is negative or >= n."""
    bad = first_id_error(src, dst, 0, n)
    if bad is not None:
        _, what, v = bad
        raise DataError(f"{where}: edge {what} id {v} is outside [0, {n})")


def check_memory(option: str, what: str, nbytes: int) -> None:
    """Refuse, before allocating, ``nbytes`` that this machine's memory cannot hold: a
    generator asked for 1e8 feature columns otherwise dies in numpy's MemoryError (and,
    inside prep, leaves its output behind). ``option`` and ``what`` name what needs them."""
    phys = physical_memory()
    if phys is not None and nbytes > phys:
        raise DataError(f"{option}: {what} takes {nbytes} bytes ({nbytes / 2**30:.3g} GiB), "
                        f"more than this machine's {phys / 2**30:.3g} GiB of memory")


def check_train_labels(name: str, labels: np.ndarray, train: np.ndarray | None) -> None:
    """Refuse labels of which the train split holds none: [N] class ids with no labelled
    train node, or [N, T] tasks with no labelled (node, task) entry among the train nodes
    (all NaN or missing). Such a graph trains on nothing: multi-label runs had ended with
    loss 0, ROC-AUC nan, "best validation epoch -1" and exit 0. Class ids of -1 throughout
    are a source without labels, which prep keeps (training refuses to train on it)."""
    have = labels >= 0
    if labels.ndim == 1 and not have.any():
        return
    idx = np.asarray(train if train is not None else [], dtype=np.int64)
    idx = idx[(idx >= 0) & (idx < labels.shape[0])]  # out-of-range ids are reported elsewhere
    if have[idx].any():
        return
    what = "(node, task) entries" if labels.ndim == 2 else "nodes"
    raise DataError(f"{name}: the train split's {idx.size} nodes hold no label (all -1, NaN or "
                    f"missing); {int(np.count_nonzero(have))} labelled {what} in all: "
                    "nothing to train on")


def check_finite(rows: np.ndarray, first_row: int, where: str) -> None:
    """Raise naming ``where`` and the row when a feature value is NaN or infinite."""
    ok = np.isfinite(rows)
    if not ok.all():
        r = int(np.nonzero(~ok.all(axis=1))[0][0])
        raise DataError(f"{where}: non-finite feature value in row {first_row + r}")
