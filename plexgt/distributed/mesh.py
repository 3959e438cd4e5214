"""The dp x pp x cp process mesh of node-batch models (hgt): rank arithmetic, its groups, and
the partition of layers over pipeline stages.

Ranks are laid out with the context-parallel coordinate innermost::

    rank = (d * pp + p) * cp + c

so a context-parallel group (one stage of one replica, whose ring exchanges K/V blocks every
layer: the heaviest traffic) is consecutive ranks, which job launchers place on one node. The
pipeline's neighbours (same d, c; stage p and p +- 1) are cp ranks apart, and data-parallel
replicas (same p, c) are pp * cp apart: their gradient all-reduce happens once per step.

Everything here except :func:`build_mesh_groups` is a pure function of integers, tested without
MPI. The groups are created on every rank in the same order, as torch.distributed requires, and
so that a group's ranks agree on it whatever groups the job made before
(:func:`build_mesh_groups`).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from plexgt.distributed.collectives import partition_group
from plexgt.errors import ConfigError, GridError

AXES: tuple[str, str, str] = ("dp", "pp", "cp")
"""The mesh's axes, outermost first."""


@dataclass(frozen=True)
class Mesh:
    """A ``dp * pp * cp`` process mesh: ``dp`` replicas of a ``pp``-stage pipeline whose every
    stage splits each sequence over ``cp`` ranks."""

    dp: int
    """Data-parallel replicas, each on its own share of the step's sequences."""
    pp: int
    """Pipeline stages, each holding consecutive layers."""
    cp: int
    """Context-parallel ranks splitting a sequence's rows (innermost: one node's GPUs)."""

    def __post_init__(self) -> None:
        for name in AXES:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GridError(f"mesh factor {name}={v!r} must be a positive integer")

    @property
    def size(self) -> int:
        """Number of ranks in the mesh."""
        return self.dp * self.pp * self.cp

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.dp, self.pp, self.cp)

    def __str__(self) -> str:
        return f"dp{self.dp}xpp{self.pp}xcp{self.cp}"

    # -- rank <-> coordinates -------------------------------------------------------------
    def coords(self, rank: int) -> tuple[int, int, int]:
        """(d, p, c) of ``rank``."""
        if not 0 <= rank < self.size:
            raise GridError(f"rank {rank} is outside mesh {self} of {self.size} ranks")
        c = rank % self.cp
        p = (rank // self.cp) % self.pp
        return (rank // (self.cp * self.pp), p, c)

    def rank(self, d: int, p: int, c: int) -> int:
        """Rank at mesh coordinates (d, p, c)."""
        if not (0 <= d < self.dp and 0 <= p < self.pp and 0 <= c < self.cp):
            raise GridError(f"coordinates ({d}, {p}, {c}) are outside mesh {self}")
        return (d * self.pp + p) * self.cp + c

    # -- group membership (ascending global rank = torch's group-rank order) --------------
    def cp_members(self, rank: int) -> list[int]:
        """Ranks of ``rank``'s stage of its replica (same d, p), by c: its sequence's rows."""
        d, p, _ = self.coords(rank)
        return [self.rank(d, p, c) for c in range(self.cp)]

    def stage_members(self, rank: int) -> list[int]:
        """Every rank holding ``rank``'s stage (same p: all d and c): the copies of the stage's
        parameters, whose gradients are summed over them."""
        _, p, _ = self.coords(rank)
        return [self.rank(d, p, c) for d in range(self.dp) for c in range(self.cp)]

    def dp_members(self, rank: int) -> list[int]:
        """The replicas' ranks at ``rank``'s place (same p, c), by d."""
        _, p, c = self.coords(rank)
        return [self.rank(d, p, c) for d in range(self.dp)]

    def pipe_members(self, rank: int) -> list[int]:
        """``rank``'s pipeline (same d, c), by stage: the chain activations travel along."""
        d, _, c = self.coords(rank)
        return [self.rank(d, p, c) for p in range(self.pp)]

    def prev_rank(self, rank: int) -> int | None:
        """The rank of the previous stage in ``rank``'s pipeline (None on the first stage)."""
        d, p, c = self.coords(rank)
        return self.rank(d, p - 1, c) if p > 0 else None

    def next_rank(self, rank: int) -> int | None:
        """The rank of the next stage in ``rank``'s pipeline (None on the last stage)."""
        d, p, c = self.coords(rank)
        return self.rank(d, p + 1, c) if p < self.pp - 1 else None


def check_world_size(mesh: Mesh, world_size: int) -> None:
    """Raise naming every factor when ``mesh`` does not cover exactly ``world_size`` ranks."""
    if mesh.size != world_size:
        raise GridError(f"mesh dp={mesh.dp} * pp={mesh.pp} * cp={mesh.cp} = {mesh.size} ranks, "
                        f"but the world size is {world_size}")


def parse_mesh(text: str) -> Mesh:
    """``'DPxPPxCP'`` (e.g. ``'2x3x1'``), the order of the rank layout (dp outermost)."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise GridError(f"mesh {text!r} is not of the form DPxPPxCP, e.g. 2x3x1")
    return Mesh(*(int(p) for p in parts))


def parse_extent(text: str | int, key: str) -> int | None:
    """A mesh extent from the config (``parallel.dp``, ``.pp``, ``.cp``): None for 'auto',
    else the integer >= 1 (one-line ConfigError naming ``key`` otherwise)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif isinstance(text, str) and text.strip().lower() == "auto":
        return None
    else:
        try:
            value = int(text)
        except (TypeError, ValueError):
            value = 0
    if value < 1:
        raise ConfigError(f"config key '{key}': {text!r} is not 'auto' or an integer >= 1")
    return value


def factorizations(world_size: int) -> list[Mesh]:
    """Every ordered (dp, pp, cp) with product ``world_size``."""
    out = []
    for dp in range(1, world_size + 1):
        if world_size % dp:
            continue
        rest = world_size // dp
        out.extend(Mesh(dp, pp, rest // pp) for pp in range(1, rest + 1) if rest % pp == 0)
    return out


def meshes_for(world_size: int, dp: str | int = "auto", pp: str | int = "auto",
               cp: str | int = "auto") -> list[Mesh]:
    """The meshes of ``world_size`` ranks that agree with the config's fixed extents ('auto'
    leaves one free): what a planner searches; one-line error when none exists."""
    fixed = {"dp": parse_extent(dp, "parallel.dp"), "pp": parse_extent(pp, "parallel.pp"),
             "cp": parse_extent(cp, "parallel.cp")}
    out = [m for m in factorizations(world_size)
           if all(v is None or getattr(m, k) == v for k, v in fixed.items())]
    if not out:
        given = " * ".join(f"{k}={v}" for k, v in fixed.items() if v is not None)
        raise GridError(f"no mesh with parallel.{given} fits the world size {world_size}")
    return out


# -- layers over pipeline stages ------------------------------------------------------------


def even_partition(layers: int, pp: int) -> tuple[range, ...]:
    """``layers`` over ``pp`` stages as evenly as possible, the extra layers on the LAST stages
    (the first holds the embedding table and the batch's construction)."""
    if pp < 1:
        raise ConfigError(f"config key 'parallel.pp': {pp} must be at least 1")
    check_layout(layers=layers, pp=pp)
    base, extra = divmod(layers, pp)
    return ranges([base + (1 if s >= pp - extra else 0) for s in range(pp)])


def ranges(counts: Sequence[int]) -> tuple[range, ...]:
    """Layer counts per stage -> the global layer indices of each stage."""
    out, lo = [], 0
    for n in counts:
        out.append(range(lo, lo + n))
        lo += n
    return tuple(out)


def parse_stages(stages: str | Sequence[int], layers: int, pp: int | None = None
                 ) -> tuple[int, ...] | None:
    """``parallel.stages`` -> the layers of each stage: None for 'auto', else the
    comma-separated counts ('3,7,7,7') or a sequence of counts, each >= 1, summing to
    ``layers``, ``pp`` of them (when given). The one owner of these rules (the config
    check, the planner and the run all call it); one-line ConfigErrors name the key."""
    if isinstance(stages, str):
        text = stages.strip()
        if text.lower() == "auto":
            return None
        try:
            counts = tuple(int(p) for p in text.split(","))
        except ValueError:
            raise ConfigError(f"config key 'parallel.stages': {stages!r} is not 'auto' or "
                              "layers per stage, comma-separated (3,7,7,7)") from None
    else:
        counts = tuple(int(s) for s in stages)
        text = ",".join(map(str, counts))
    if not counts or min(counts) < 1:
        raise ConfigError(f"config key 'parallel.stages': {text!r} has a stage with no layer "
                          f"(stage {counts.index(min(counts)) if counts else 0}; each must "
                          "be >= 1)")
    if pp is not None and len(counts) != pp:
        raise ConfigError(f"config key 'parallel.stages': {text!r} is {len(counts)} stages, "
                          f"parallel.pp={pp}")
    if sum(counts) != layers:
        raise ConfigError(f"config key 'parallel.stages': {text!r} sums to {sum(counts)} "
                          f"layers, not model.layers={layers}")
    return counts


def partition(stages: str | Sequence[int], layers: int, pp: int) -> tuple[range, ...]:
    """``parallel.stages`` -> the global layer indices of each of the ``pp`` stages.

    ``stages`` is 'auto' (the even split: a planner resolves 'auto' to its own partition before
    calling this), comma-separated counts ('3,7,7,7') or a sequence of counts
    (:func:`parse_stages` checks them)."""
    counts = parse_stages(stages, layers, pp)
    return even_partition(layers, pp) if counts is None else ranges(counts)


# -- a step's sequences over replicas and micro-batches ---------------------------------------


def check_layout(sequences: int | None = None, size: int | None = None,
                 layers: int | None = None, dp: int | None = None, pp: int | None = None,
                 cp: int | None = None, micro_batches: int | None = None) -> None:
    """One-line ConfigErrors when a node-sequence step cannot be laid out on the mesh: more
    stages ``pp`` than ``layers``, ``cp`` not dividing the sequence length ``size``
    (``batch.size``: each cp rank holds N'/cp rows), ``dp`` not dividing the step's
    ``sequences`` (``batch.sequences``), ``micro_batches`` not dividing a replica's share (the
    step's, ``dp`` unknown). Every layout computes the same step only then. None: not known
    yet ('auto', the planner's), that rule skipped.

    The one owner of these rules: the config check (:mod:`plexgt.plan.knobs`), the planner's
    search and cost model and the run's layout all call it, so a user meets the same message
    wherever a layout is refused."""
    if pp is not None and layers is not None and pp > layers:
        raise ConfigError(f"config key 'parallel.pp': {pp} stages for model.layers={layers} "
                          "(each stage needs a layer)")
    if cp is not None and size is not None and size % cp:
        raise ConfigError(f"config key 'parallel.cp': {cp} does not divide batch.size={size} "
                          "(each context-parallel rank holds N'/cp rows)")
    if sequences is None:
        return
    if dp is not None and sequences % dp:
        raise ConfigError(f"config key 'parallel.dp': {dp} does not divide batch.sequences="
                          f"{sequences} (each replica takes an equal share of a step)")
    if micro_batches is None:
        return
    if dp is not None:
        n, whose, of = sequences // dp, "a replica's", f" / parallel.dp={dp}"
    else:
        n, whose, of = sequences, "the step's", ""
    if micro_batches < 1 or n % micro_batches:
        raise ConfigError(f"config key 'parallel.micro_batches': {micro_batches} does not "
                          f"divide {whose} {n} sequences (batch.sequences={sequences}{of})")


def check_batch(sequences: int, size: int, mesh: Mesh, micro_batches: int) -> None:
    """:func:`check_layout` of the step's ``sequences`` and sequence length ``size`` on
    ``mesh`` with ``micro_batches``."""
    check_layout(sequences, size, dp=mesh.dp, cp=mesh.cp, micro_batches=micro_batches)


def micro_batch(sequences: int, dp: int, micro_batches: int, d: int, k: int) -> range:
    """The step's sequence indices in micro-batch ``k`` of replica ``d``: replica d holds
    [d G/dp, (d+1) G/dp), its micro-batch k the k-th equal contiguous share of those
    (:func:`check_batch` first)."""
    share = sequences // dp
    m = share // micro_batches
    lo = d * share + k * m
    return range(lo, lo + m)


# -- torch.distributed groups ---------------------------------------------------------------


@dataclass
class MeshGroups:
    """This rank's torch.distributed groups of a :class:`Mesh` (from :func:`build_mesh_groups`),
    passed explicitly to whatever communicates."""

    mesh: Mesh
    rank: int
    cp: Any
    """Same (d, p): the ranks splitting this stage's sequences (GA-CP's ring)."""
    stage: Any
    """Same p: every copy of this stage's parameters (gradient all-reduce)."""
    dp: Any
    """Same (p, c): this rank's counterparts in the other replicas."""
    pipe: Any
    """Same (d, c): this rank's pipeline, stage by stage (activations' send/recv)."""
    world: Any = None
    """The whole world (the step's loss is summed over it)."""

    @property
    def coords(self) -> tuple[int, int, int]:
        """(d, p, c) of this rank."""
        return self.mesh.coords(self.rank)

    @property
    def stage_index(self) -> int:
        return self.coords[1]

    @property
    def first(self) -> bool:
        """This rank runs the first stage (reads the inputs)."""
        return self.coords[1] == 0

    @property
    def last(self) -> bool:
        """This rank runs the last stage (computes the loss)."""
        return self.coords[1] == self.mesh.pp - 1

    @property
    def prev(self) -> int | None:
        """Global rank of the previous stage's peer (None on the first stage)."""
        return self.mesh.prev_rank(self.rank)

    @property
    def next(self) -> int | None:
        """Global rank of the next stage's peer (None on the last stage)."""
        return self.mesh.next_rank(self.rank)


GROUP_KINDS: tuple[str, ...] = ("cp", "stage", "dp", "pipe")
"""The mesh's group kinds, in the order every rank creates them."""


def mesh_groups_of(mesh: Mesh, kind: str) -> list[list[int]]:
    """Every group of ``kind`` (:data:`GROUP_KINDS`) of ``mesh``, each ascending, in ascending
    order of their ranks: the order in which every rank creates them."""
    members = getattr(mesh, f"{kind}_members")
    return [list(g) for g in sorted({tuple(members(r)) for r in range(mesh.size)})]


def build_mesh_groups(mesh: Mesh, rank: int, world_size: int,
                      timeout: datetime.timedelta | None = None) -> MeshGroups:
    """Create this rank's cp, stage, dp and pipe groups (every rank calls it, in step).

    Each kind's groups partition the world;
    :func:`~plexgt.distributed.collectives.partition_group` creates them (on gloo every group
    on every rank, globally synchronised; bound to a GPU each rank its own, members-only) so
    that a group's ranks agree on it whatever groups the job made before: members-only
    creation everywhere, as here before, hung the multi-rank suite at 3 ranks when a test had
    made a group not every rank joined.
    ``timeout`` bounds the new groups' collectives (a stopped peer would otherwise hang the
    job for torch's 30-minute sub-group default)."""
    check_world_size(mesh, world_size)
    kw: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    mine = {kind: partition_group(mesh_groups_of(mesh, kind), rank, **kw)
            for kind in GROUP_KINDS}
    return MeshGroups(mesh=mesh, rank=rank, world=dist.group.WORLD, **mine)
