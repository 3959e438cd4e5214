"""``plexgt profile``: measure collectives and kernels, save a reusable system profile (JSON).

Run it under the launcher and rank count of the jobs it will plan for, e.g.
``mpiexec -n 4 plexgt profile --out system.json``; ``plexgt plan --profile system.json`` reads it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from plexgt.distributed.bootstrap import init_distributed, shutdown
from plexgt.errors import UsageError
from plexgt.plan.measure import run_profile

HELP = "Measure collectives and kernels (under mpiexec -n P); save a system profile JSON."
STARTS_MPI = True
"""It runs in MPI's world: the CLI starts MPI (mpi4py) before importing this module, whose
imports load torch (Cray MPICH fails to start after torch: plexgt.cli.main)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="where to write the profile JSON")
    p.add_argument("--quick", action="store_true",
                   help="fewer sizes and repeats (seconds, for smoke tests)")
    p.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo"])
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per rank (default: torch's choice / OMP_NUM_THREADS)")


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    if out.exists() and out.is_dir():
        raise UsageError(f"--out {out} is a directory; give a file name")
    if not out.parent.exists():
        raise UsageError(f"--out {out}: directory {out.parent} does not exist")
    if args.threads is not None:
        if args.threads < 1:
            raise UsageError("--threads must be positive")
        torch.set_num_threads(args.threads)
    ctx = init_distributed(args.backend)
    try:
        prof = run_profile(ctx, quick=args.quick)
    finally:
        shutdown(ctx)
    if prof is not None:
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(prof, indent=1) + "\n")
        tmp.replace(out)
        hw, sw = prof["hardware"], prof["software"]
        print(f"profile of {prof['world_size']} ranks on {hw['cpu']}"
              f"{' + ' + hw['gpu'] if hw.get('gpu') else ''} ({hw['cores']} cores), "
              f"torch {sw['torch']}, {sw.get('mpi')}, {sw['backend']}: {out} "
              f"({prof['seconds']:.1f} s)")
        for k, v in prof["plexus"].items():
            print(f"  plexus.{k} = {v:.3e}")
    return 0
