"""gt / gps for ``plexgt train``: bind a distributed model to this rank's rows (a Task builder).

Register with ``plexgt.tasks.BUILDERS["gt"] = BUILDERS["gps"] = build_attention_task``.

* Strategy: ``parallel.strategy`` 'ag' (GP-AG) or 'a2a' (GP-A2A); 'auto' asks AGP
  (:mod:`plexgt.parallel.agp`) for the fastest strategy that fits on all ranks of the job.
* GPS GCN path: the 1D layout when ``parallel.grid`` is 'auto'; the 3D (Plexus) path on the
  given Gx x Gy x Gz grid otherwise (:mod:`plexgt.parallel.redistribute`).
* Parameters are replicated; :class:`RowParallel` sums their gradients over the ranks in one
  all-reduce queued at the end of every backward (as DDP does), so the training loop needs no
  special step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from plexgt.dist.collectives import Comm, CommLedger
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


def choose_strategy(cfg: Any, pg: Any, world_size: int, esize: int) -> str:
    """The configured strategy, or AGP's choice at the job's size (memory unconstrained), from
    parallel.profile's coefficients when one is given."""
    name = cfg.parallel.strategy
    if name in STRATEGY_NAMES:
        return STRATEGY_NAMES[name]
    from plexgt.parallel.agp import SystemModel, Workload, plan

    reg = default_registry()
    w = Workload(cfg.model.name, pg.N, pg.E, pg.F, max(1, pg.C), cfg.model.hidden,
                 cfg.model.heads, cfg.model.layers, 2, esize)
    if cfg.parallel.profile:
        from plexgt.profile import read_profile

        sysm = SystemModel.from_profile(read_profile(cfg.parallel.profile))
    else:
        sysm = SystemModel()
    pl = plan(w, list(reg), [world_size], sysm)
    best = min((r for r in pl.rows if r.fits), key=lambda r: r.est.time_s)
    return best.est.strategy


def build_attention_task(cfg: Any, ctx: Any, pg: Any, ledger: CommLedger) -> Any:
    """A :class:`plexgt.train.Task` for cfg.model.name in ('gt', 'gps')."""
    import torch.distributed as dist

    from plexgt.config import ConfigError
    from plexgt.dist.grid import check_world_size, parse_grid
    from plexgt.parallel.gps_dist import DistGPS
    from plexgt.parallel.gt_dist import DistGraphTransformer
    from plexgt.train import Task

    if pg.C < 1:
        raise ConfigError(f"{pg.path}: the prepared graph has no labels to train on")
    if ctx.world_size > pg.N:
        raise ConfigError(f"{pg.path}: {ctx.world_size} ranks for N={pg.N} nodes")
    dt = {"float32": torch.float32, "float64": torch.float64}[cfg.dtype]
    esize = torch.tensor([], dtype=dt).element_size()
    sname = choose_strategy(cfg, pg, ctx.world_size, esize)
    comm = Comm.from_group(dist.group.WORLD, "rows", ledger)
    gps = cfg.model.name == "gps"
    grid = axis = None
    if gps and cfg.parallel.grid != "auto":
        from plexgt.dist.grid import build_groups

        grid = parse_grid(cfg.parallel.grid)
        check_world_size(grid, ctx.world_size)
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
