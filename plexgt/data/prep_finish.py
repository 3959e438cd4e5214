"""Stage 4 of a prep run (:mod:`plexgt.data.prep_stages` has the first three): rank 0 writes
nodes.h5 (permutations, labels, degrees, split masks in both orders) and, last, the manifest,
whose presence marks the prepared directory complete.
"""

from __future__ import annotations

import time
from typing import Any

import h5py
import numpy as np

from plexgt import __version__
from plexgt.data.graph import node_labels, random_split
from plexgt.data.h5write import dataset, write_h5_atomic
from plexgt.data.permute import inverse
from plexgt.data.prep_run import PrepRun
from plexgt.data.prep_stages import count_grid
from plexgt.data.prepared import (
    A1,
    A2,
    ANCHOR,
    FEATURE_UNIT,
    FEATURES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    MATRICES,
    NODES,
    P2Q_DS,
    ROW_ORDER,
    SPLITS,
    STAGING,
    TILE_DEG,
    TILE_FORMAT,
    deg_ds,
    labels_ds,
    mask_ds,
    owned_file,
    perm_ds,
    remove_prepared,
    tile_file,
)
from plexgt.data.reciprocity import AUTO_SYMMETRIZE_BELOW
from plexgt.data.source import check_train_labels
from plexgt.errors import DataError
from plexgt.util.files import read_json, sha256_file, write_json_atomic


def finish_stage(run: PrepRun, t_start: float) -> dict[str, Any]:
    """Collective: rank 0 writes nodes.h5 and the manifest; returns it on every rank."""
    comm = run.comm
    manifest = run.local(lambda: finish(run, t_start) if comm.rank == 0 else None)
    return comm.bcast(manifest)


def finish(run: PrepRun, t_start: float) -> dict[str, Any]:
    """Rank 0: nodes.h5, then the manifest (its presence marks the directory complete), then
    the staging area goes. Returns the manifest."""
    manifest = manifest_of(run, *write_nodes(run), t_start)
    for sub in (*MATRICES, FEATURES):  # leftovers of interrupted writes
        for tmp in run.path(sub).glob("*.tmp"):
            if owned_file(sub, tmp.name):
                tmp.unlink()
    write_json_atomic(run.path(MANIFEST), manifest)
    if remove_prepared(run.out, STAGING):
        run.path(STAGING).rmdir()
    return manifest


def _labels(run: PrepRun) -> np.ndarray:
    """Labels of the source in original order: [N] int64 class ids (-1 throughout when it
    has none) or multi-label [N, T] int8 (:func:`~plexgt.data.graph.node_labels`)."""
    n = run.n
    labels = run.src.labels()
    if labels is None:
        labels = np.full(n, -1, dtype=np.int64)
    labels = node_labels(labels, run.src.name)
    if labels.shape[0] != n:
        raise DataError(f"{run.src.name}: {labels.shape[0]} labels disagree with N={n}")
    if labels.ndim == 2:
        return labels
    if labels.size and labels.min() < -1:
        raise DataError(f"{run.src.name}: label {int(labels.min())} is below -1")
    if labels.size and labels.max() >= max(n, MAX_CLASSES_FLOOR):
        raise DataError(f"{run.src.name}: label {int(labels.max())} would make "
                        f"{int(labels.max()) + 1} classes for {n} nodes; class ids must run "
                        "0..C-1")
    return labels


def _check_disjoint(name: str, n: int, splits: dict[str, Any]) -> None:
    """Refuse splits that share a node: a test node also trained on inflates test accuracy."""
    seen = np.full(n, -1, dtype=np.int8)
    for j, k in enumerate(SPLITS):
        idx = np.asarray(splits.get(k, []), dtype=np.int64)
        idx = idx[(idx >= 0) & (idx < n)]  # out-of-range ids are reported where masks are built
        hit = seen[idx] >= 0
        if hit.any():
            node = int(idx[np.flatnonzero(hit)[0]])
            raise DataError(f"{name}: node {node} is in both the '{SPLITS[seen[node]]}' and "
                            f"the '{k}' split; splits must not overlap")
        seen[idx] = j


MAX_CLASSES_FLOOR = 1 << 16
"""Class ids beyond max(N, this) are refused: a stray id (1e9) would otherwise make a
billion-class model whose first allocation fails hours later in training."""


RANDOM_SPLIT = (0.6, 0.2, 0.2)
"""The train/valid/test shares of the split prep draws (from ``--seed``) for a source that
has none of its own: the manifest records it as ``split: {"origin": "random", ...}``."""


def write_nodes(run: PrepRun) -> tuple[dict[str, Any], dict[str, int], int, bool,
                                       dict[str, Any]]:
    """nodes.h5: permutations, then labels, degrees (summed from the tile files) and split
    masks in both orders: of each stored split with ``--split-index all`` (K x 2 x 3 [N]
    bool datasets, N bytes each; every one checked disjoint, with a labelled train node, as
    the one split is). Returns (its record, nodes per split of the default split, C, whether
    the labels are multi-label: then C counts tasks, where the split came from: with several,
    ``num_splits`` and each one's ``sizes``)."""
    n = run.n
    labels = _labels(run)
    multilabel = labels.ndim == 2
    c = labels.shape[1] if multilabel else int(labels.max()) + 1 if labels.size else 0
    stored = run.src.stored_splits()  # every split, with --split-index all; else []
    splits = stored[0] if stored else run.src.splits()
    origin = run.src.split_origin()
    if not splits:  # the documented fallback: a seeded random 60/20/20 split
        splits = random_split(n, run.opts.seed, RANDOM_SPLIT[:2])
        origin = {"origin": "random", "fractions": list(RANDOM_SPLIT), "seed": run.opts.seed}
    every = stored or [splits]
    for k, sp in enumerate(every):
        name = f"{run.src.name} (stored split {k})" if stored else run.src.name
        check_train_labels(name, labels, sp.get("train"))
        _check_disjoint(name, n, sp)
    sizes = [{k: int(np.asarray(sp.get(k, [])).size) for k in SPLITS} for sp in every]
    if stored:  # the manifest says what each stored split holds
        origin = {**origin, "num_splits": len(stored), "sizes": sizes}
    degs = {}
    for kind in MATRICES:
        parts = []
        for ti in range(run.t):
            with h5py.File(run.path(tile_file(kind, ti)), "r") as f:
                parts.append(f[TILE_DEG][()])
        degs[ROW_ORDER[kind]] = np.concatenate(parts)

    p, q = inverse(run.pinv).astype(np.int64), inverse(run.qinv).astype(np.int64)

    def fill(f: h5py.File) -> None:
        # the sizes the manifest must agree with: a reader checks them on open
        f.attrs["N"], f.attrs["F"], f.attrs["C"] = n, run.f, c
        f.attrs["multilabel"] = multilabel
        dataset(f, perm_ds("P"), p)
        dataset(f, perm_ds("Q"), q)
        dataset(f, P2Q_DS, run.qinv[p].astype(np.int32 if n < 2**31 else np.int64))
        for order, perm in (("P", p), ("Q", q)):
            dataset(f, labels_ds(order), labels[perm])
            dataset(f, deg_ds(order), degs[order])
            for i, sp in enumerate(every):  # split 0 under the plain names (mask_ds)
                for k in SPLITS:
                    m = np.zeros(n, dtype=bool)
                    idx = np.asarray(sp.get(k, []), dtype=np.int64)
                    if idx.size and (idx.min() < 0 or idx.max() >= n):
                        raise DataError(f"{run.src.name}: split '{k}' holds an id outside "
                                        f"[0, {n})")
                    m[idx] = True
                    dataset(f, mask_ds(k, order, i or None), m[perm])

    rec = write_h5_atomic(run.path(NODES), fill)
    return rec, sizes[0], c, multilabel, origin


def manifest_of(run: PrepRun, nodes_rec: dict[str, Any], split_sizes: dict[str, int], c: int,
                multilabel: bool, split_origin: dict[str, Any], t_start: float
                ) -> dict[str, Any]:
    """The manifest: sizes, dtypes, options, and every file's record (the units' from their
    completion records)."""
    o = run.opts
    files = {NODES: nodes_rec}
    tile_nnz: dict[str, list[list[int]]] = {k: [] for k in MATRICES}
    k = count_grid(run.n)
    cells = {m: np.zeros(k * k, dtype=np.int64) for m in MATRICES}
    counted = True
    feature_nnz = 0
    for kind, i in run.units:
        rec = read_json(run.done_path(kind, i))
        files[rec["file"]] = {"bytes": rec["bytes"], "sha256": rec["sha256"]}
        if kind != FEATURE_UNIT:
            tile_nnz[kind].append(rec["nnz"])
            if "block_nnz" in rec:  # (a unit an older version finished has none)
                cells[kind] += np.asarray(rec["block_nnz"], dtype=np.int64)
            else:
                counted = False
        else:
            feature_nnz += int(rec.get("nnz", 0))
    e1 = int(np.sum(tile_nnz[A1]))
    e2 = int(np.sum(tile_nnz[A2]))
    if e1 != e2:
        raise RuntimeError(f"internal error: A1 holds {e1} nonzeros, A2 {e2}")
    nnz = np.asarray(tile_nnz[A1], dtype=np.float64)
    imbalance = float(nnz.max() / nnz.mean()) if nnz.mean() > 0 else 1.0
    rnd = run.permutation == "random"
    names = None if multilabel else run.src.label_names()
    if names is not None and len(names) != c:
        raise RuntimeError(f"internal error: {len(names)} class names for C={c}")
    sources = [{"path": str(p), "bytes": p.stat().st_size, "sha256": sha256_file(p)}
               for p in run.src.files]
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "plexgt_version": __version__, "name": run.src.name,
        "N": run.n, "E": e1, "F": run.f, "C": c, "FE": run.fe, "multilabel": multilabel,
        "feature_layout": "csr" if run.sparse else "dense", "feature_nnz": feature_nnz,
        "feature_density": run.feature_density,
        "feature_normalization": o.normalize_features if run.f else "none",
        "dtypes": {"features": str(run.fdtype), "indices": str(run.idx_dtype),
                   "anchors": "int64", "labels": "int8" if multilabel else "int64",
                   "deg": "int64", "perm": "int64",
                   "mask": "bool", **({"edge_features": "float32"} if run.fe else {})},
        "T": run.t, "tile_size": run.size, "feature_block_rows": run.fb,
        "tile_format": TILE_FORMAT, "anchor_stride": ANCHOR,
        "num_feature_blocks": run.nfb,
        "self_loops": o.self_loops, "symmetrized": bool(run.symmetrize),
        "reciprocity": {**run.reciprocity, "asked": run.params["symmetrized"],
                        "auto_below": AUTO_SYMMETRIZE_BELOW},
        "permutation": {"method": run.permutation, "asked": o.permutation, "seed": o.seed,
                        "perm_p_rng": [o.seed, 1 if rnd else 3],
                        "perm_q_rng": [o.seed, 2 if rnd else 4],
                        **({"balance": run.balance_info} if run.balance_blocks else {})},
        "splits": split_sizes, "split": split_origin,
        **({"label_names": names} if names is not None else {}),
        "tile_nnz": tile_nnz, "tile_imbalance": imbalance,
        # nonzeros per cell of a K x K grid of node blocks, each matrix: how evenly any
        # partition spreads them (the planner prices the busiest rank by it)
        **({"block_nnz": {m: c.reshape(k, k).tolist() for m, c in cells.items()}}
           if counted else {}),
        "source": o.source_desc, "source_files": sources, "files": files,
        "prep_seconds": round(time.monotonic() - t_start, 3), "prep_ranks": run.comm.size,
        "params": run.params,
    }
