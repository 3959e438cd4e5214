"""Test-only helpers for the distributed layers: reference arithmetic and group builders that
the package itself does not need."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from plexgt.distributed.grid import Grid3D
from plexgt.parallel.redistribute import Block, Layout


def _overlap_size(a: Block, b: Block) -> int:
    rows = max(0, min(a.rows[1], b.rows[1]) - max(a.rows[0], b.rows[0]))
    cols = max(0, min(a.cols[1], b.cols[1]) - max(a.cols[0], b.cols[0]))
    return rows * cols


def redistribute_bytes(src: Layout, dst: Layout, p: int, me: int, esize: int
                       ) -> tuple[int, int]:
    """(sent, received) bytes of :func:`~plexgt.parallel.redistribute.redistribute` on rank
    ``me``, own piece excluded: the O(p) intersection of every pair of blocks, against which
    the package's O(1) per-rank formula is checked."""
    if p == 1:
        return 0, 0
    srcs = [src(r) for r in range(p)]
    dsts = [dst(r) for r in range(p)]
    sent = sum(_overlap_size(srcs[me], d) for j, d in enumerate(dsts) if j != me)
    recv = sum(_overlap_size(dsts[me], s) for j, s in enumerate(srcs) if j != me)
    return sent * esize, recv * esize


def build_axis_groups(grid: Grid3D, rank: int) -> dict[str, Any]:
    """Axis groups of ``grid`` over global ranks 0..grid.size-1 (collective over the world:
    every rank calls it in step, members or not; non-members get no entry)."""
    out = {}
    for axis in ("x", "y", "z"):
        for members in grid.all_axis_groups(axis):
            g = dist.new_group(members)
            if rank in members:
                out[axis] = g
    return out
