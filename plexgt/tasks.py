"""Bind a model name to its distributed implementation and this rank's data (``plexgt train``).

gcn: 3D tensor parallelism (Plexus) on a Gx x Gy x Gz grid, chosen by the planner when
``parallel.grid = "auto"``. gt and gps: node rows over the ranks with GP-AG or GP-A2A
attention (chosen by AGP when ``parallel.strategy = "auto"``); gps's GCN path runs 3D on an
explicit grid, and with ``parallel.grid = "auto"`` 1D or 3D on the planner's grid, whichever
AGP predicts faster (see :mod:`plexgt.parallel.gt_task`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from plexgt.config import ConfigError, TrainConfig
from plexgt.data.loader import PreparedGraph, check_grid
from plexgt.dist.bootstrap import DistContext
from plexgt.dist.collectives import CommLedger
from plexgt.dist.grid import Grid3D, build_groups, check_world_size, parse_grid
from plexgt.parallel.plexus_cost import Coefficients
from plexgt.train import Task

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def gcn_dims(cfg: TrainConfig, pg: PreparedGraph) -> list[int]:
    return [pg.F] + [cfg.model.hidden] * (cfg.model.layers - 1) + [pg.C]


def choose_grid(cfg: TrainConfig, pg: PreparedGraph, world_size: int,
                coef: Coefficients | None = None) -> Grid3D:
    """The configured grid, or the planner's fastest factorisation of the world size (``coef``:
    the machine coefficients, read from parallel.profile when not given)."""
    if cfg.parallel.grid != "auto":
        grid = parse_grid(cfg.parallel.grid)
        check_world_size(grid, world_size)
        return grid
    from plexgt.parallel.plexus_cost import rank_grids

    esize = torch.tensor([], dtype=DTYPES[cfg.dtype]).element_size()
    if coef is None:
        coef = plexus_coefficients(cfg)
    return rank_grids(world_size, pg.N, pg.E, gcn_dims(cfg, pg), esize, coef,
                      order=cfg.parallel.gcn_order)[0].grid


def machine_profile(cfg: TrainConfig) -> dict[str, Any] | None:
    """parallel.profile read and validated, or None when none is configured. Read once per
    task build and handed to every planner that needs it."""
    if not cfg.parallel.profile:
        return None
    from plexgt.profile import read_profile

    return read_profile(cfg.parallel.profile)


def plexus_coefficients(cfg: TrainConfig, prof: dict[str, Any] | None = None) -> Coefficients:
    """The 3D cost model's machine coefficients: from the profile (``prof``, else read from
    parallel.profile), or the defaults without one."""
    prof = prof if prof is not None else machine_profile(cfg)
    return Coefficients.from_profile(prof)


def build_gcn(cfg: TrainConfig, ctx: DistContext, pg: PreparedGraph, ledger: CommLedger) -> Task:
    from plexgt.models.gcn import GCN
    from plexgt.parallel.layout3d import layer_layouts
    from plexgt.parallel.plexus3d import (
        Plexus3DGCN,
        PlexusData,
        parallel_correct,
        parallel_cross_entropy,
        plexus_comms,
    )

    if pg.C < 1:
        raise ConfigError(f"{pg.path}: the prepared graph has no labels to train on")
    coef = plexus_coefficients(cfg)
    grid = choose_grid(cfg, pg, ctx.world_size, coef)
    check_grid(pg, grid, cfg.model.layers)
    dt = DTYPES[cfg.dtype]
    dims = gcn_dims(cfg, pg)
    lays = layer_layouts(grid, ctx.rank, pg.N, dims, cfg.parallel.gcn_order)
    comms = plexus_comms(build_groups(grid, ctx.rank, ctx.world_size), ledger, lays[-1])
    data = PlexusData(pg, lays, dt)
    block_rows = cfg.parallel.block_rows or None
    if block_rows is None:  # from the cost model, for the layer with the most to overlap
        from plexgt.parallel.plexus_cost import default_block_rows

        # from global sizes only: every rank of an all-reduce group must cut the same blocks
        esize = torch.tensor([], dtype=dt).element_size()
        picks = [default_block_rows(lay, pg.E // (lay.g[0] * lay.g[2]), esize, coef)
                 for lay in lays]
        block_rows = min((p for p in picks if p), default=None)
    model = Plexus3DGCN(lays, comms, data.adj, dropout=cfg.model.dropout,
                        input_dropout=cfg.model.input_dropout,
                        block_rows=block_rows, dtype=dt, seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    ref = GCN(pg.F, cfg.model.hidden, pg.C, num_layers=cfg.model.layers)
    model.load_full([(lin.weight, lin.bias) for lin in ref.layers])
    last = lays[-1]
    return Task(
        model=model.to(ctx.device),
        inputs=data.x.to(ctx.device),
        loss=lambda out: parallel_cross_entropy(out, data.labels, data.masks["train"], last,
                                                comms),
        correct=lambda out: parallel_correct(out, data.labels, data.masks, last, comms),
        ledger=ledger,
        grid=str(grid),
        strategy="plexus3d",
        bytes_read=data.bytes_read,
    )


def build_attention(cfg: TrainConfig, ctx: DistContext, pg: PreparedGraph,
                    ledger: CommLedger) -> Task:
    """gt and gps: nodes over the ranks, attention by GP-AG or GP-A2A (AGP when 'auto')."""
    from plexgt.parallel.gt_task import build_attention_task

    return build_attention_task(cfg, ctx, pg, ledger)


BUILDERS: dict[str, Callable[[TrainConfig, DistContext, PreparedGraph, CommLedger], Task]] = {
    "gcn": build_gcn,
    "gt": build_attention,
    "gps": build_attention,
}


def build_task(cfg: TrainConfig, ctx: DistContext, ledger: CommLedger) -> Task:
    if cfg.model.name not in BUILDERS:
        raise ConfigError(
            f"model '{cfg.model.name}' has no distributed implementation in plexgt train yet "
            f"(available: {', '.join(BUILDERS)})"
        )
    return BUILDERS[cfg.model.name](cfg, ctx, PreparedGraph(cfg.data), ledger)
