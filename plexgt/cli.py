"""The ``plexgt`` command: one argparse tree whose subcommands live in :mod:`plexgt.commands`.

Each subcommand module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``, and imports what it needs at its top. Only the module of the command
being run is imported: the others appear in ``plexgt --help`` by their ``HELP``, read from
their source without executing it, so ``plexgt prep`` on 64 ranks does not pay for torch and
``plexgt info`` not for h5py, and a command's one-line help is written once, in its module.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys
from typing import Any

from plexgt import __version__
from plexgt.distributed.launch import (
    end_job,
    install_abort_on_error,
    launch_rank,
    mpi_world,
    release_process_group,
)
from plexgt.errors import PeerFailed, PlexgtError

#: the subcommands (modules under plexgt.commands) in the order of the workflow: shard a
#: graph and check it, measure the machine and plan for it, train, predict and evaluate from
#: its checkpoints, export the predictions (for PyG), read the run; info last, a check of the
#: launch and the process grid
COMMANDS: tuple[str, ...] = ("prep", "verify", "profile", "plan", "train", "predict",
                             "evaluate", "export", "report", "info")

#: ``plexgt --help``'s epilog: the README's quick start, the same five commands
QUICK_START = """\
quick start (README.md; docs/ has the rest):
  plexgt prep --format sbm --nodes 10000 --edges 200000 --out out/graph
  plexgt plan --model gcn --data out/graph --world-size 2
  mpiexec -n 2 plexgt train --data out/graph --model gcn --grid auto --epochs 20 \\
      --metrics out/metrics.jsonl --checkpoint-dir out/ckpt
  plexgt report out/metrics.jsonl --out out/report.png
  mpiexec -n 2 plexgt predict --checkpoint out/ckpt --data out/graph --out out/pred.parquet"""


def _constants(name: str) -> dict[str, Any]:
    """The literal module-level constants of command ``name``'s module, read from its source
    without importing it (importing would import what the module imports: torch, h5py)."""
    module = f"plexgt.commands.{name}"
    spec = importlib.util.find_spec(module)
    source = spec.loader.get_source(module) if spec and spec.loader else None
    out: dict[str, Any] = {}
    for node in ast.parse(source or "").body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id.isupper():
                    try:
                        out[t.id] = ast.literal_eval(node.value)
                    except (ValueError, TypeError, SyntaxError):  # not a literal
                        pass
    return out


def command_help(name: str) -> str:
    """The ``HELP`` of command ``name``'s module, read from its source."""
    try:
        return _constants(name)["HELP"]
    except KeyError:
        raise LookupError(f"plexgt.commands.{name} defines no HELP string") from None


def starts_mpi(name: str, argv: list[str]) -> bool:
    """Whether command ``name`` run with ``argv`` starts MPI: its module says so
    (``STARTS_MPI = True``, read from source), and neither a help flag nor one of its
    ``NO_MPI_FLAGS`` (``info --dry-run``: one process without MPI) is given."""
    if "-h" in argv or "--help" in argv:
        return False
    consts = _constants(name)
    return bool(consts.get("STARTS_MPI")) and not set(consts.get("NO_MPI_FLAGS", ())) & set(argv)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argparse tree; ``command``'s arguments in full (every command's when None).

    With ``command`` '' (no command to run: the listing is what argparse prints) every
    command's help is read from its module's source; with a command to run, only that one's
    is needed (from the module, imported anyway), which spares each start ~20 ms of parsing.
    """
    parser = argparse.ArgumentParser(
        prog="plexgt",
        description="Exact full-graph GNN / graph transformer training.",
        epilog=QUICK_START,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"plexgt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        full = command is None or name == command
        if full:
            help_text = _module(name).HELP
        elif command == "":
            help_text = command_help(name)
        else:
            help_text = None  # never shown: argparse lists the commands only when none is named
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=name)
        if full:
            _module(name).add_arguments(p)
    return parser


def _module(name: str):  # noqa: ANN202 - a module object
    return importlib.import_module(f"plexgt.commands.{name.replace('-', '_')}")


def _command_in(argv: list[str]) -> str:
    """The subcommand named on the command line, or '' (help, version, a typo): also when a
    help flag comes before it (``plexgt --help train`` lists every command)."""
    for a in argv:
        if a in ("-h", "--help"):
            return ""
        if not a.startswith("-"):
            return a
    return ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    rank, size = launch_rank()
    name = _command_in(argv)
    if name in COMMANDS and starts_mpi(name, argv):
        # MPI starts before the command's module imports torch: Cray MPICH's start-up fails
        # ("MPIDI_CRAY_ofi_nic_assign_policy ... OFI invalid value for environment variable")
        # when torch was imported before mpi4py.MPI (OLCF, PyTorch on Frontier, troubleshooting)
        mpi_world()
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
