"""``plexgt export --format NAME``: a predictions file (``plexgt predict``'s Parquet, HDF5 or
``.npy``) in another tool's format, for the formats whose module writes one (their
``FormatSpec.export``; e.g. a PyG Data-compatible file). One process, no MPI; each format
writes to a temporary name and renames it, so an interrupted export leaves nothing behind.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from plexgt.data.formats.registry import default_registry
from plexgt.data.formats.spec import FormatRegistry

HELP = "Write a predictions file in another tool's format (e.g. PyG's)."


def writers(formats: FormatRegistry | None = None) -> list[str]:
    """The formats export can write."""
    formats = formats or default_registry()
    return [s.name for s in formats if s.export is not None]


def add_arguments(p: argparse.ArgumentParser) -> None:
    formats = default_registry()
    p.add_argument("--format", required=True, choices=writers(formats),
                   help="the file to write: " + "; ".join(
                       f"{s.name}: {s.description}" for s in formats if s.export is not None))
    p.add_argument("--predictions", required=True, type=Path,
                   help="a predictions file written by plexgt predict")
    p.add_argument("--out", required=True, type=Path, help="the file to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")


def run(args: argparse.Namespace) -> int:
    spec = default_registry().get(args.format)
    assert spec.export is not None  # argparse's choices are writers()
    print(f"plexgt export: {spec.export(args.predictions, args.out, args.overwrite)}")
    return 0
