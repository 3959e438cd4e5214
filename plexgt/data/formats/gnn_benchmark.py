"""The gnn-benchmark npz layout (Shchur et al.), as read by PyG's Amazon and Coauthor loaders.

Keys: ``adj_data adj_indices adj_indptr adj_shape`` (CSR adjacency, row = source),
``attr_*`` (CSR or dense features), ``labels``. Loaded with ``allow_pickle=False``: a file that
needs unpickling is refused, never executed.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from plexgt.data.graph import DataError, GraphData


def _csr(z: np.lib.npyio.NpzFile, prefix: str, path: Path) -> sp.csr_matrix:
    try:
        data, indices, indptr = (z[f"{prefix}_{k}"] for k in ("data", "indices", "indptr"))
        shape = tuple(int(s) for s in z[f"{prefix}_shape"])
    except KeyError as e:
        raise DataError(f"{path}: missing key {e.args[0]!r}") from None
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
    try:
        with np.load(path, allow_pickle=False) as z:
            adj = _csr(z, "adj", path).tocoo()
            if "attr_data" in z.files:
                feats = _csr(z, "attr", path).toarray().astype(np.float32)
            elif "attr_matrix" in z.files:
                feats = np.asarray(z["attr_matrix"], dtype=np.float32)
            else:
                feats = None
            labels = np.asarray(z["labels"], dtype=np.int64) if "labels" in z.files else None
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
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
