"""``plexgt verify DIR``: check every checksum and invariant of a prepared directory.

Under a launcher (``mpiexec -n P plexgt verify DIR``) rank 0 alone checks the directory and
prints the one summary; the other ranks have nothing to do and end at once. No rank starts
MPI: a failure on rank 0 is its own exit status, not a job to abort (the launch's abort hook
would start MPI to abort ranks that have already ended, and wait in MPI's start-up forever).
"""

from __future__ import annotations

import argparse
import sys
import threading

from plexgt.data.verify import verify
from plexgt.distributed.launch import launch_rank
from plexgt.errors import DataError, PlexgtError, mark_agreed

HELP = "Check a prepared directory: checksums, tile invariants, permutations, A1/A2 partner."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="prepared directory (output of plexgt prep)")
    p.add_argument("--no-checksums", action="store_true", help="skip the sha256 of each file")
    p.add_argument("--all", action="store_true", help="list every problem, not only the first")


def run(args: argparse.Namespace) -> int:
    rank, size = launch_rank()
    if size > 1:  # a crash too ends this rank alone, with its traceback and status 1
        sys.excepthook, threading.excepthook = sys.__excepthook__, threading.__excepthook__
    if rank != 0:
        return 0
    try:
        return _verify(args)
    except PlexgtError as e:
        # no other rank waits for this one: the CLI prints it and returns 2, without the MPI
        # Abort that ends a job whose other ranks would wait for it in a collective
        mark_agreed(e, rank)
        raise


def _verify(args: argparse.Namespace) -> int:
    res = verify(args.dir, checksums=not args.no_checksums)
    if not res["ok"]:
        probs = res["problems"]
        if args.all:
            for msg in probs[1:]:
                print(f"plexgt verify: also: {msg}", file=sys.stderr)
        more = f" (and {len(probs) - 1} more problems)" if len(probs) > 1 else ""
        raise DataError(f"{probs[0]}{more}")
    print(f"verify: {args.dir}: ok ({res['files']} files checksummed, {res['seconds']:.1f}s)",
          file=sys.stderr)
    return 0
