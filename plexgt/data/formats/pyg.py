"""PyTorch Geometric's files: a ``Data`` saved with ``torch.save``, a plain dict of tensors
saved likewise, or a PyG / OGB dataset root (``processed/*.pt`` of an ``InMemoryDataset``).

Keys (a ``Data``'s attributes or the dict's): ``edge_index`` [2, E] int (row 0 the source,
as PyG's message passing reads it), ``x`` [N, F] float, ``y`` [N] class ids or [N, T]
multi-label, ``train_mask`` / ``val_mask`` / ``test_mask`` [N] or [N, K] (K stored splits,
one chosen by ``--split-index``, or all kept by ``--split-index all``), ``edge_attr`` [E] or
[E, F_e], ``num_nodes``. A dataset root's file is PyG >= 2.4's ``(data dict, slices, Data
class)`` or the older ``(Data, slices)``, one graph; an OGB root's
``split/<kind>/{train,valid,test}.csv.gz`` give the split where the data holds no masks.

Export (``plexgt export --format pyg``) writes a predictions file of ``plexgt predict``
(Parquet, HDF5 or ``.npy``) as a Data-compatible dict of tensors saved with ``torch.save``,
loadable with ``torch.load(weights_only=True)`` and ``Data.from_dict``: row i is the file's
row i, the raw input's node ``node_id[i]``; keys ``pred`` [N] (or ``prob`` [N, T]
multi-label), ``logits`` [N, C], ``embedding`` [N, D] when predict wrote one, ``node_id``
[N], ``train_mask`` / ``val_mask`` / ``test_mask`` [N] and ``num_nodes``; written to a
temporary name beside the output and renamed, so an interrupted export leaves nothing
half-written.

Loading is ``torch.load(weights_only=True)`` with only PyG's ``Data`` and storage classes
allowed (when PyG is importable; without it only tensors and containers load): a file that
pickles any other class is refused with one line naming it, and nothing in it is executed.
torch (and PyG) are imported when such a file is read, not when ``plexgt prep`` starts:
every other format runs without them.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from plexgt.data.formats.npz_edges import ALL, SPLIT_INDEX, chosen_split, dataset_split, read_masks
from plexgt.data.formats.spec import FormatSpec, Probe
from plexgt.data.graph import GraphData, integer_ids, node_labels
from plexgt.data.predictions import PredictionsFile
from plexgt.data.source import GraphSource, MemorySource
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import DataError, UsageError

SUFFIXES = (".pt", ".pth")
PROCESSED = ("data.pt", "geometric_data_processed.pt")
"""A dataset root's processed file, by the names PyG's and OGB's datasets give it."""
MASKS = {"train": ("train_mask",), "valid": ("val_mask", "valid_mask"),
         "test": ("test_mask",)}
PYG_CLASSES = {
    "torch_geometric.data.data": ("Data", "DataEdgeAttr", "DataTensorAttr"),
    "torch_geometric.data.storage": ("BaseStorage", "NodeStorage", "EdgeStorage",
                                     "GlobalStorage"),
}
"""The only classes a file may pickle beside tensors and containers."""


def _safe_globals() -> list[Any]:
    """PyG's Data and storage classes, or [] when PyG is not importable."""
    out = []
    for module, names in PYG_CLASSES.items():
        try:
            mod = importlib.import_module(module)
        except ImportError:
            return []
        out += [getattr(mod, n) for n in names if hasattr(mod, n)]
    return out


def load_pt(path: Path) -> Any:
    """``torch.load(path, weights_only=True)`` with PyG's classes allowed; a DataError of one
    line for a file that is not one, or that pickles anything else (never unpickled)."""
    import torch  # here, not at the top: prep of every other format runs without torch

    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds; each becomes one line
        text = str(e)
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+) ([\w.]+)", text)
        if found:
            what = f"{found.group(1)}.{found.group(2)}"
            hint = (" (install PyG: pip install torch_geometric)"
                    if what.startswith("torch_geometric") else "")
            raise DataError(f"{path}: pickles {what}, which is not a tensor or PyG's Data; "
                            f"refused, nothing in it was run{hint}") from None
        why = re.search(r"Unpickler error:\s*(\S[^\n]*)", text)
        line = why.group(1) if why else (text.splitlines() or [type(e).__name__])[0]
        raise DataError(f"{path}: not a torch.save file ({line[:200]})") from None


def _as_dict(obj: Any, path: Path) -> dict[str, Any]:
    """The graph's tensors by key, from a Data, a dict, or a dataset's saved tuple."""
    if isinstance(obj, tuple) and len(obj) in (2, 3):
        data, slices = obj[0], obj[1]
        if isinstance(slices, dict) and slices:
            count = len(next(iter(slices.values()))) - 1
            if count != 1:
                raise DataError(f"{path}: a dataset of {count} graphs; prep reads one graph "
                                "(node-level tasks)")
        obj = data
    if hasattr(obj, "to_dict") and not isinstance(obj, dict):
        obj = obj.to_dict()
    if not isinstance(obj, dict):
        raise DataError(f"{path}: holds a {type(obj).__name__}; expected a PyG Data, a dict "
                        "of tensors or a dataset's (data, slices) tuple")
    return obj


def _array(d: dict[str, Any], key: str, path: Path) -> np.ndarray | None:
    v = d.get(key)
    if v is None:
        return None
    if not hasattr(v, "numpy"):
        raise DataError(f"{path}: '{key}' is a {type(v).__name__}, not a tensor")
    if v.is_sparse:
        raise DataError(f"{path}: '{key}' is a sparse tensor; expected a dense one")
    return v.detach().cpu().numpy()


def _ogb_splits(root: Path, n: int) -> dict[str, np.ndarray]:
    """An OGB root's one split (``split/<kind>/*.csv.gz``), or {}."""
    kinds = sorted(p for p in (root / "split").glob("*") if p.is_dir())
    if len(kinds) != 1:
        return {}
    out = {}
    for name in ("train", "valid", "test"):
        f = kinds[0] / f"{name}.csv.gz"
        if f.is_file():
            try:
                with gzip.open(f, "rt") as fh:
                    ids = np.loadtxt(fh, dtype=np.int64, ndmin=1)
            except (OSError, ValueError) as e:
                raise DataError(f"{f}: not a list of node ids ({e})") from None
            if ids.size and (ids.min() < 0 or ids.max() >= n):
                raise DataError(f"{f}: holds a node id outside [0, {n})")
            out[name] = ids
    return out


def processed_file(root: Path) -> Path:
    """A dataset root's processed graph file (module docstring)."""
    proc = root / "processed"
    for name in PROCESSED:
        if (proc / name).is_file():
            return proc / name
    found = [p for p in sorted(proc.glob("*.pt"))
             if p.name not in ("pre_transform.pt", "pre_filter.pt")]
    if len(found) != 1:
        raise DataError(f"{root}: expected one processed/*.pt of a PyG dataset (found "
                        f"{len(found)})")
    return found[0]


def read_pyg(path: str | Path, split_index: int | None = 0) -> GraphData:
    """The graph of a PyG file or dataset root (module docstring), validated; ``split_index``
    None: every stored split kept (``stored_splits``; an OGB root's one split where the data
    holds no masks), the first its ``splits``."""
    path = Path(path)
    root = path if path.is_dir() else None
    file = processed_file(path) if root is not None else path
    d = _as_dict(load_pt(file), file)
    ei = _array(d, "edge_index", file)
    if ei is None:
        raise DataError(f"{file}: has no 'edge_index' (keys: {', '.join(map(str, d))})")
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise DataError(f"{file}: 'edge_index' has shape {ei.shape}; expected [2, E]")
    ei = integer_ids(ei, "'edge_index'", str(file))
    src, dst = (np.ascontiguousarray(ei[i], dtype=np.int64) for i in (0, 1))
    x = _array(d, "x", file)
    if x is not None:
        if x.ndim != 2 or x.dtype.kind != "f":
            raise DataError(f"{file}: 'x' has shape {x.shape} and dtype {x.dtype}; expected "
                            "float [N, F]")
        x = x if x.dtype in (np.float16, np.float32) else x.astype(np.float32)
    y = _array(d, "y", file)
    if y is not None:
        y = node_labels(y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y,
                        f"{file}: 'y'")
    hi = int(max(src.max(initial=-1), dst.max(initial=-1))) + 1
    num = d.get("num_nodes")
    n = (int(num) if num is not None else x.shape[0] if x is not None
         else y.shape[0] if y is not None else hi)
    if hi > n:
        raise DataError(f"{file}: 'edge_index' holds node id {hi - 1}, beyond the {n} nodes")
    for key, arr in (("x", x), ("y", y)):
        if arr is not None and arr.shape[0] != n:
            raise DataError(f"{file}: '{key}' has {arr.shape[0]} rows for {n} nodes")
    found = {}
    for name, keys in MASKS.items():
        key = next((k for k in keys if d.get(k) is not None), None)
        if key is not None:
            found[name] = (key, _array(d, key, file))
    ogb = _ogb_splits(root, n) if not found and root is not None else {}
    if ogb:  # its split/ directory: one split, not silently split 0 for --split-index 3
        splits, stored = chosen_split(root, [ogb], split_index)
    else:
        splits, stored = read_masks(file, found, n, split_index)
    if not splits and split_index != 0:
        raise DataError(f"{file}: holds no split masks; --split-index {split_index} has none "
                        "to choose")
    attr = _array(d, "edge_attr", file)
    if attr is not None:
        if attr.dtype.kind not in "fiub" or attr.shape[0] != src.shape[0]:
            raise DataError(f"{file}: 'edge_attr' has shape {attr.shape} and dtype "
                            f"{attr.dtype}; expected numbers [E] or [E, F_e], E={src.size}")
        attr = (attr[:, None] if attr.ndim == 1 else attr).astype(np.float32)
    g = GraphData(str(path), n, src, dst, x, y, splits, edge_attr=attr, stored_splits=stored)
    g.validate()
    return g


def _recognise(probe: Probe) -> bool:
    return (probe.name.endswith(SUFFIXES) and not probe.is_dir) or any(
        probe.holds(f"processed/{name}") for name in PROCESSED)


def _open(args: argparse.Namespace, comm: HostComm | None) -> GraphSource:
    k = args.split_index
    files = ([processed_file(args.input)] if args.input.is_dir() else [args.input])
    g = read_pyg(args.input, None if k == ALL else k or 0)
    return MemorySource(g, files, split_origin=dataset_split(k, len(g.stored_splits)))


EXPORT_MASKS = (("train_mask", 1), ("val_mask", 2), ("test_mask", 3))
"""The split masks export writes, by the split code predict stores."""


def pyg_dict(pred: PredictionsFile) -> dict[str, Any]:
    """The predictions' columns as the Data-compatible dict (module docstring)."""
    import torch  # here, not at the top: prep of every other format runs without torch

    parts = [c for _, c in pred.chunks(pred.columns, rows=max(1, pred.n))]
    cols = {k: np.concatenate([c[k] for c in parts]) for k in parts[0]} if parts else {}
    out: dict[str, Any] = {}
    for name in ("pred", "prob", "logits", "embedding", "node_id"):
        if name in cols:
            out[name] = torch.from_numpy(np.ascontiguousarray(cols[name]))
    codes = np.asarray(cols.get("split", np.zeros(0, np.int8)))
    for key, code in EXPORT_MASKS:
        out[key] = torch.from_numpy(codes == code)
    out["num_nodes"] = int(pred.n)
    return out


def write_atomic(obj: object, out: Path, overwrite: bool) -> None:
    """torch.save ``obj`` to a temporary name in ``out``'s directory, then rename it to
    ``out``; an existing ``out`` is refused without ``overwrite``."""
    import torch

    if out.exists() and not overwrite:
        raise UsageError(f"{out}: exists; pass --overwrite to replace it")
    if out.is_dir():
        raise UsageError(f"{out}: is a directory")
    if not out.parent.is_dir():
        raise UsageError(f"{out.parent}: no such directory for the output {out.name}")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, out)
    except OSError as e:
        raise UsageError(f"{out}: cannot be written ({e.strerror or e})") from None
    finally:
        tmp.unlink(missing_ok=True)


def export(predictions: Path, out: Path, overwrite: bool) -> str:
    """``plexgt export --format pyg`` (module docstring): what it wrote, one line."""
    if out.exists() and not overwrite:  # refused before the input is read
        raise UsageError(f"{out}: exists; pass --overwrite to replace it")
    pred = PredictionsFile(predictions)
    write_atomic(pyg_dict(pred), out, overwrite)
    return f"{pred.n} nodes of {predictions} -> {out} (PyG Data-compatible dict)"


SPEC = FormatSpec(
    "pyg", "PyTorch Geometric: a Data or a dict of tensors saved with torch.save, or a "
    "PyG/OGB dataset root (processed/*.pt); read with weights_only", _open,
    input="a .pt file, or a dataset root with processed/", recognise=_recognise, order=25,
    looked_for="a .pt file or a directory with processed/data.pt", options=(SPLIT_INDEX,),
    export=export)
