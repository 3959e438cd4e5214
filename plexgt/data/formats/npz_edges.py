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
  chosen by ``split_index`` (an index the file does not hold is an error), or all K kept
  (``--split-index all``: the heterophilous benchmarks report mean ± std over their 10);
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


def _mask_rows(path: Path, key: str, m: np.ndarray, n: int) -> np.ndarray:
    """[K, n] bool: the K stored splits' masks of ``key`` (one row for an [N] mask)."""
    m = np.asarray(m)
    if m.dtype != bool and not (m.dtype.kind in "iu" and set(np.unique(m)) <= {0, 1}):
        raise DataError(f"{path}: '{key}' has dtype {m.dtype}; masks are booleans")
    m = m.astype(bool)
    if m.ndim == 2 and m.shape[0] == n and m.shape[1] != n:
        m = m.T
    if m.ndim == 1:
        m = m[None]
    if m.ndim != 2 or m.shape[1] != n:
        raise DataError(f"{path}: '{key}' has shape {m.shape}; expected [{n}] or [K, {n}]")
    return m


def _mask(path: Path, key: str, m: np.ndarray, n: int, split: int) -> np.ndarray:
    """Node ids of stored split ``split`` of mask ``key`` (an index it lacks: DataError)."""
    rows = _mask_rows(path, key, m, n)
    if not 0 <= split < rows.shape[0]:
        raise _not_held(f"{path}: '{key}'", rows.shape[0], split)
    return np.flatnonzero(rows[split])


def _not_held(where: str, k: int, split: int) -> DataError:
    """The one wording of a ``--split-index`` the source lacks, whichever way it stores its
    ``k`` splits (mask rows, an OGB root's split/ directory)."""
    return DataError(f"{where} holds {k} split{'s' if k > 1 else ''}; --split-index {split} "
                     "is not one of them")


def chosen_split(where: str | Path, stored: list[dict[str, np.ndarray]],
                 split_index: int | None) -> tuple[dict[str, np.ndarray],
                                                   list[dict[str, np.ndarray]]]:
    """(split ``split_index`` of the ``stored`` whole splits, []) or, ``split_index`` None,
    (split 0, all of them): what :func:`read_masks` returns, for a source that stores its
    splits as whole records rather than mask rows."""
    if split_index is None:
        return stored[0], stored
    if not 0 <= split_index < len(stored):
        raise _not_held(f"{where}:", len(stored), split_index)
    return stored[split_index], []


ALL = "all"
"""``--split-index all``: keep every stored split (prep writes each; ``plexgt train
--split-index all`` trains one run per split)."""


def split_index_arg(text: str) -> int | str:
    """``--split-index``'s value: a split's index, or :data:`ALL`."""
    if text.strip().lower() == ALL:
        return ALL
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a split index (0, 1, ...) or "
                                         f"'{ALL}'") from None


def read_masks(path: Path, found: dict[str, tuple[str, np.ndarray]], n: int,
               split_index: int | None) -> tuple[dict[str, np.ndarray],
                                                  list[dict[str, np.ndarray]]]:
    """(the split ``split_index`` of the masks ``found`` ({split: (key, array)}), and [])
    or, ``split_index`` None, (split 0, every stored split): the K of every key must then
    agree, since split k is the k-th row of each."""
    if split_index is not None:
        return {s: _mask(path, key, m, n, split_index) for s, (key, m) in found.items()}, []
    rows = {s: (key, _mask_rows(path, key, m, n)) for s, (key, m) in found.items()}
    counts = {key: r.shape[0] for key, r in rows.values()}
    if len(set(counts.values())) > 1:
        raise DataError(f"{path}: the masks hold different numbers of splits ("
                        + ", ".join(f"'{k}' {c}" for k, c in counts.items())
                        + f"); --split-index {ALL} needs the same K in each")
    k = next(iter(counts.values()), 0)
    if k == 0:
        raise DataError(f"{path}: holds no split masks; --split-index {ALL} has none to keep")
    stored = [{s: np.flatnonzero(r[i]) for s, (_, r) in rows.items()} for i in range(k)]
    return stored[0], stored


def dataset_split(split_index: int | str | None, stored: int) -> dict[str, object]:
    """The manifest's ``split`` record of a source's own split(s): the index prep kept, or
    ``all`` and how many (``stored``)."""
    if split_index == ALL:
        return {"origin": "dataset", "split_index": ALL, "num_splits": stored}
    return {"origin": "dataset", "split_index": split_index or 0}


def read_edge_npz(path: str | Path, split_index: int | None = 0) -> GraphData:
    """The graph of an edge-index npz (module docstring), validated; ``split_index`` None:
    every stored split kept (``stored_splits``), the first its ``splits``."""
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
        found = {name: m for name, keys in MASK_KEYS.items()
                 if (m := _first(z, path, keys)) is not None}
        splits, stored = read_masks(path, found, n, split_index)
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
    g = GraphData(str(path), n, src, dst, x, y, splits, edge_attr=attr, stored_splits=stored)
    g.validate()
    return g


SPLIT_INDEX = option(
    "--split-index", "which of several stored splits (masks [K, N]) to use (default 0), or "
    "'all': keep every one (plexgt train --split-index all trains one run per split)",
    type=split_index_arg, metavar="K|all", refused="--split-index chooses among an npz's "
    "stored splits; --format {fmt} has none to choose")


def _recognise(probe: Probe) -> bool:
    return is_edge_npz(probe.npz_keys)


def _open(args: argparse.Namespace, comm: HostComm | None) -> GraphSource:
    k = args.split_index
    g = read_edge_npz(args.input, None if k == ALL else k or 0)
    return MemorySource(g, [args.input], split_origin=dataset_split(k, len(g.stored_splits)))


SPEC = FormatSpec(
    "npz", "edge-index npz: edges/edge_index, node_features, node_labels, masks (several "
    "splits), edge_feat", _open, input="an .npz", recognise=_recognise, order=30,
    looked_for="an .npz with edges or edge_index", options=(SPLIT_INDEX,))
