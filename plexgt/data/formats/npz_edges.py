"""Edge-index npz: the layout of the heterophilous-graph benchmarks and of many PyG exports.

Keys (the first of each pair found is used):

* ``edges`` or ``edge_index``: [E, 2] or [2, E] integer node ids (a row ``a b`` is a -> b);
* ``node_features`` or ``x``: [N, F] floats (optional: then ``--features`` may generate them);
* ``node_labels`` or ``y``: [N] class ids, or [N, T] multi-label 0/1 (NaN or -1:
  unlabelled) (optional);
* ``train_masks`` / ``val_masks`` / ``test_masks`` (or ``train_mask`` ...): [N] booleans, or
  several splits as [K, N] (or [N, K]), one chosen by ``split_index``;
* ``edge_feat``: [E, F_e] edge features, kept as the ring-attention issue stores them.

N is the feature rows', else the labels', else max id + 1. Read whole (these files are small);
every error names the file, the key and the problem.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from plexgt.data.graph import GraphData, integer_ids, node_labels
from plexgt.errors import DataError

EDGE_KEYS = ("edges", "edge_index")
FEATURE_KEYS = ("node_features", "x")
LABEL_KEYS = ("node_labels", "y")
MASK_KEYS = {"train": ("train_masks", "train_mask"), "valid": ("val_masks", "val_mask",
                                                               "valid_masks", "valid_mask"),
             "test": ("test_masks", "test_mask")}


def is_edge_npz(keys: set[str]) -> bool:
    """Whether an npz's keys are this layout's."""
    return any(k in keys for k in EDGE_KEYS)


def _first(z: np.lib.npyio.NpzFile, keys: tuple[str, ...]) -> tuple[str, np.ndarray] | None:
    for k in keys:
        if k in z.files:
            return k, z[k]
    return None


def _mask(path: Path, key: str, m: np.ndarray, n: int, split: int) -> np.ndarray:
    m = np.asarray(m)
    if m.dtype != bool and not (m.dtype.kind in "iu" and set(np.unique(m)) <= {0, 1}):
        raise DataError(f"{path}: '{key}' has dtype {m.dtype}; masks are booleans")
    m = m.astype(bool)
    if m.ndim == 2 and m.shape[0] == n and m.shape[1] != n:
        m = m.T
    if m.ndim == 2:
        if not 0 <= split < m.shape[0]:
            raise DataError(f"{path}: '{key}' holds {m.shape[0]} splits; --split-index "
                            f"{split} is not one of them")
        m = m[split]
    if m.shape != (n,):
        raise DataError(f"{path}: '{key}' has shape {m.shape}; expected [{n}] or [K, {n}]")
    return np.flatnonzero(m)


def read_edge_npz(path: str | Path, split_index: int = 0) -> GraphData:
    """The graph of an edge-index npz (module docstring), validated."""
    path = Path(path)
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable npz ({e})") from None
    with z:
        found = _first(z, EDGE_KEYS)
        if found is None:
            raise DataError(f"{path}: missing key 'edges' or 'edge_index' (has "
                            f"{', '.join(z.files)})")
        key, e = found
        e = integer_ids(e, f"'{key}'", str(path))
        if e.ndim != 2 or 2 not in e.shape:
            raise DataError(f"{path}: '{key}' has shape {e.shape}; expected [E, 2] or [2, E]")
        if e.shape[1] != 2:  # [2, E]
            e = e.T
        src, dst = (np.ascontiguousarray(e[:, i], dtype=np.int64) for i in (0, 1))
        feats = _first(z, FEATURE_KEYS)
        x = None
        if feats is not None:
            x = np.asarray(feats[1])
            if x.ndim != 2 or x.dtype.kind != "f":
                raise DataError(f"{path}: '{feats[0]}' has shape {x.shape} and dtype "
                                f"{x.dtype}; expected float [N, F]")
            x = x.astype(np.float32) if x.dtype not in (np.float16, np.float32) else x
        lab = _first(z, LABEL_KEYS)
        y = None if lab is None else node_labels(np.asarray(lab[1]), f"{path}: '{lab[0]}'")
        hi = int(max(src.max(initial=-1), dst.max(initial=-1))) + 1
        n = x.shape[0] if x is not None else y.shape[0] if y is not None else hi
        if hi > n:
            bad = int(np.argmax((src >= n) | (dst >= n)))
            raise DataError(f"{path}: '{key}' row {bad} holds node id "
                            f"{max(int(src[bad]), int(dst[bad]))}, beyond the {n} nodes")
        if y is not None and y.shape[0] != n:
            raise DataError(f"{path}: '{lab[0]}' has {y.shape[0]} labels for {n} nodes")
        splits = {}
        for name, keys in MASK_KEYS.items():
            m = _first(z, keys)
            if m is not None:
                splits[name] = _mask(path, m[0], m[1], n, split_index)
        attr = None
        if "edge_feat" in z.files:
            attr = np.asarray(z["edge_feat"])
            if attr.ndim == 1:
                attr = attr[:, None]
            attr = attr.astype(np.float32)
    g = GraphData(str(path), n, src, dst, x, y, splits, edge_attr=attr)
    g.validate()
    return g
