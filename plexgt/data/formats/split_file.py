"""An external train/valid/test split (``--split-file``): tunedGNN's ``*_split.npz`` layout.

Luo, Shi & Wu ("Classic GNNs are strong baselines", NeurIPS 2024; github.com/LUOyk1999/
tunedGNN, ``medium_graph/data/*_split.npz``) publish their 60/20/20 splits of Amazon
Computers / Photo and Coauthor CS / Physics as an npz of three 1-D int64 arrays ``train``,
``valid``, ``test`` of node ids, in the order of the gnn-benchmark npz's rows (PyG's Amazon and
Coauthor read that npz without reordering). Their published numbers are on these splits, so a
reproduction must train on the same nodes, not on a fresh random 60/20/20 one.

Also accepted: boolean masks [N] under the same keys (the other common layout). Loaded with
``allow_pickle=False``. Refused with one line naming the file: a missing or unknown key, ids
outside [0, N), a mask of another length, a node listed twice or in two splits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from plexgt.data.formats.spec import option
from plexgt.data.npzio import NPZ_ERRORS
from plexgt.errors import DataError
from plexgt.util.files import sha256_file

SPLIT_KEYS = ("train", "valid", "test")

SPLIT_FILE = option(
    "--split-file", "an npz of train/valid/test node-id arrays (tunedGNN's *_split.npz "
    "layout; boolean [N] masks also read) that replaces the source's split; its path and "
    "sha256 are recorded in the manifest", type=Path,
    refused="--split-file replaces the split of --format {accepted}, not {fmt}")


def read_split_file(path: str | Path, n: int) -> dict[str, np.ndarray]:
    """{train, valid, test: int64 node ids, sorted} of the npz ``path`` for a graph of ``n``
    nodes, checked (module docstring)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = sorted(z.files)
            arrays = {k: np.asarray(z[k]) for k in SPLIT_KEYS if k in z.files}
    except FileNotFoundError:
        raise DataError(f"{path}: no such split file") from None
    except NPZ_ERRORS as e:
        raise DataError(f"{path}: not a readable npz split file ({e})") from None
    if sorted(SPLIT_KEYS) != keys:
        raise DataError(f"{path}: split file keys {', '.join(keys) or '(none)'}; expected "
                        f"exactly {', '.join(SPLIT_KEYS)}")
    out: dict[str, np.ndarray] = {}
    owner = np.full(n, -1, dtype=np.int8)
    for j, k in enumerate(SPLIT_KEYS):
        a = arrays[k]
        if a.ndim != 1:
            raise DataError(f"{path}: split '{k}' has shape {a.shape}; expected 1-D node ids "
                            "or a 1-D mask")
        if a.dtype == np.bool_:
            if a.shape[0] != n:
                raise DataError(f"{path}: split '{k}' is a mask of {a.shape[0]} entries for a "
                                f"graph of {n} nodes")
            idx = np.flatnonzero(a).astype(np.int64)
        elif a.dtype.kind in "iu":
            idx = a.astype(np.int64)
            if idx.size and (idx.min() < 0 or idx.max() >= n):
                bad = int(idx[(idx < 0) | (idx >= n)][0])
                raise DataError(f"{path}: split '{k}' holds node id {bad}, outside [0, {n}) "
                                "(a split file of another graph?)")
        else:
            raise DataError(f"{path}: split '{k}' has dtype {a.dtype}; expected integer ids "
                            "or a boolean mask")
        uniq = np.unique(idx)
        if uniq.size != idx.size:
            raise DataError(f"{path}: split '{k}' lists {idx.size - uniq.size} node(s) more "
                            "than once")
        hit = owner[uniq] >= 0
        if hit.any():
            node = int(uniq[np.flatnonzero(hit)[0]])
            raise DataError(f"{path}: node {node} is in both the "
                            f"'{SPLIT_KEYS[owner[node]]}' and the '{k}' split")
        owner[uniq] = j
        out[k] = uniq
    return out


def split_file_origin(path: str | Path, splits: dict[str, np.ndarray]) -> dict[str, Any]:
    """The manifest's ``split`` record of a split read from ``path``: where it came from (the
    resolved path and the file's sha256, so a result names the exact nodes it used)."""
    p = Path(path).resolve()
    return {"origin": "file", "path": str(p), "sha256": sha256_file(p),
            "sizes": {k: int(v.size) for k, v in splits.items()}}
