"""gcn's search over every configuration a run can take: every scale, grid, order, blocking.

A job of P ranks can run gcn on any s <= P of them, on any factorisation Gx x Gy x Gz of s
(not only powers of two), each layer aggregate_first or gemm_first, and the aggregation in row
blocks or whole. :func:`search_gcn` prices them with the 3D cost model
(:func:`plexgt.plan.plexus_cost.estimate`, one rank standing for all) and returns the fastest
configuration that fits ``memory_limit`` and the Pareto frontier of predicted time against
memory per rank (the best configuration of each scale on it).

The search has two stages. First every grid of every scale is priced in the configured order
(``auto``: per layer by its widths) with whole-block aggregation, and grids over the memory
limit are dropped. Then, on the scales that can matter (the first stage's time-memory frontier
and its :data:`REFINE_SCALES` fastest scales), the :data:`REFINE` fastest survivors are
priced again for every uniform order, blocked (the cost model's block rows) and whole. Why
not price every combination everywhere: at P = 2048 there are 72,003 grids, and five more
variants of each would take minutes. The second stage is a heuristic: it assumes order and
blocking reorder configurations within the leading grids and scales, not across the whole
field. ``refine=None`` enumerates fully; the tests compare the two on small P, and
perf/results/plan_search.json times P = 2048.

On a machine whose placement is known (a description's topology), each grid is also priced in
every axis order (which axis is innermost, so inside a node): the order changes only what its
collectives cost, so a grid is priced once and its traffic repriced per order
(:func:`~plexgt.plan.plexus_cost.reorder`), and the cheapest order stands for the grid.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from plexgt.distributed.grid import DEFAULT_ORDER, Grid3D, factorizations
from plexgt.distributed.grid import ORDERS as AXIS_ORDERS
from plexgt.models.gcn import GCNOp
from plexgt.plan.balance import Balance
from plexgt.plan.pareto import chosen_and_frontier, frontier
from plexgt.plan.plexus_cost import (
    Coefficients,
    PlexusEstimate,
    chain_layouts,
    estimate,
    layout_block_rows,
    reorder,
)

REFINE = 4
"""Grids per scale priced again in every order and blocking (the second stage)."""
REFINE_SCALES = 16
"""Scales refined beyond the first stage's frontier: its fastest this many."""
ORDERS = ("auto", "aggregate_first", "gemm_first")


@dataclass(frozen=True)
class GcnConfig:
    """One configuration of a gcn run and its prediction."""

    grid: Grid3D
    order: str
    """'auto' (per layer by width), 'aggregate_first' or 'gemm_first'."""
    block_rows: int | None
    """Rows per aggregation block; None: whole blocks."""
    est: PlexusEstimate

    @property
    def scale(self) -> int:
        return self.grid.size

    @property
    def label(self) -> str:
        return f"{self.grid} {self.order} block_rows={self.block_rows or 'whole'}"


@dataclass
class GcnSearch:
    """What :func:`search_gcn` found."""

    best_per_scale: list[GcnConfig]
    """The fastest fitting configuration of each scale that has one, by scale."""
    chosen: GcnConfig | None
    """The fastest that fits at any scale (ties: fewer ranks); None when nothing fits."""
    frontier: list[GcnConfig] = field(default_factory=list)
    """Of ``best_per_scale``: those no other is both faster and smaller, fastest first."""
    grids: int = 0
    """Grids priced in the first stage."""
    priced: int = 0
    """Configurations priced in all."""
    seconds: float = 0.0
    """Wall time of the search."""
    least_memory: tuple[int, int] | None = None
    """(bytes per rank, scale) of the configuration priced that needs the least memory,
    fitting or not: what a limit nothing fits under would have to be raised to."""


def _block_rows(grid: Grid3D, n: int, nnz: int, dims: list[int], esize: int,
                coef: Coefficients, order: str, ops: list[GCNOp] | None = None
                ) -> int | None:
    """The cost model's rows per block for ``grid`` (as train picks them)."""
    return layout_block_rows(chain_layouts(grid, 0, n, dims, order, ops=ops), nnz, esize,
                             coef)


def search_gcn(n: int, nnz: int, dims: list[int], esize: int, coef: Coefficients,
               world_size: int, memory_limit: int | None = None, order: str = "auto",
               scales: list[int] | None = None, refine: int | None = REFINE,
               input_grad: bool = False, input_density: float | None = None,
               grid: Grid3D | None = None, block_rows: int | None = None,
               axis_order: str = "auto", ops: list[GCNOp] | None = None,
               norm: str = "none", inference: bool = False,
               checkpoint: bool = False, balance: Balance | None = None
               ) -> GcnSearch:
    """Search every factorisation of every scale in ``scales`` (default 1..world_size; only
    ``grid`` when given), the layer orders (``order`` 'auto': all of :data:`ORDERS`; else
    that one) and blocked or whole aggregation (``block_rows`` given: those rows only); see
    the module docstring. ``refine=None`` prices every combination. ``axis_order``: 'auto'
    searches the rank order where the coefficients know the machine's placement (else the
    default), or that one; a given ``grid`` keeps its own. ``ops``, ``norm``: the grid3d
    model's options (:func:`plexgt.models.gcn.gcn_ops`; ``dims`` their widths);
    ``inference``: price one forward pass, not a training step
    (:func:`~plexgt.plan.plexus_cost.rank_cost`); ``checkpoint``: its ops recomputed in
    backward (``model.checkpoint``; a training step's only); ``balance``: the pattern's
    block counts, the busiest block priced (:mod:`plexgt.plan.balance`)."""
    t0 = time.perf_counter()
    orders = ORDERS if order == "auto" else (order,)
    kw = dict(input_grad=input_grad, input_density=input_density, ops=ops, norm=norm,
              inference=inference, checkpoint=checkpoint, balance=balance)
    if grid is not None:
        axis_orders: tuple[str, ...] = (grid.order,)
    elif axis_order != "auto":
        axis_orders = (axis_order,)
    else:
        axis_orders = AXIS_ORDERS if coef.topology is not None else (DEFAULT_ORDER,)

    def price(g: Grid3D, o: str, br: int | None) -> GcnConfig:
        est = estimate(g.with_order(axis_orders[0]), n, nnz, dims, esize, coef, br, o, **kw)
        if len(axis_orders) > 1:
            best, best_comm = axis_orders[0], est.comm_s
            ext = {"x": g.gx, "y": g.gy, "z": g.gz}
            seen = set()
            for ao in axis_orders[1:]:
                # group_extent / group_stride of the reordered grid, by plain arithmetic (a
                # Grid3D per order and grid cost 40% of the search at P = 2048)
                stride, acc = {}, 1
                for a in ao:
                    stride[a], acc = acc, acc * ext[a]
                key = tuple(stride[a] if ext[a] > 1 else 0 for a in "xyz")
                if key in seen:
                    continue
                seen.add(key)
                comm = 0.0
                for group, op, calls, nbytes in est.traffic:  # an axis, or a norm's plane
                    size = ext[group] if len(group) == 1 else math.prod(ext[a] for a in group)
                    step = stride[group] if len(group) == 1 else min(stride[a] for a in group)
                    per_call, per_byte = coef.price(op, size, g.size, step)
                    comm += calls * per_call + nbytes * per_byte
                if comm < best_comm:
                    best, best_comm = ao, comm
            if best != axis_orders[0]:
                est = reorder(est, best, coef)
        return GcnConfig(est.grid, o, br, est)

    least: tuple[int, int] | None = None

    def fits(c: GcnConfig) -> bool:
        nonlocal least
        if least is None or c.est.memory_bytes < least[0]:
            least = (c.est.memory_bytes, c.scale)
        return memory_limit is None or c.est.memory_bytes <= memory_limit

    grids, priced = 0, 0
    fitting: dict[int, list[GcnConfig]] = {}
    for s in [grid.size] if grid is not None else scales or range(1, world_size + 1):
        first = []
        for g in [grid] if grid is not None else factorizations(s):
            c = price(g, orders[0], block_rows)
            grids += 1
            if fits(c):
                first.append(c)
        if first:
            fitting[s] = sorted(first, key=lambda c: c.est.time_s)
    priced = grids
    # the second stage on the scales that can matter: the first stage's frontier and its
    # fastest REFINE_SCALES scales (all of them with refine=None)
    leaders = [v[0] for v in fitting.values()]
    keep = {leaders[i].scale for i in frontier(leaders, lambda c: c.est.time_s,
                                                lambda c: c.est.memory_bytes)}
    keep |= {c.scale for c in sorted(leaders, key=lambda c: c.est.time_s)[:REFINE_SCALES]}
    best = []
    for s, first in fitting.items():
        cands = list(first)
        if refine is None or s in keep:
            for c in first if refine is None else first[:refine]:
                for o in orders:
                    rows = ({block_rows} if block_rows else
                            {_block_rows(c.grid, n, nnz, dims, esize, coef, o, ops), None})
                    for br in rows:
                        if (o, br) != (c.order, c.block_rows):
                            priced += 1
                            cands.append(price(c.grid, o, br))
        cands = [c for c in cands if fits(c)]
        best.append(min(cands, key=lambda c: c.est.time_s))
    chosen, front = chosen_and_frontier(best, lambda c: c.est.time_s,
                                        lambda c: c.est.memory_bytes, lambda c: c.scale)
    return GcnSearch(best, chosen, front, grids, priced, time.perf_counter() - t0, least)
