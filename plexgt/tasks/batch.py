"""Node-sequence models (layout 'batch') for ``plexgt train``: not wired into the loop yet.

The pieces exist single-process: the reference model (the registry's ``reference`` of the
model) and its sampler (:class:`plexgt.data.node_batches.NodeBatches`); the dp x pp x cp
layouts and the step loop over sequences (an epoch is many optimizer steps here, one in the
full-graph loop) are issue 38's next parts. Until then the builder checks what it can and
refuses with one line rather than training something else.
"""

from __future__ import annotations

from plexgt.config import TrainConfig
from plexgt.data.loader import PreparedGraph
from plexgt.data.node_batches import NodeBatches
from plexgt.distributed.bootstrap import DistContext
from plexgt.distributed.collectives import CommLedger
from plexgt.errors import ConfigError
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.tasks.task import Task, check_inputs


def build_batch_task(cfg: TrainConfig, ctx: DistContext, pg: PreparedGraph,
                     ledger: CommLedger, registry: StrategyRegistry | None = None,
                     inference: bool = False) -> Task:
    """ConfigError for now (module docstring), after the checks a run would make: labels,
    inputs, and a sampler that opens on the data (:class:`NodeBatches`)."""
    del ledger, registry, inference
    if pg.C < 1:
        raise ConfigError(f"{pg.path}: the prepared graph has no labels to train on")
    check_inputs(cfg, pg)
    NodeBatches(pg, cfg.batch, cfg.seed)
    if ctx.world_size > 1:
        raise ConfigError(f"config key 'model.name': {cfg.model.name} is not yet distributed "
                          f"(run on 1 rank, not {ctx.world_size})")
    raise ConfigError(f"config key 'model.name': {cfg.model.name} trains on node sequences, "
                      "which plexgt train's loop does not run yet (issue 38)")
