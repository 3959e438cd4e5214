"""The in-memory graph every reader produces and every consumer (prep, reference models) takes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from plexgt.errors import DataError


@dataclass
class GraphData:
    """A graph with optional node features, labels and split.

    Edges are a COO pair ``src -> dst`` (int64, 0-based); a message flows from ``src`` to
    ``dst``, so the aggregation matrix A has A[dst, src] = 1.
    """

    name: str
    """Where the graph came from (a file path or a generator description)."""
    num_nodes: int
    """N."""
    src: np.ndarray
    """[E] int64 source ids."""
    dst: np.ndarray
    """[E] int64 destination ids."""
    features: np.ndarray | None = None
    """[N, F] float32 or float16, or None for a featureless graph."""
    labels: np.ndarray | None = None
    """[N] int64 class ids; -1 marks an unlabelled node."""
    splits: dict[str, np.ndarray] = field(default_factory=dict)
    """Node-index arrays keyed 'train', 'valid', 'test' (may be empty: :func:`random_split`)."""
    edge_attr: np.ndarray | None = None
    """[E, F_e] float features of the edges (the attention's edge bias), or None."""
    stored_splits: list[dict[str, np.ndarray]] = field(default_factory=list)
    """Every split the source stores (K dicts like ``splits``, ``splits`` the first), when a
    reader was asked for them all (``prep --split-index all``); [] otherwise."""

    @property
    def num_edge_features(self) -> int:
        return 0 if self.edge_attr is None else int(self.edge_attr.shape[1])

    @property
    def num_edges(self) -> int:
        return int(self.src.shape[0])

    @property
    def num_features(self) -> int:
        return 0 if self.features is None else int(self.features.shape[1])

    @property
    def num_classes(self) -> int:
        """Classes of class-id labels; tasks T of multi-label ones ([N, T])."""
        if self.labels is None or self.labels.size == 0:
            return 0
        if self.labels.ndim == 2:
            return int(self.labels.shape[1])
        return int(self.labels.max()) + 1

    def validate(self) -> None:
        """Raise :class:`DataError` for ids out of range, shape mismatches and non-finite data."""
        n = self.num_nodes
        if n <= 0:
            raise DataError(f"{self.name}: empty graph (0 nodes)")
        if self.src.shape != self.dst.shape or self.src.ndim != 1:
            raise DataError(f"{self.name}: edge source/destination arrays differ in shape")
        bad = first_id_error(self.src, self.dst, 0, n)
        if bad is not None:
            raise DataError(f"{self.name}: edge {bad[1]} id {bad[2]} is outside [0, {n})")
        if self.features is not None:
            if self.features.ndim != 2 or self.features.shape[0] != n:
                raise DataError(
                    f"{self.name}: feature rows {self.features.shape[0]} disagree with N={n}"
                )
            if not np.isfinite(self.features).all():
                row = int(np.nonzero(~np.isfinite(self.features).all(axis=1))[0][0])
                raise DataError(f"{self.name}: non-finite feature value in row {row}")
        if self.edge_attr is not None:
            ea = self.edge_attr
            if ea.ndim != 2 or ea.shape[0] != self.src.shape[0] or ea.dtype.kind != "f":
                raise DataError(f"{self.name}: edge features {ea.shape} {ea.dtype} must be "
                                f"float [E={self.src.shape[0]}, F_e]")
            if not np.isfinite(ea).all():
                e = int(np.nonzero(~np.isfinite(ea).all(axis=1))[0][0])
                raise DataError(f"{self.name}: non-finite edge feature of edge {e}")
        if self.labels is not None and self.labels.shape[:1] != (n,):
            raise DataError(f"{self.name}: {self.labels.shape[0]} labels disagree with N={n}")
        for k, splits in enumerate([self.splits, *self.stored_splits]):
            for key, idx in splits.items():
                if idx.size and (idx.min() < 0 or idx.max() >= n):
                    which = f" of stored split {k - 1}" if k else ""
                    raise DataError(f"{self.name}: split '{key}'{which} holds a node id "
                                    f"outside [0, {n})")


def class_ids(raw: np.ndarray, where: str) -> np.ndarray:
    """[N] int64 class ids from an array a reader found: integers, or floats that hold whole
    numbers (some files store labels as float); anything else is refused, never truncated
    (a float 2.7 would silently become class 2)."""
    raw = np.asarray(raw)
    if raw.dtype.kind == "f":
        bad = ~np.isfinite(raw) | (raw != np.round(raw))
        if bad.any():
            i = int(np.flatnonzero(bad.reshape(-1))[0])
            raise DataError(f"{where}: label of node {i} is {float(raw.reshape(-1)[i])}, not a "
                            "whole number (class ids are integers)")
    elif raw.dtype.kind not in "iub":
        raise DataError(f"{where}: labels of dtype {raw.dtype} are not class ids")
    return raw.astype(np.int64)


def node_labels(raw: np.ndarray, where: str) -> np.ndarray:
    """Labels as a reader found them, made one of the two kinds a task trains on: [N] int64
    class ids (:func:`class_ids`; an [N, 1] column is one too), or multi-label [N, T] int8
    with T >= 2 tasks, 1 / 0 per node and task and -1 where that task is unlabelled (float
    files mark it NaN, the way OGB stores ogbn-proteins-like tasks)."""
    raw = np.asarray(raw)
    if raw.ndim == 2 and raw.shape[1] == 1:
        raw = raw[:, 0]
    if raw.ndim == 1:
        return class_ids(raw, where)
    if raw.ndim != 2:
        raise DataError(f"{where}: labels of shape {raw.shape}; expected [N] class ids or "
                        "[N, T] multi-label 0/1")
    if raw.dtype.kind == "f":
        out = np.where(np.isnan(raw), -1.0, raw)
    elif raw.dtype.kind in "iub":
        out = raw.astype(np.int64)
    else:
        raise DataError(f"{where}: labels of dtype {raw.dtype} are not 0/1 task labels")
    bad = (out != 0) & (out != 1) & (out != -1)
    if bad.any():
        i, t = np.argwhere(bad)[0]
        raise DataError(f"{where}: label of node {int(i)} task {int(t)} is {raw[i, t]}; "
                        "multi-label tasks hold 0 or 1 (NaN or -1: unlabelled)")
    return out.astype(np.int8)


def integer_ids(a: np.ndarray, what: str, where: str) -> np.ndarray:
    """An index array as found in a file, refused unless its dtype is an integer one: float
    indices would be truncated into other nodes' ids without a word."""
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise DataError(f"{where}: {what} has dtype {a.dtype}; indices must be integers")
    return a


def first_id_error(src: np.ndarray, dst: np.ndarray, lo: int, hi: int | None
                   ) -> tuple[int, str, int] | None:
    """(row, 'source' | 'destination', id) of the first row holding an id outside [lo, hi).

    The one id range check of the readers and sources; each words its own message.
    """
    def out(v: np.ndarray | int) -> np.ndarray | bool:
        return (v < lo) | (v >= hi) if hi is not None else v < lo

    if all(not a.size or not (out(a.min()) or out(a.max())) for a in (src, dst)):
        return None  # the common case: two reductions an array, no [k] masks
    r = int(np.argmax(out(src) | out(dst)))
    s = int(src[r])
    return (r, "source", s) if out(s) else (r, "destination", int(dst[r]))


def symmetrize(g: GraphData) -> GraphData:
    """Add every reverse edge and merge duplicates (self loops kept once)."""
    src = np.concatenate([g.src, g.dst])
    dst = np.concatenate([g.dst, g.src])
    src, dst = dedup_edges(src, dst, g.num_nodes)
    return GraphData(g.name, g.num_nodes, src, dst, g.features, g.labels, dict(g.splits))


def dedup_edges(src: np.ndarray, dst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge duplicate (src, dst) pairs; the result is sorted by (dst, src)."""
    key = np.unique(dst.astype(np.int64) * n + src.astype(np.int64))
    return (key % n).astype(np.int64), (key // n).astype(np.int64)


def random_split(
    n: int, seed: int, fractions: tuple[float, float] = (0.6, 0.2)
) -> dict[str, np.ndarray]:
    """A seeded random train/valid/test split of ``n`` nodes (default 60/20/20)."""
    perm = np.random.default_rng(seed).permutation(n)
    a = int(round(fractions[0] * n))
    b = a + int(round(fractions[1] * n))
    return {"train": np.sort(perm[:a]), "valid": np.sort(perm[a:b]), "test": np.sort(perm[b:])}
