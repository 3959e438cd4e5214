"""Edge-index npz: the layout of the heterophilous-graph benchmarks and of many PyG exports.

Keys (the first of each pair found is used):

* ``edges`` or ``edge_index``: integer node ids, edge k being ``a -> b``. ``edges`` is
  [E, 2] (row k = ``a b``: the heterophilous benchmarks' layout), ``edge_index`` [2, E]
  (column k: PyG's). Either key's array may come the other way round, and is read so when
  only that fits; a square one ([2, 2]: two edges) is read as its key's own layout;
* ``node_features`` or ``x``: [N, F] floats (optional: then ``--features`` may generate them);
* ``node_labels`` or ``y``: [N] class ids, or [N, T] multi-label 0/1 (NaN or -1:
  unlabelled) (optional);
* ``train_masks`` / ``val_masks`` / ``test_masks`` (or ``train_mask`` ...): [N] booleans (one
  split: ``split_index`` 0), or several splits as [K, N] (or [N, K]; [N, N] is [K, N]), one
  chosen by ``split_index`` (an index the file does not hold is an error);
* ``edge_feat``: [E, F_e] (or [E]) numeric edge features, kept as the ring-attention issue
  stores them.

N is the feature rows', else the labels', else max id + 1. Read whole (these files are small);
every error names the file, the key and the problem.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from plexgt.data.formats.spec import FormatSpec, Probe, option
from plexgt.data.graph import GraphData, integer_ids, node_labels
from plexgt.data.npzio import NPZ_ERRORS
from plexgt.data.source import GraphSource, MemorySource
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import DataError

EDGE_KEYS = ("edges", "edge_index")
EDGES_FIRST = {"edges": False, "edge_index": True}
"""Whether a key's own layout is [2, E] (else [E, 2]): how a square array is read."""
FEATURE_KEYS = ("node_features", "x")
LABEL_KEYS = ("node_labels", "y")
MASK_KEYS = {"train": ("train_masks", "train_mask"), "valid": ("val_masks", "val_mask",
                                                               "valid_masks", "valid_mask"),
             "test": ("test_masks", "test_mask")}


def is_edge_npz(keys: set[str] | frozenset[str]) -> bool:
    """Whether an npz's keys are this layout's."""
    return any(k in keys for k in EDGE_KEYS)


def _array(z: np.lib.npyio.NpzFile, path: Path, key: str) -> np.ndarray:
    """Member ``key``, its read errors one line: a truncated or corrupt member, or an object
    array (which only unpickling, never done here, could load)."""
    try:
        return np.asarray(z[key])
    except NPZ_ERRORS as e:
        if isinstance(e, ValueError) and "allow_pickle" in str(e):
            raise DataError(f"{path}: '{key}' holds Python objects (loading it would need "
                            "allow_pickle, which plexgt never uses); store numbers") from None
        raise DataError(f"{path}: '{key}' is truncated or corrupt ({e})") from None


def _first(z: np.lib.npyio.NpzFile, path: Path, keys: tuple[str, ...]
           ) -> tuple[str, np.ndarray] | None:
    for k in keys:
        if k in z.files:
            return k, _array(z, path, k)
    return None


def _edge_pairs(path: Path, key: str, e: np.ndarray) -> np.ndarray:
    """[E, 2] of ``key``'s array (module docstring: its layout, the other way round when
    only that fits)."""
    if e.ndim != 2 or 2 not in e.shape:
        raise DataError(f"{path}: '{key}' has shape {e.shape}; expected "
                        f"{'[2, E] or [E, 2]' if EDGES_FIRST[key] else '[E, 2] or [2, E]'}")
    two_by_e = e.shape[0] == 2 and (EDGES_FIRST[key] or e.shape[1] != 2)
    return e.T if two_by_e else e


def _mask(path: Path, key: str, m: np.ndarray, n: int, split: int) -> np.ndarray:
    m = np.asarray(m)
    if m.dtype != bool and not (m.dtype.kind in "iu" and set(np.unique(m)) <= {0, 1}):
        raise DataError(f"{path}: '{key}' has dtype {m.dtype}; masks are booleans")
    m = m.astype(bool)
    if m.ndim == 2 and m.shape[0] == n and m.shape[1] != n:
        m = m.T
    k = m.shape[0] if m.ndim == 2 else 1
    if not 0 <= split < k:
        raise DataError(f"{path}: '{key}' holds {k} split{'s' if k > 1 else ''}; "
                        f"--split-index {split} is not one of them")
    if m.ndim == 2:
        m = m[split]
    if m.shape != (n,):
        raise DataError(f"{path}: '{key}' has shape {m.shape}; expected [{n}] or [K, {n}]")
    return np.flatnonzero(m)


def read_edge_npz(path: str | Path, split_index: int = 0) -> GraphData:
    """The graph of an edge-index npz (module docstring), validated."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        z = np.load(path, allow_pickle=False)
    except NPZ_ERRORS as e:
        raise DataError(f"{path}: not a readable npz ({e})") from None
    with z:
        found = _first(z, path, EDGE_KEYS)
        if found is None:
            raise DataError(f"{path}: missing key 'edges' or 'edge_index' (has "
                            f"{', '.join(z.files)})")
        key, e = found
        e = _edge_pairs(path, key, integer_ids(e, f"'{key}'", str(path)))
        src, dst = (np.ascontiguousarray(e[:, i], dtype=np.int64) for i in (0, 1))
        feats = _first(z, path, FEATURE_KEYS)
        x = None
        if feats is not None:
            x = np.asarray(feats[1])
            if x.ndim != 2 or x.dtype.kind != "f":
                raise DataError(f"{path}: '{feats[0]}' has shape {x.shape} and dtype "
                                f"{x.dtype}; expected float [N, F]")
            x = x.astype(np.float32) if x.dtype not in (np.float16, np.float32) else x
        lab = _first(z, path, LABEL_KEYS)
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
            m = _first(z, path, keys)
            if m is not None:
                splits[name] = _mask(path, m[0], m[1], n, split_index)
        if not splits and split_index != 0:
            raise DataError(f"{path}: holds no split masks; --split-index {split_index} "
                            "has none to choose")
        attr = None
        if "edge_feat" in z.files:
            attr = _array(z, path, "edge_feat")
            if attr.dtype.kind not in "fiub":
                raise DataError(f"{path}: 'edge_feat' has dtype {attr.dtype}; edge features "
                                "are numbers")
            if attr.ndim == 1:
                attr = attr[:, None]
            attr = attr.astype(np.float32)
    g = GraphData(str(path), n, src, dst, x, y, splits, edge_attr=attr)
    g.validate()
    return g


SPLIT_INDEX = option(
    "--split-index", "which of several stored splits (masks [K, N]) to use (default 0)",
    type=int, refused="--split-index chooses among an npz's stored splits; --format {fmt} "
    "has none to choose")


def _recognise(probe: Probe) -> bool:
    return is_edge_npz(probe.npz_keys)


def _open(args: argparse.Namespace, comm: HostComm | None) -> GraphSource:
    k = args.split_index or 0
    return MemorySource(read_edge_npz(args.input, k), [args.input],
                        split_origin={"origin": "dataset", "split_index": k})


SPEC = FormatSpec(
    "npz", "edge-index npz: edges/edge_index, node_features, node_labels, masks (several "
    "splits), edge_feat", _open, input="an .npz", recognise=_recognise, order=30,
    looked_for="an .npz with edges or edge_index", options=(SPLIT_INDEX,))
