"""``plexgt info``: the process grid as built, or as it would be built (``--dry-run``)."""

from __future__ import annotations

import argparse
import socket

import torch.distributed as dist

from plexgt.distributed.bootstrap import init_distributed, shutdown
from plexgt.distributed.grid import AXES, PLANES, Grid3D, build_groups, check_world_size, parse_grid
from plexgt.errors import UsageError

HELP = "Print the process grid: each rank's coordinates and group members."
STARTS_MPI = True
"""It runs in MPI's world: the CLI starts MPI (mpi4py) before importing this module, whose
imports load torch (Cray MPICH fails to start after torch: plexgt.cli.main) ..."""
NO_MPI_FLAGS = ("--dry-run",)
"""... except with --dry-run: one process, no MPI."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grid", required=True, help="GxxGyxGz, e.g. 2x2x1")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="plan in one process without MPI (needs --world-size)",
    )
    p.add_argument("--world-size", type=int, help="number of ranks for --dry-run")
    p.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo"])


def describe_rank(grid: Grid3D, rank: int, members: dict[str, list[int]] | None = None) -> str:
    """One line: the rank, its (x, y, z) and the members of each axis and plane group."""
    x, y, z = grid.coords(rank)
    if members is None:
        members = {a: grid.axis_members(rank, a) for a in AXES}
        members.update({p: grid.plane_members(rank, p) for p in PLANES})
    groups = " ".join(f"{k.upper()}={members[k]}" for k in (*AXES, *PLANES))
    return f"rank {rank:>4} (x={x}, y={y}, z={z})  {groups}"


def plan_lines(grid: Grid3D) -> list[str]:
    return [f"grid {grid}: {grid.size} ranks, Y fastest-varying"] + [
        describe_rank(grid, r) for r in range(grid.size)
    ]


def run(args: argparse.Namespace) -> int:
    grid = parse_grid(args.grid)
    if args.dry_run:
        if args.world_size is None:
            raise UsageError("--dry-run needs --world-size")
        check_world_size(grid, args.world_size)
        print("\n".join(plan_lines(grid)))
        return 0



    ctx = init_distributed(args.backend)
    check_world_size(grid, ctx.world_size)
    gg = build_groups(grid, ctx.rank, ctx.world_size, ctx.timeout)
    actual = {k: dist.get_process_group_ranks(g) for k, g in {**gg.axis, **gg.plane}.items()}
    line = (
        f"{describe_rank(grid, ctx.rank, actual)}  host={socket.gethostname()} "
        f"local_rank={ctx.local_rank} device={ctx.device} backend={ctx.backend}"
    )
    lines = [None] * ctx.world_size if ctx.rank == 0 else None
    dist.gather_object(line, lines, dst=0)
    if ctx.rank == 0:
        print(f"grid {grid}: {grid.size} ranks, Y fastest-varying, launcher={ctx.launcher}")
        print("\n".join(lines), flush=True)
    shutdown(ctx)
    return 0
