"""The Gx x Gy x Gz virtual process grid: pure rank arithmetic, and its process groups.

By default ranks are laid out with Y varying fastest, then X, then Z::

    rank = y + gy * (x + gx * z)

so that the ranks of one Y group are consecutive. Job launchers (srun, mpiexec) place consecutive
ranks on the same node, which keeps the innermost axis inside a node (NVLink, xGMI). Which axis
is innermost is a free choice (``Grid3D.order``, ``parallel.axis_order``): the planner searches
it, since the axis whose groups stay inside a node is the one whose collectives are cheap.

Everything here except :func:`build_groups` is a pure function of integers and is tested without
MPI. Every rank calls :func:`build_groups` in step; it names the groups alike on every rank
whatever groups the job made before (see there).
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from plexgt.distributed.collectives import partition_group
from plexgt.errors import GridError

AXES: tuple[str, str, str] = ("x", "y", "z")
PLANES: tuple[str, str, str] = ("xy", "yz", "zx")
DEFAULT_ORDER = "yxz"
"""Rank order innermost axis first: Y consecutive, then X, then Z (Plexus's)."""
ORDERS: tuple[str, ...] = ("yxz", "xyz", "yzx", "zyx", "xzy", "zxy")
"""Every axis order, the default first."""



@dataclass(frozen=True)
class Grid3D:
    """A virtual 3D grid of ``gx * gy * gz`` ranks."""

    gx: int
    """Ranks along X."""
    gy: int
    """Ranks along Y (fastest-varying, kept inside a node)."""
    gz: int
    """Ranks along Z."""
    order: str = DEFAULT_ORDER
    """The axes from innermost (consecutive ranks, one node's GPUs) to outermost, e.g. 'yxz':
    where each axis's groups sit on the machine, so what their collectives cost; the
    computation is the same under every order."""

    def __post_init__(self) -> None:
        for name in AXES:
            v = getattr(self, "g" + name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GridError(f"grid factor g{name}={v!r} must be a positive integer")
        if not isinstance(self.order, str) or sorted(self.order) != list(AXES):
            raise GridError(f"axis order {self.order!r} must name x, y and z once each, "
                            "innermost first (e.g. yxz)")

    @property
    def size(self) -> int:
        """Number of ranks in the grid."""
        return self.gx * self.gy * self.gz

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.gx, self.gy, self.gz)

    def dim(self, axis: str) -> int:
        """Ranks along ``axis`` ('x', 'y' or 'z')."""
        return getattr(self, "g" + _check_axis(axis))

    def __str__(self) -> str:
        base = f"{self.gx}x{self.gy}x{self.gz}"
        return base if self.order == DEFAULT_ORDER else f"{base}:{self.order}"

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours along ``axis``: the product of the extents of the
        axes inside it in :attr:`order` (1 for the innermost)."""
        out = 1
        for a in self.order:
            if a == _check_axis(axis):
                return out
            out *= self.dim(a)
        return out

    def with_order(self, order: str) -> Grid3D:
        """The same extents with another rank order."""
        return Grid3D(self.gx, self.gy, self.gz, order)

    # -- rank <-> coordinates -------------------------------------------------------------
    def coords(self, rank: int) -> tuple[int, int, int]:
        """(x, y, z) of ``rank``."""
        if not 0 <= rank < self.size:
            raise GridError(f"rank {rank} is outside grid {self} of {self.size} ranks")
        c = {}
        for a in self.order:
            c[a], rank = rank % self.dim(a), rank // self.dim(a)
        return (c["x"], c["y"], c["z"])

    def rank(self, x: int, y: int, z: int) -> int:
        """Rank at coordinates (x, y, z)."""
        if not (0 <= x < self.gx and 0 <= y < self.gy and 0 <= z < self.gz):
            raise GridError(f"coordinates ({x}, {y}, {z}) are outside grid {self}")
        c = {"x": x, "y": y, "z": z}
        out = 0
        for a in reversed(self.order):
            out = out * self.dim(a) + c[a]
        return out

    def coord(self, rank: int, axis: str) -> int:
        """Coordinate of ``rank`` along ``axis``."""
        return self.coords(rank)[AXES.index(_check_axis(axis))]

    # -- group membership -----------------------------------------------------------------
    def axis_members(self, rank: int, axis: str) -> list[int]:
        """Ranks sharing every coordinate with ``rank`` except the one along ``axis``.

        Ordered by the coordinate along ``axis``, so a member's index in the list is its
        coordinate: the order collectives gather and scatter in. The rank numbering is monotone
        in every coordinate, so this is also ascending global rank, the group-rank order of
        torch.distributed.
        """
        c = list(self.coords(rank))
        i = AXES.index(_check_axis(axis))
        out = []
        for v in range(self.dim(axis)):
            c[i] = v
            out.append(self.rank(*c))
        return out

    def plane_members(self, rank: int, plane: str) -> list[int]:
        """Ranks sharing ``rank``'s coordinate on the axis not in ``plane`` ('xy', 'yz', 'zx').

        In ascending global rank, which is the group-rank order torch.distributed gives them.
        """
        a, b = _check_plane(plane)
        c = list(self.coords(rank))
        ia, ib = AXES.index(a), AXES.index(b)
        out = []
        for va in range(self.dim(a)):
            for vb in range(self.dim(b)):
                c[ia], c[ib] = va, vb
                out.append(self.rank(*c))
        return sorted(out)

    def all_axis_groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``, in a deterministic order identical on all ranks."""
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.size):
            seen.setdefault(tuple(self.axis_members(r, axis)), None)
        return [list(g) for g in seen]

    def all_plane_groups(self, plane: str) -> list[list[int]]:
        """Every group in ``plane``, in a deterministic order identical on all ranks."""
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.size):
            seen.setdefault(tuple(self.plane_members(r, plane)), None)
        return [list(g) for g in seen]


def _check_axis(axis: str) -> str:
    if axis not in AXES:
        raise GridError(f"unknown grid axis {axis!r}; expected one of x, y, z")
    return axis


def _check_plane(plane: str) -> tuple[str, str]:
    if plane not in PLANES:
        raise GridError(f"unknown grid plane {plane!r}; expected one of xy, yz, zx")
    return plane[0], plane[1]


def parse_grid(text: str) -> Grid3D:
    """Parse ``'GxxGyxGz'`` (e.g. ``'2x2x1'``), optionally with an axis order innermost first
    (``'4x2x2:xyz'``; default yxz)."""
    shape, sep, order = text.lower().partition(":")
    parts = shape.split("x")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise GridError(f"grid {text!r} is not of the form GxxGyxGz, e.g. 2x2x1")
    return Grid3D(*(int(p) for p in parts), order if sep else DEFAULT_ORDER)


def check_world_size(grid: Grid3D, world_size: int) -> None:
    """Raise naming every factor when ``grid`` does not cover exactly ``world_size`` ranks."""
    if grid.size != world_size:
        raise GridError(
            f"grid {grid} has gx={grid.gx} * gy={grid.gy} * gz={grid.gz} = {grid.size} ranks, "
            f"but the world size is {world_size}"
        )


def factorizations(world_size: int) -> list[Grid3D]:
    """Every ordered Gx x Gy x Gz with product ``world_size``."""
    out = []
    for gx in range(1, world_size + 1):
        if world_size % gx:
            continue
        rest = world_size // gx
        for gy in range(1, rest + 1):
            if rest % gy == 0:
                out.append(Grid3D(gx, gy, rest // gy))
    return out


def layer_roles(layer: int) -> tuple[str, str, str]:
    """The axis roles (a, b, c) of 3D tensor parallelism at ``layer``.

    Layer 0 uses (x, y, z), layer 1 (z, x, y), layer 2 (y, z, x), then it repeats. The output of
    one layer is laid out [rows over c, dims over a], which is exactly the next layer's input
    layout [rows over a', dims over b'], so no redistribution happens between layers.
    """
    k = layer % 3
    return AXES[(0 - k) % 3], AXES[(1 - k) % 3], AXES[(2 - k) % 3]


def block_bounds(n: int, parts: int, index: int) -> tuple[int, int]:
    """[lo, hi) of block ``index`` when ``n`` items are cut into ``parts`` blocks of ceil(n/parts).

    Trailing blocks may be short or empty: their owners hold padding, which layers mask out.
    Equal block sizes keep every collective's message the same size on all ranks.
    """
    if parts < 1 or not 0 <= index < parts:
        raise GridError(f"block {index} of {parts} does not exist")
    size = math.ceil(n / parts) if n > 0 else 0
    lo = min(n, index * size)
    hi = min(n, lo + size)
    return lo, hi


def padded(n: int, parts: int) -> int:
    """``n`` rounded up to a multiple of ``parts`` (the padded extent of :func:`block_bounds`)."""
    return math.ceil(n / parts) * parts


@dataclass
class GridGroups:
    """torch.distributed process groups of one rank's X, Y, Z axes and XY, YZ, ZX planes.

    Built by :func:`build_groups`; passed explicitly to every layer that communicates.
    """

    grid: Grid3D
    rank: int
    axis: dict[str, Any] = field(default_factory=dict)
    """Group of this rank along each axis, keyed 'x', 'y', 'z'."""
    plane: dict[str, Any] = field(default_factory=dict)
    """Group of this rank in each plane, keyed 'xy', 'yz', 'zx'."""
    world: Any = None
    """The whole-world group (None means torch's default group)."""

    @property
    def coords(self) -> tuple[int, int, int]:
        return self.grid.coords(self.rank)


def build_groups(grid: Grid3D, rank: int, world_size: int,
                 timeout: datetime.timedelta | None = None) -> GridGroups:
    """Create this rank's axis and plane groups (every rank calls it, in step).

    Each axis's groups, and each plane's, partition the world's ranks;
    :func:`~plexgt.distributed.collectives.partition_group` creates them, axes x, y, z then
    planes xy, yz, zx, each partition's groups in :meth:`Grid3D.all_axis_groups` /
    :meth:`Grid3D.all_plane_groups` order, the same on every rank, so that a group's ranks
    agree on it whatever groups the job made before. Each rank used to create only its own
    six groups members-only (``use_local_synchronization``); on gloo torch names such a group
    by a hash of its ranks and of how many groups the calling rank holds, so after a group
    not every rank joined (a test's world-minus-one group) the members disagreed on the name
    and waited in gloo's rendezvous until the store timed out.

    On gloo every rank therefore creates every group of the grid, P/Gx + P/Gy + P/Gz +
    Gx + Gy + Gz calls (352 at P = 1024 as 8x8x16), globally synchronised: a non-member's
    call returns at once (torch adds a world-wide store barrier per group only under
    ``TORCH_DIST_INIT_BARRIER=1``). Bound to a device (NCCL) each ``new_group`` is a split of
    the world's communicator that every rank joins, so creating every group would be 352
    world-wide splits; there each rank still creates only its own six, members-only: six
    splits in all, each rank splitting off its own group.

    ``timeout`` bounds every collective of the new groups (the run's
    ``parallel.timeout_s``): torch gives a sub-group its own default of 30 minutes otherwise,
    so a stopped peer would hang the job long after the world group's timeout."""
    check_world_size(grid, world_size)
    gg = GridGroups(grid=grid, rank=rank, world=dist.group.WORLD)
    kw: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    for axis in AXES:
        gg.axis[axis] = partition_group(grid.all_axis_groups(axis), rank, **kw)
    for plane in PLANES:
        gg.plane[plane] = partition_group(grid.all_plane_groups(plane), rank, **kw)
    return gg
