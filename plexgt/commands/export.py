"""``plexgt export --format pyg``: a predictions file (``plexgt predict``'s Parquet, HDF5 or
``.npy``) as a PyG ``Data``-compatible file: ``torch.save`` of a dict of tensors, loadable
with ``torch.load(weights_only=True)`` and ``Data.from_dict`` (one process, no MPI).

Row i is the file's row i, the raw input's node ``node_id[i]`` (predict writes them in the
original order); keys: ``pred`` [N] (or ``prob`` [N, T] multi-label), ``logits`` [N, C],
``embedding`` [N, D] when predict wrote one, ``node_id`` [N], ``train_mask`` / ``val_mask``
/ ``test_mask`` [N] and ``num_nodes``. Written to a temporary name beside the output and
renamed: an interrupted export leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import torch

from plexgt.data.predictions import PredictionsFile
from plexgt.errors import UsageError

HELP = "Write a predictions file as a PyG Data-compatible file (torch.save of tensors)."
FORMATS = ("pyg",)
MASKS = (("train_mask", 1), ("val_mask", 2), ("test_mask", 3))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", required=True, choices=FORMATS, help="the file to write")
    p.add_argument("--predictions", required=True, type=Path,
                   help="a predictions file written by plexgt predict")
    p.add_argument("--out", required=True, type=Path, help="the .pt file to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")


def pyg_dict(pred: PredictionsFile) -> dict[str, torch.Tensor | int]:
    """The predictions' columns as the Data-compatible dict (module docstring)."""
    parts = [c for _, c in pred.chunks(pred.columns, rows=max(1, pred.n))]
    cols = {k: np.concatenate([c[k] for c in parts]) for k in parts[0]} if parts else {}
    out: dict[str, torch.Tensor | int] = {}
    for name in ("pred", "prob", "logits", "embedding", "node_id"):
        if name in cols:
            out[name] = torch.from_numpy(np.ascontiguousarray(cols[name]))
    codes = np.asarray(cols.get("split", np.zeros(0, np.int8)))
    for key, code in MASKS:
        out[key] = torch.from_numpy(codes == code)
    out["num_nodes"] = int(pred.n)
    return out


def write_atomic(obj: object, out: Path, overwrite: bool) -> None:
    """torch.save ``obj`` to a temporary name in ``out``'s directory, then rename it to
    ``out``; an existing ``out`` is refused without ``overwrite``."""
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


def run(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.overwrite:  # refused before the input is read
        raise UsageError(f"{args.out}: exists; pass --overwrite to replace it")
    pred = PredictionsFile(args.predictions)
    write_atomic(pyg_dict(pred), args.out, args.overwrite)
    print(f"plexgt export: {pred.n} nodes of {args.predictions} -> {args.out} (pyg)")
    return 0
