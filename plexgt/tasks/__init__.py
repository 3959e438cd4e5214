"""Configuration + this rank's context -> the :class:`~plexgt.tasks.task.Task` the loop runs.

One typed builder per model layout (the model's registry entry, :mod:`plexgt.models.spec`):
grid3d models (gcn, and the others of graph operators) on the 3D grid (:mod:`plexgt.tasks.gcn`),
attention models (gt, gps) over node rows with a registered attention strategy
(:mod:`plexgt.tasks.attention`), node-sequence models (:mod:`plexgt.tasks.batch`). Every
layout choice is :mod:`plexgt.plan.choose`'s, the same call ``plexgt plan`` makes.
"""

from __future__ import annotations

from collections.abc import Callable

from plexgt.config import TrainConfig
from plexgt.data.loader import PreparedGraph
from plexgt.distributed.bootstrap import DistContext
from plexgt.distributed.collectives import CommLedger
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.tasks.attention import build_attention_task
from plexgt.tasks.batch import build_batch_task
from plexgt.tasks.gcn import build_gcn_task
from plexgt.tasks.task import Task, model_spec

Builder = Callable[[TrainConfig, DistContext, PreparedGraph, CommLedger,
                    StrategyRegistry | None, bool], Task]
"""(config, context, prepared graph, ledger, attention strategies or None: the built-in
ones, inference: the layout planned for one forward pass) -> the rank's Task."""

BUILDERS: dict[str, Builder] = {
    "grid3d": build_gcn_task,
    "attention": build_attention_task,
    "batch": build_batch_task,
}
"""The task builder of each model layout (:data:`plexgt.models.spec.LAYOUTS`)."""


def build_task(cfg: TrainConfig, ctx: DistContext, ledger: CommLedger,
               registry: StrategyRegistry | None = None, inference: bool = False) -> Task:
    """The Task of ``cfg.model.name`` on this rank, reading ``cfg.data``; attention strategies
    from ``registry`` (default: the built-in ones); ``inference``: what the configuration
    leaves open is planned for one forward pass (``plexgt predict``), not a training step."""
    spec = model_spec(cfg)
    pg = PreparedGraph(cfg.data, split=cfg.split_index)  # its masks: the run's split
    return BUILDERS[spec.layout](cfg, ctx, pg, ledger, registry, inference)
