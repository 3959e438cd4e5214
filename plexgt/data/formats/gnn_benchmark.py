"""The gnn-benchmark npz layout (Shchur et al.), as read by PyG's Amazon and Coauthor loaders.

Keys: ``adj_data adj_indices adj_indptr adj_shape`` (CSR adjacency, row = source),
``attr_*`` (CSR or dense features), ``labels``. Loaded with ``allow_pickle=False``: a file that
needs unpickling is refused, never executed.

A directory holding ``reddit_data.npz`` (``feature`` [N, F], ``label`` [N], ``node_types`` [N]:
1 train, 2 valid, 3 test) and ``reddit_graph.npz`` (a scipy ``save_npz`` COO matrix, row =
source) is the other npz layout PyG reads (Reddit, as DGL publishes it); :func:`read_reddit`
reads it, and :func:`read_gnn_benchmark` dispatches to it when given such a directory.

``--split-file`` replaces either's split by an external one (tunedGNN's ``*_split.npz``:
:mod:`plexgt.data.formats.split_file`), its origin recorded in the manifest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from plexgt.data.formats.spec import FormatSpec, Probe
from plexgt.data.formats.split_file import SPLIT_FILE, read_split_file, split_file_origin
from plexgt.data.graph import GraphData, class_ids, integer_ids
from plexgt.data.npzio import NPZ_ERRORS, require_arrays
from plexgt.data.source import GraphSource, MemorySource
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import DataError

CSR_KEYS = frozenset({"adj_data", "adj_indices", "adj_indptr"})


def _csr(z: np.lib.npyio.NpzFile, prefix: str, path: Path) -> sp.csr_matrix:
    require_arrays(path, z.files, tuple(f"{prefix}_{k}" for k in ("data", "indices", "indptr",
                                                             "shape")))
    data, indices, indptr = (z[f"{prefix}_{k}"] for k in ("data", "indices", "indptr"))
    indices = integer_ids(indices, f"{prefix}_indices", str(path))
    indptr = integer_ids(indptr, f"{prefix}_indptr", str(path))
    shape = tuple(int(s) for s in z[f"{prefix}_shape"])
    if len(shape) != 2 or indptr.shape != (shape[0] + 1,):
        raise DataError(f"{path}: {prefix}_shape {shape} disagrees with {prefix}_indptr")
    if indptr[-1] != indices.shape[0] or indices.shape != data.shape:
        raise DataError(f"{path}: {prefix}_indptr claims {indptr[-1]} entries, file holds "
                        f"{indices.shape[0]}")
    if indices.size and (indices.min() < 0 or indices.max() >= shape[1]):
        raise DataError(f"{path}: {prefix}_indices hold a column outside [0, {shape[1]})")
    if np.any(np.diff(indptr) < 0):
        raise DataError(f"{path}: {prefix}_indptr is not non-decreasing")
    return sp.csr_matrix((data, indices, indptr), shape=shape)


def read_gnn_benchmark(path: str | Path) -> GraphData:
    """Read one gnn-benchmark ``.npz`` file (edges as stored: possibly directed)."""
    path = Path(path)
    if path.is_dir():
        return read_reddit(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            adj = _csr(z, "adj", path).tocoo()
            if "attr_data" in z.files:
                feats = _csr(z, "attr", path).toarray().astype(np.float32)
            elif "attr_matrix" in z.files:
                feats = np.asarray(z["attr_matrix"], dtype=np.float32)
            else:
                feats = None
            labels = class_ids(z["labels"], str(path)) if "labels" in z.files else None
    except DataError:
        raise
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except NPZ_ERRORS as e:
        raise DataError(f"{path}: not a readable npz file ({e})") from None
    n = adj.shape[0]
    if adj.shape[1] != n:
        raise DataError(f"{path}: adjacency is {adj.shape[0]}x{adj.shape[1]}, not square")
    g = GraphData(
        name=str(path),
        num_nodes=n,
        src=adj.row.astype(np.int64),
        dst=adj.col.astype(np.int64),
        features=feats,
        labels=labels,
    )
    g.validate()
    return g


def _load(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            require_arrays(path, z.files, keys)
            return {k: np.asarray(z[k]) for k in keys}
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except NPZ_ERRORS as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{path}: not a readable npz file ({e})") from None


def read_reddit(root: str | Path) -> GraphData:
    """Read the Reddit npz pair (``reddit_data.npz`` + ``reddit_graph.npz``) in ``root``."""
    root = Path(root)
    d = _load(root / "reddit_data.npz", ("feature", "label", "node_types"))
    gp = root / "reddit_graph.npz"
    a = _load(gp, ("row", "col", "shape", "format"))
    if a["format"].tobytes().rstrip(b"\0") != b"coo":
        raise DataError(f"{gp}: sparse format {a['format']!r} unsupported (expected coo)")
    shape = tuple(int(s) for s in a["shape"])
    n = d["feature"].shape[0] if d["feature"].ndim == 2 else -1
    if shape != (n, n):
        raise DataError(f"{gp}: adjacency shape {shape} disagrees with {n} feature rows")
    if a["row"].shape != a["col"].shape:
        raise DataError(f"{gp}: row and col arrays differ in length")
    types = d["node_types"].astype(np.int64)
    if types.shape != (n,):
        raise DataError(f"{root / 'reddit_data.npz'}: {types.shape[0]} node types disagree "
                        f"with N={n}")
    splits = {k: np.nonzero(types == t)[0] for k, t in (("train", 1), ("valid", 2), ("test", 3))}
    g = GraphData(str(root), n, a["row"].astype(np.int64), a["col"].astype(np.int64),
                  np.asarray(d["feature"], dtype=np.float32), d["label"].astype(np.int64),
                  splits)
    g.validate()
    return g


def _recognise(probe: Probe) -> bool:
    return probe.holds_match("reddit_*.npz") or CSR_KEYS <= probe.npz_keys


def _open(args: argparse.Namespace, comm: HostComm | None) -> GraphSource:
    files = sorted(args.input.glob("*.npz")) if args.input.is_dir() else [args.input]
    g = read_gnn_benchmark(args.input)
    path = getattr(args, "split_file", None)
    if path is None:
        return MemorySource(g, files)
    g.splits = read_split_file(path, g.num_nodes)
    return MemorySource(g, files, split_origin=split_file_origin(path, g.splits))


SPEC = FormatSpec(
    "gnn-benchmark", "Shchur et al.'s npz (CSR adjacency, features, labels), or Reddit's "
    "reddit_*.npz pair", _open, input="an .npz, or the Reddit directory of reddit_*.npz",
    recognise=_recognise, order=20, looked_for="a directory of reddit_*.npz or an .npz with "
    "adj_data/adj_indices/adj_indptr", options=(SPLIT_FILE,))
