"""Configuration + this rank's context -> the :class:`~plexgt.tasks.task.Task` the loop runs.

One typed builder per model family: gcn on the 3D grid (:mod:`plexgt.tasks.gcn`), gt and gps
over node rows with a registered attention strategy (:mod:`plexgt.tasks.attention`). Every
layout choice is :mod:`plexgt.plan.choose`'s, the same call ``plexgt plan`` makes.
"""

from __future__ import annotations

from collections.abc import Callable

from plexgt.config import TrainConfig
from plexgt.data.loader import PreparedGraph
from plexgt.distributed.bootstrap import DistContext
from plexgt.distributed.collectives import CommLedger
from plexgt.errors import ConfigError
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.tasks.attention import build_attention_task
from plexgt.tasks.gcn import build_gcn_task
from plexgt.tasks.task import Task

Builder = Callable[[TrainConfig, DistContext, PreparedGraph, CommLedger,
                    StrategyRegistry | None], Task]
"""(config, context, prepared graph, ledger, attention strategies or None: the built-in
ones) -> the rank's Task."""

BUILDERS: dict[str, Builder] = {
    "gcn": build_gcn_task,
    "gt": build_attention_task,
    "gps": build_attention_task,
}


def build_task(cfg: TrainConfig, ctx: DistContext, ledger: CommLedger,
               registry: StrategyRegistry | None = None) -> Task:
    """The Task of ``cfg.model.name`` on this rank, reading ``cfg.data``; attention strategies
    from ``registry`` (default: the built-in ones)."""
    if cfg.model.name not in BUILDERS:
        raise ConfigError(
            f"model '{cfg.model.name}' has no distributed implementation in plexgt train yet "
            f"(available: {', '.join(BUILDERS)})"
        )
    return BUILDERS[cfg.model.name](cfg, ctx, PreparedGraph(cfg.data), ledger, registry)
