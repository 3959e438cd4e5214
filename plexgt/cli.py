"""The ``plexgt`` command: one argparse tree whose subcommands live in :mod:`plexgt.commands`.

Each subcommand module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``, and imports what it needs at its top. Only the module of the command
being run is imported (the others appear in ``plexgt --help`` by their one-line help alone), so
``plexgt prep`` on 64 ranks does not pay for torch and ``plexgt info`` not for h5py.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from plexgt import __version__
from plexgt.distributed.launch import (
    end_job,
    install_abort_on_error,
    launch_rank,
    release_process_group,
)
from plexgt.errors import PeerFailed, PlexgtError

#: subcommand name -> module under plexgt.commands (and its one-line help)
COMMANDS: dict[str, str] = {
    "info": "Print the process grid: each rank's coordinates and group members.",
    "prep": "Shard a dataset into adjacency tiles, features and node arrays (out of core, MPI).",
    "verify": "Check a prepared directory: checksums, tile invariants, permutations.",
    "train": "Train gcn, gt or gps full-graph on a prepared directory (MPI job).",
    "profile": "Measure collectives and kernels (under mpiexec -n P); save a system profile.",
    "plan": "Predict time and memory of each strategy and scale; choose one (AGP / Plexus).",
    "report": "Summarise a run's metrics JSONL; with --out, plot loss, metrics, time and memory.",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argparse tree; ``command``'s arguments in full (every command's when None)."""
    parser = argparse.ArgumentParser(
        prog="plexgt", description="Exact full-graph GNN / graph transformer training."
    )
    parser.add_argument("--version", action="version", version=f"plexgt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=name)
        if command is None or name == command:
            _module(name).add_arguments(p)
    return parser


def _module(name: str):  # noqa: ANN202 - a module object
    return importlib.import_module(f"plexgt.commands.{name.replace('-', '_')}")


def _command_in(argv: list[str]) -> str:
    """The subcommand named on the command line, or '' (help, version, a typo)."""
    return next((a for a in argv if not a.startswith("-")), "") if argv else ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    rank, size = launch_rank()
    name = _command_in(argv)
    parser = build_parser(name if name in COMMANDS else "")
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = [e for e in extra if e.startswith("--") and "=" in e]
    if len(args.overrides) != len(extra):
        parser.error(f"unrecognized arguments: {' '.join(set(extra) - set(args.overrides))}")
    try:
        return int(_module(args._module).run(args) or 0)
    except PlexgtError as e:
        origin = rank if e.origin is None else e.origin
        if not (isinstance(e, PeerFailed) or origin != rank):  # the failing rank prints it
            who = f"rank {rank}: " if size > 1 else ""
            print(f"plexgt {args.command}: error: {who}{e}", file=sys.stderr, flush=True)
            if size > 1 and not e.agreed:
                end_job(2)  # this rank alone: the others would wait for it in a collective
        release_process_group()  # the ranks agreed on the failure: each ends on its own
        return 2


def entry() -> int:
    """The ``plexgt`` console script: :func:`main`, with an uncaught exception on any rank of
    a multi-rank job ending every rank (a traceback, then MPI Abort), never a hang."""
    rank, size = launch_rank()
    if size > 1:
        install_abort_on_error(rank, None)
    return main()
