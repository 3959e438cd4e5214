"""The ``plexgt`` command: one argparse tree whose subcommands live in :mod:`plexgt.commands`.

Each subcommand module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported only when their command runs, so ``plexgt info``
does not pay for h5py or scipy.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand name -> module under plexgt.commands (and its one-line help)
COMMANDS: dict[str, str] = {
    "info": "Print the process grid: each rank's coordinates and group members.",
    "prep": "Shard a dataset into adjacency tiles, features and node arrays (out of core, MPI).",
    "verify": "Check a prepared directory: checksums, tile invariants, permutations.",
    "train": "Train gcn, gt or gps full-graph on a prepared directory (MPI job).",
    "profile": "Measure collectives and kernels (under mpiexec -n P); save a system profile.",
    "plan": "Predict time and memory of each strategy and scale; choose one (AGP / Plexus).",
}


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    from plexgt import __version__

    parser = argparse.ArgumentParser(
        prog="plexgt", description="Exact full-graph GNN / graph transformer training."
    )
    parser.add_argument("--version", action="version", version=f"plexgt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=name)
        _module(name).add_arguments(p)
    return parser


def _module(name: str):  # noqa: ANN202 - a module object
    return importlib.import_module(f"plexgt.commands.{name.replace('-', '_')}")


def main(argv: list[str] | None = None) -> int:
    from plexgt.config import ConfigError
    from plexgt.data.graph import DataError
    from plexgt.dist.grid import GridError

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = [e for e in extra if e.startswith("--") and "=" in e]
    if len(args.overrides) != len(extra):
        parser.error(f"unrecognized arguments: {' '.join(set(extra) - set(args.overrides))}")
    try:
        return int(_module(args._module).run(args) or 0)
    except (UsageError, GridError, DataError, ConfigError) as e:
        print(f"plexgt {args.command}: error: {e}", file=sys.stderr)
        return 2
