"""Node-sequence models (layout 'batch', hgt) for ``plexgt train``: the dp x pp x cp mesh.

* Layout (:func:`choose_layout`): parallel.dp / pp / cp / stages / micro_batches as
  configured; what is left 'auto' (0 for micro_batches) is the planner's choice, the one
  ``plexgt plan`` prints.
* Every rank opens its own sampler (:class:`~plexgt.data.node_batches.NodeBatches`) and
  builds the rows of the sequences it holds; the model of the rank is its stage's piece
  (:class:`~plexgt.parallel.batch_dist.HGTPipeline`), whose step runs GPipe and sums its
  gradients over the stage's copies. The loop clips and steps the optimizer.
* The Task's grid names the mesh ('dp2xpp2xcp1'), its strategy the schedule ('gpipe').
"""

from __future__ import annotations

import torch

from plexgt.config import TrainConfig
from plexgt.data.loader import PreparedGraph
from plexgt.data.node_batches import NodeBatches
from plexgt.distributed.bootstrap import DistContext
from plexgt.distributed.collectives import CommLedger
from plexgt.distributed.mesh import (
    Mesh,
    build_mesh_groups,
    check_batch,
    check_layout,
    meshes_for,
    partition,
)
from plexgt.errors import ConfigError, GridError
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.parallel.batch_dist import HGTPipeline, Layout
from plexgt.tasks.task import (
    AMP,
    DTYPES,
    Task,
    check_inputs,
    dataset_identity,
    dataset_name,
    model_spec,
    node_order,
    run_plan,
    task_metric,
)

SCHEDULE = "gpipe"
"""The pipeline schedule (the metrics' strategy)."""


def _fits(cfg: TrainConfig, mesh: Mesh) -> bool:
    """Whether ``mesh`` can run the configured batches and layers at all."""
    try:
        check_layout(cfg.batch.sequences, cfg.batch.size, cfg.model.layers, mesh.dp, mesh.pp,
                     mesh.cp, cfg.parallel.micro_batches or 1)
    except ConfigError:
        return False
    return True


def choose_layout(cfg: TrainConfig, pg: PreparedGraph, world: int,
                  device: torch.device | None = None) -> Layout:
    """The run's :class:`~plexgt.parallel.batch_dist.Layout` on ``world`` ranks: the config's
    fixed values, and for what it leaves 'auto' (0 for micro_batches) the planner's choice
    (:func:`~plexgt.tasks.task.run_plan`: the node-sequence search priced from
    ``parallel.profile``'s measured ``batch`` table when it has one, the quick calibration's
    or the default coefficients otherwise; the fixed keys are kept), which is what ``plexgt
    plan`` prints for the same config and ranks. One-line errors when the fixed keys cannot
    run (checked before any planning) or nothing fits the memory per rank."""
    par = cfg.parallel
    try:
        meshes = meshes_for(world, par.dp, par.pp, par.cp)
    except GridError as e:
        raise ConfigError(f"config keys 'parallel.dp/pp/cp': {e}") from None
    fitting = [m for m in meshes if _fits(cfg, m)]
    mesh = min(fitting or meshes, key=lambda m: (m.pp, m.cp))
    k = par.micro_batches or 1
    if not fitting or not open_keys(cfg):
        check_batch(cfg.batch.sequences, cfg.batch.size, mesh, k)  # the one-line error
        return Layout(mesh, partition(par.stages, cfg.model.layers, mesh.pp), k)
    if par.stages != "auto":
        partition(par.stages, cfg.model.layers, int(par.pp) if par.pp != "auto"
                  else len(par.stages.split(",")))  # a bad partition's one-line error first
    rp = run_plan(cfg, pg, world, device)
    dp, pp, cp = rp.mesh or (1, 1, 1)
    mesh = Mesh(dp, pp, cp)
    check_batch(cfg.batch.sequences, cfg.batch.size, mesh, rp.micro_batches)
    return Layout(mesh, partition(",".join(map(str, rp.stages)), cfg.model.layers, pp),
                  rp.micro_batches)


def open_keys(cfg: TrainConfig) -> list[str]:
    """The layout keys the config leaves to the planner."""
    par = cfg.parallel
    out = [k for k in ("dp", "pp", "cp", "stages") if getattr(par, k) == "auto"]
    return out + ([] if par.micro_batches else ["micro_batches"])


def build_batch_task(cfg: TrainConfig, ctx: DistContext, pg: PreparedGraph,
                     ledger: CommLedger, registry: StrategyRegistry | None = None,
                     inference: bool = False) -> Task:
    """This rank's Task of a node-sequence model: its stage of the mesh, its sampler, and
    the batch hooks the loop runs (``steps``, ``train_step``, ``evaluate``)."""
    del registry
    if inference:
        raise ConfigError(f"config key 'model.name': {cfg.model.name} has no inference path "
                          "yet (plexgt predict runs the full-graph models)")
    if pg.C < 1:
        raise ConfigError(f"{pg.path}: the prepared graph has no labels to train on")
    check_inputs(cfg, pg)
    if pg.sparse_features:
        raise ConfigError(f"{pg.path}: features stored sparse; {cfg.model.name} reads "
                          "dense feature rows (prep with --sparse-features no)")
    metric = task_metric(cfg, pg)
    if metric != "acc":
        raise ConfigError(f"config key 'metric': {cfg.model.name} reports accuracy; "
                          f"{pg.path} has binary labels (run with --metric accuracy)")
    nb = NodeBatches(pg, cfg.batch, cfg.seed)
    layout = choose_layout(cfg, pg, ctx.world_size, ctx.device)
    groups = build_mesh_groups(layout.mesh, ctx.rank, ctx.world_size, ctx.timeout)
    m = cfg.model
    kwargs = dict(in_dim=pg.F, hidden=m.hidden, out_dim=pg.C, num_layers=m.layers,
                  heads=m.heads, dropout=m.dropout, input_dropout=m.input_dropout,
                  ffn_mult=m.ffn_mult, seed=cfg.seed, global_nodes=cfg.batch.global_nodes,
                  num_nodes=pg.N, node_embedding=m.node_embedding)
    model = HGTPipeline(model_spec(cfg).reference, kwargs, layout, groups, nb, ledger,
                        ctx.device, DTYPES[cfg.dtype])

    def unused(_: torch.Tensor) -> torch.Tensor:
        raise TypeError("a node-sequence task runs train_step and evaluate")

    return Task(
        model=model,
        inputs=torch.zeros(0, device=ctx.device),
        loss=unused,
        correct=unused,  # type: ignore[arg-type]
        ledger=ledger,
        grid=str(layout.mesh),
        strategy=SCHEDULE,
        amp=AMP.get(cfg.dtype),
        metric=metric,
        node_order=node_order(pg) if m.node_embedding else "",
        dataset=dataset_identity(pg),
        dataset_name=dataset_name(pg),
        steps=lambda epoch: nb.steps("train"),
        train_step=model.train_step,
        evaluate=model.evaluate,
    )
