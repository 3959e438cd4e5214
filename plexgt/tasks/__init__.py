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
from plexgt.tasks.attention import build_attention_task
from plexgt.tasks.gcn import build_gcn_task
from plexgt.tasks.task import Task

Builder = Callable[[TrainConfig, DistContext, PreparedGraph, CommLedger], Task]

BUILDERS: dict[str, Builder] = {
    "gcn": build_gcn_task,
    "gt": build_attention_task,
    "gps": build_attention_task,
}


def build_task(cfg: TrainConfig, ctx: DistContext, ledger: CommLedger) -> Task:
    """The Task of ``cfg.model.name`` on this rank, reading ``cfg.data``."""
    if cfg.model.name not in BUILDERS:
        raise ConfigError(
            f"model '{cfg.model.name}' has no distributed implementation in plexgt train yet "
            f"(available: {', '.join(BUILDERS)})"
        )
    return BUILDERS[cfg.model.name](cfg, ctx, PreparedGraph(cfg.data), ledger)
