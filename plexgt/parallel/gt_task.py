"""gt / gps for ``plexgt train``: bind a distributed model to this rank's rows (a Task builder).

Register with ``plexgt.tasks.BUILDERS["gt"] = BUILDERS["gps"] = build_attention_task``.

* Strategy: ``parallel.strategy`` 'ag' (GP-AG) or 'a2a' (GP-A2A); 'auto' asks AGP
  (:mod:`plexgt.parallel.agp`) for the fastest strategy that fits on all ranks of the job.
* GPS GCN path: the 3D (Plexus) path on the given Gx x Gy x Gz grid
  (:mod:`plexgt.parallel.redistribute`); with ``parallel.grid`` 'auto' on more than one rank,
  the 1D layout or the 3D path on the 3D planner's best grid of the job
  (:func:`plexgt.parallel.agp.gcn_grid_for`), whichever AGP predicts faster with the strategy
  (:func:`choose_gps_layout`). The Task's grid and strategy name the choice ('rows4',
  'gp_ag'; '2x2x1', 'gp_ag+plexus3d').
* Parameters are replicated; :class:`RowParallel` sums their gradients over the ranks in one
  all-reduce queued at the end of every backward (as DDP does), so the training loop needs no
  special step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from plexgt.dist.collectives import Comm, CommLedger
from plexgt.dist.grid import Grid3D
from plexgt.parallel.rows1d import (
    DistGraph,
    all_reduce_gradients,
    build_dist_graph,
    read_rows,
    row_correct,
    row_cross_entropy,
)
from plexgt.parallel.strategies import default_registry

Tensor = torch.Tensor
STRATEGY_NAMES = {"ag": "gp_ag", "a2a": "gp_a2a"}


class _SyncOnBackward(torch.autograd.Function):
    """Identity whose backward queues the gradient all-reduce for the end of the pass."""

    @staticmethod
    def forward(ctx: Any, out: Tensor, owner: RowParallel) -> Tensor:
        ctx.owner = owner
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Any, ...]:
        owner = ctx.owner
        torch.autograd.Variable._execution_engine.queue_callback(  # type: ignore[attr-defined]
            lambda: all_reduce_gradients(owner.model, owner.comm))
        return g, None


class RowParallel(nn.Module):
    """A row-partitioned model (DistGraphTransformer / DistGPS) with its graph: x -> logits,
    parameter gradients summed over ``comm`` after each backward."""

    def __init__(self, model: nn.Module, graph: DistGraph, comm: Comm) -> None:
        super().__init__()
        self.model = model
        self.graph = graph
        self.comm = comm

    def forward(self, x: Any) -> Tensor:
        out = self.model(x, self.graph)
        if torch.is_grad_enabled() and out.requires_grad and self.comm.size > 1:
            out = _SyncOnBackward.apply(out, self)
        return out


def _system_model(prof: dict[str, Any] | None) -> Any:
    """AGP's coefficients: the profile's, else the defaults."""
    from plexgt.parallel.agp import SystemModel

    return SystemModel.from_profile(prof) if prof else SystemModel()


def _workload(cfg: Any, pg: Any, esize: int, grid: Grid3D | None = None) -> Any:
    from plexgt.parallel.agp import Workload

    gps = cfg.model.name == "gps"
    return Workload(cfg.model.name, pg.N, pg.E, pg.F, max(1, pg.C), cfg.model.hidden,
                    cfg.model.heads, cfg.model.layers, 2, esize,
                    gcn_grid=grid if gps else None,
                    gcn_block_rows=(cfg.parallel.block_rows or None) if gps else None)


def _fastest(pl: Any) -> Any:
    """The fastest predicted row of a plan (memory unconstrained: all fit)."""
    return min((r for r in pl.rows if r.fits), key=lambda r: r.est.time_s).est


def choose_strategy(cfg: Any, pg: Any, world_size: int, esize: int,
                    grid: Grid3D | None = None, sysm: Any = None) -> str:
    """The configured strategy, or AGP's choice at the job's size (memory unconstrained), from
    ``sysm`` (default: parallel.profile's coefficients when one is given); gps with a
    ``grid``: its GCN path priced 3D on that grid (else 1D)."""
    name = cfg.parallel.strategy
    if name in STRATEGY_NAMES:
        return STRATEGY_NAMES[name]
    from plexgt.parallel.agp import plan
    from plexgt.tasks import machine_profile

    if sysm is None:
        sysm = _system_model(machine_profile(cfg))
    pl = plan(_workload(cfg, pg, esize, grid), list(default_registry()), [world_size], sysm)
    return _fastest(pl).strategy


def choose_gps_layout(cfg: Any, pg: Any, world_size: int, esize: int,
                      prof: dict[str, Any] | None = None) -> tuple[str, Grid3D | None]:
    """gps: (strategy, grid of the 3D GCN path or None for the 1D path).

    An explicit ``parallel.grid`` is used as given (the strategy priced with it). With 'auto'
    on more than one rank the 3D planner picks its best grid of the job's ranks for the GCN
    path's d -> d layer (:func:`plexgt.parallel.agp.gcn_grid_for`, parallel.profile's
    coefficients), and AGP prices the step with the GCN path 1D and 3D on that grid: with
    the configured strategy, or every strategy when 'auto'; the fastest is taken. ``prof``:
    the machine profile (default: parallel.profile, read here)."""
    from plexgt.dist.grid import check_world_size, parse_grid
    from plexgt.tasks import machine_profile, plexus_coefficients

    prof = prof if prof is not None else machine_profile(cfg)
    sysm = _system_model(prof)
    if cfg.parallel.grid != "auto":
        grid = parse_grid(cfg.parallel.grid)
        check_world_size(grid, world_size)
        return choose_strategy(cfg, pg, world_size, esize, grid, sysm), grid
    if world_size == 1:
        return choose_strategy(cfg, pg, world_size, esize, sysm=sysm), None
    from plexgt.parallel.agp import gcn_grid_for, plan

    selfloops = pg.self_loops
    grid = gcn_grid_for(world_size, pg.N, pg.E + (0 if selfloops else pg.N), cfg.model.hidden,
                        esize, plexus_coefficients(cfg, prof))
    reg = default_registry()
    name = cfg.parallel.strategy
    strategies = [reg.get(STRATEGY_NAMES[name])] if name in STRATEGY_NAMES else list(reg)
    pl = plan(_workload(cfg, pg, esize), strategies, [world_size], sysm,
              gcn_grids={world_size: grid})
    best = _fastest(pl)
    return best.strategy, best.gcn_grid


def build_attention_task(cfg: Any, ctx: Any, pg: Any, ledger: CommLedger) -> Any:
    """A :class:`plexgt.train.Task` for cfg.model.name in ('gt', 'gps')."""
    import torch.distributed as dist

    from plexgt.config import ConfigError
    from plexgt.parallel.gps_dist import DistGPS
    from plexgt.parallel.gt_dist import DistGraphTransformer
    from plexgt.train import Task

    if pg.C < 1:
        raise ConfigError(f"{pg.path}: the prepared graph has no labels to train on")
    if ctx.world_size > pg.N:
        raise ConfigError(f"{pg.path}: {ctx.world_size} ranks for N={pg.N} nodes")
    from plexgt.tasks import DTYPES

    dt = DTYPES[cfg.dtype]
    esize = torch.tensor([], dtype=dt).element_size()
    comm = Comm.from_group(dist.group.WORLD, "rows", ledger)
    gps = cfg.model.name == "gps"
    grid = axis = None
    if gps:  # the same choice on every rank: it only reads sizes, the config and the profile
        sname, grid = choose_gps_layout(cfg, pg, ctx.world_size, esize)
    else:
        sname = choose_strategy(cfg, pg, ctx.world_size, esize)
    if grid is not None:
        from plexgt.dist.grid import build_groups

        groups = build_groups(grid, ctx.rank, ctx.world_size)
        axis = {a: Comm.from_group(g, a, ledger) for a, g in groups.axis.items()}
    before = pg.bytes_read
    graph = build_dist_graph(pg, comm, default_registry().get(sname), cfg.model.heads, gcn=gps,
                             dtype=dt, grid=grid, axis_comms=axis,
                             block_rows=cfg.parallel.block_rows or None)
    graph = graph.to(ctx.device)
    data = read_rows(pg, ctx.world_size, ctx.rank, dt).to(ctx.device)
    torch.manual_seed(cfg.seed)  # identical replicated parameters on every rank
    cls = DistGPS if gps else DistGraphTransformer
    model = cls(pg.F, cfg.model.hidden, pg.C, num_layers=cfg.model.layers,
                heads=cfg.model.heads, dropout=cfg.model.dropout,
                input_dropout=cfg.model.input_dropout).to(dt)
    torch.manual_seed(cfg.seed * 7919 + ctx.rank + 1)  # independent dropout masks per rank
    return Task(
        model=RowParallel(model, graph, comm).to(ctx.device),
        inputs=data.x,
        loss=lambda out: row_cross_entropy(out, data.labels, data.masks["train"], comm),
        correct=lambda out: row_correct(out, data.labels, data.masks, comm),
        ledger=ledger,
        grid=str(grid) if grid is not None else f"rows{ctx.world_size}",
        strategy=sname + ("+plexus3d" if grid is not None else ""),
        bytes_read=pg.bytes_read - before,
    )
