"""The one place a run's layout is chosen: grid, attention strategy, GPS's GCN path.

``plexgt train --grid auto / --strategy auto`` and ``plexgt plan`` both call these functions,
so the two never disagree. They plan from sizes alone (:class:`GraphSizes`,
:class:`ModelShape`): a user plans papers100M before preparing it, and a prepared directory
only contributes its manifest's numbers.

* gcn: the 3D planner's fastest Gx x Gy x Gz of the job (:func:`choose_grid`), priced on the
  stored pattern's nonzeros E (prep stores the self loops GCN adds, unless told not to).
* gt: AGP's fastest strategy at the job's size (:func:`choose_strategy`).
* gps: the strategy joined with the GCN path, 1D or 3D on the 3D planner's grid of the job
  (:func:`choose_gps_layout`), priced on the nonzeros of A + I (the path adds self loops).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from plexgt.distributed.grid import Grid3D, check_world_size, parse_grid
from plexgt.distributed.layout3d import LayerLayout
from plexgt.errors import ConfigError
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.strategy import AttentionStrategy
from plexgt.plan.agp import Plan, SystemModel, Workload, gcn_grid_for, plan
from plexgt.plan.plexus_cost import Coefficients, layout_block_rows, rank_grids

STRATEGIES = ("auto", "gp_ag", "gp_a2a", "gp_ring", "gp_2d")
"""What ``parallel.strategy`` and ``--strategy`` accept: the registry's names, or AGP's pick."""


@dataclass(frozen=True)
class GraphSizes:
    """The numbers of a graph a plan needs (a prepared manifest's, or typed by the user)."""

    n: int
    """Nodes N."""
    e: int
    """Stored edges E (self loops included when prep added them)."""
    features: int
    """Input feature width F."""
    classes: int
    """Classes C (at least 1 for planning)."""
    self_loops: bool = True
    """Whether E already holds one self loop per node (prep's default)."""
    feature_density: float | None = None
    """Share of nonzero input features when they are stored (and trained) sparse; None:
    dense."""

    @property
    def gcn_path_nnz(self) -> int:
        """Nonzeros of A + I, which GPS's GCN path builds from the attention pattern."""
        return self.e + (0 if self.self_loops else self.n)


@dataclass(frozen=True)
class ModelShape:
    """The model and numeric sizes a plan prices."""

    name: str
    """'gcn', 'gt' or 'gps'."""
    hidden: int
    """Hidden width d."""
    layers: int
    """Layers (gcn) or blocks (gt, gps)."""
    heads: int = 4
    """Attention heads (gt, gps)."""
    ffn_mult: int = 2
    """FFN width multiplier (gt, gps)."""
    esize: int = 4
    """Bytes per element of activations."""
    gcn_order: str = "auto"
    """GCN layer order (gcn): 'auto', 'aggregate_first' or 'gemm_first'."""
    block_rows: int | None = None
    """Rows per aggregation block; None: from the cost model."""
    ring_chunks: int = 1
    """Pieces a ring strategy's K/V blocks travel in."""
    super_nodes: int = 0
    """Global super nodes (gt, gps)."""
    trained_input: bool = False
    """The input is trained (a node embedding): gcn's layer 0 communicates its gradient."""


def gcn_dims(sizes: GraphSizes, shape: ModelShape) -> list[int]:
    """Widths of a GCN's layers, input to output: [F, d, ..., d, C]."""
    return [sizes.features] + [shape.hidden] * (shape.layers - 1) + [max(1, sizes.classes)]


def resolve_grid(text: str, world_size: int) -> Grid3D | None:
    """An explicit 'GxxGyxGz' checked against the world size, or None for 'auto'."""
    if text == "auto":
        return None
    grid = parse_grid(text)
    check_world_size(grid, world_size)
    return grid


def choose_grid(sizes: GraphSizes, shape: ModelShape, world_size: int, coef: Coefficients,
                memory_per_rank: int | None = None) -> Grid3D:
    """gcn: the 3D planner's fastest factorisation of ``world_size`` that fits."""
    ests = rank_grids(world_size, sizes.n, sizes.e, gcn_dims(sizes, shape), shape.esize, coef,
                      memory_per_rank, order=shape.gcn_order, input_grad=shape.trained_input,
                      input_density=sizes.feature_density)
    return ests[0].grid


def gcn_block_rows(layouts: list[LayerLayout], sizes: GraphSizes, shape: ModelShape,
                   coef: Coefficients) -> int | None:
    """Rows per aggregation block: the configured value, else the cost model's for the layer
    with the most to overlap. From global sizes only, so every rank of an all-reduce group
    cuts the same blocks."""
    if shape.block_rows:
        return shape.block_rows
    return layout_block_rows(layouts, sizes.e, shape.esize, coef)


def workload(sizes: GraphSizes, shape: ModelShape, grid: Grid3D | None = None) -> Workload:
    """AGP's view of a gt / gps step (``grid``: gps's 3D GCN path, else 1D)."""
    gps = shape.name == "gps"
    return Workload(shape.name, sizes.n, sizes.e, sizes.features, max(1, sizes.classes),
                    shape.hidden, shape.heads, shape.layers, shape.ffn_mult, shape.esize,
                    gcn_grid=grid if gps else None,
                    gcn_block_rows=shape.block_rows if gps else None,
                    ring_chunks=shape.ring_chunks, super_nodes=shape.super_nodes)


def candidates(strategy: str) -> list[AttentionStrategy]:
    """The strategies a choice may take: every registered one for 'auto', else that one."""
    reg = default_registry()
    if strategy == "auto":
        return list(reg)
    if strategy not in reg:
        raise ConfigError(f"parallel.strategy: unknown {strategy!r}; known: auto, "
                          f"{', '.join(reg.names())}")
    return [reg.get(strategy)]


class Layout(NamedTuple):
    """A gt / gps run's attention layout: the strategy, gps's 3D GCN grid (None: the 1D path
    or gt), and gp_2d's head axis a (1 for every other strategy)."""

    strategy: str
    grid: Grid3D | None = None
    head_parallel: int = 1


def _fastest(pl: Plan) -> Layout:
    """The fastest predicted row of a plan that fits."""
    fits = [r for r in pl.rows if r.fits]
    if not fits:
        raise ConfigError("no attention strategy fits the memory per rank at this job's size")
    best = min(fits, key=lambda r: r.est.time_s).est
    return Layout(best.strategy, best.gcn_grid, best.head_parallel)


def _head_axis(strategy: str, world_size: int, head_parallel: int) -> int:
    """gp_2d's a as configured (checked against the ranks), else 1."""
    if strategy != "gp_2d":
        return 1
    if head_parallel and world_size % head_parallel:
        raise ConfigError(f"parallel.head_parallel: {head_parallel} does not divide the "
                          f"{world_size} ranks")
    return head_parallel


def choose_attention(sizes: GraphSizes, shape: ModelShape, world_size: int,
                     sysm: SystemModel, strategy: str = "auto", grid: Grid3D | None = None,
                     memory_per_rank: int | None = None, head_parallel: int = 0) -> Layout:
    """gt (and gps on a given ``grid``): the configured strategy, or AGP's fastest at the
    job's size; gp_2d's head axis as configured (``head_parallel`` > 0) or AGP's."""
    _head_axis("gp_2d", world_size, head_parallel)  # a head axis that cannot tile: an error
    cands = candidates(strategy)
    if len(cands) == 1 and (cands[0].head_axes is None or head_parallel):
        return Layout(cands[0].name, grid, _head_axis(cands[0].name, world_size, head_parallel)
                      or 1)
    pl = plan(workload(sizes, shape, grid), cands, [world_size], sysm, memory_per_rank,
              head_parallel=head_parallel)
    return _fastest(pl)._replace(grid=grid)


def choose_strategy(sizes: GraphSizes, shape: ModelShape, world_size: int, sysm: SystemModel,
                    strategy: str = "auto", grid: Grid3D | None = None,
                    memory_per_rank: int | None = None) -> str:
    """The strategy name of :func:`choose_attention`."""
    return choose_attention(sizes, shape, world_size, sysm, strategy, grid,
                            memory_per_rank).strategy


def choose_gps_layout(sizes: GraphSizes, shape: ModelShape, world_size: int, sysm: SystemModel,
                      coef: Coefficients, strategy: str = "auto", grid: str = "auto",
                      memory_per_rank: int | None = None, head_parallel: int = 0) -> Layout:
    """gps: the strategy, the grid of the 3D GCN path (None for the 1D path), gp_2d's a.

    An explicit ``grid`` is used as given (the strategy priced with it). With 'auto' on more
    than one rank the 3D planner picks its best grid of the job's ranks for the path's d -> d
    layer (:func:`~plexgt.plan.agp.gcn_grid_for`), and AGP prices the step with the path 1D
    and 3D on that grid, with the given strategy or every strategy for 'auto'; the fastest
    is taken."""
    _head_axis("gp_2d", world_size, head_parallel)
    fixed = resolve_grid(grid, world_size)
    if fixed is not None or world_size == 1:
        return choose_attention(sizes, shape, world_size, sysm, strategy, fixed,
                                memory_per_rank, head_parallel)
    g3 = gps_grid(sizes, shape, world_size, coef)
    pl = plan(workload(sizes, shape), candidates(strategy), [world_size], sysm, memory_per_rank,
              gcn_grids={world_size: g3}, head_parallel=head_parallel)
    return _fastest(pl)


def gps_grid(sizes: GraphSizes, shape: ModelShape, s: int, coef: Coefficients) -> Grid3D:
    """The 3D planner's grid of s ranks for GPS's GCN path (one d -> d layer)."""
    return gcn_grid_for(s, sizes.n, sizes.gcn_path_nnz, shape.hidden, shape.esize, coef)
