"""``plexgt verify DIR``: check every checksum and invariant of a prepared directory."""

from __future__ import annotations

import argparse
import sys

from plexgt.data.verify import verify
from plexgt.errors import DataError

HELP = "Check a prepared directory: checksums, tile invariants, permutations, A1/A2 partner."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="prepared directory (output of plexgt prep)")
    p.add_argument("--no-checksums", action="store_true", help="skip the sha256 of each file")
    p.add_argument("--all", action="store_true", help="list every problem, not only the first")


def run(args: argparse.Namespace) -> int:
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
