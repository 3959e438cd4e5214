"""gcn, and every grid3d model (:mod:`plexgt.models.spec`), for ``plexgt train``: 3D tensor
parallelism (Plexus) on a Gx x Gy x Gz grid.

The grid, layer order and aggregation blocks are the configured ones, or, where left open
(``parallel.grid = "auto"``, ``gcn_order = "auto"``, ``block_rows = 0``), the plan's
fastest on the job's ranks that fits the memory per rank (:func:`plexgt.tasks.task.
run_plan`, :func:`plexgt.plan.choose.choose`). Each rank reads
exactly its blocks (:func:`plexgt.data.loader.read_plexus_arrays`, driven by its layer
layouts); parameters are sharded as the layouts say, initialised from the single-process
reference (:class:`~plexgt.models.gcn.GCN`, or the model's) of the same seed so every grid
starts from the same model. A model's graph operators are each rank's blocks of them, derived
at load from the same pattern and degrees (:mod:`plexgt.parallel.operators`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from plexgt.config import TrainConfig
from plexgt.data.loader import PreparedGraph, check_grid, read_node_ids, read_plexus_arrays
from plexgt.distributed.bootstrap import DistContext
from plexgt.distributed.collectives import CommLedger
from plexgt.distributed.grid import build_groups
from plexgt.distributed.layout3d import LayerLayout
from plexgt.errors import ConfigError
from plexgt.models.gcn import op_widths
from plexgt.models.node_embedding import NodeEmbedding
from plexgt.models.spec import parameter_lists
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.parallel.node_embedding import WithNodeEmbedding
from plexgt.parallel.plexus3d import Plexus3DGCN, PlexusInputs, plexus_comms
from plexgt.parallel.plexus_loss import (
    parallel_binary_cross_entropy,
    parallel_correct,
    parallel_cross_entropy,
    parallel_scores,
)
from plexgt.plan.choose import ModelShape, gcn_chain
from plexgt.plan.plexus_cost import chain_layouts
from plexgt.tasks.limits import check_memory
from plexgt.tasks.task import (
    AMP,
    DTYPES,
    Task,
    check_inputs,
    dataset_identity,
    dataset_name,
    graph_sizes,
    model_spec,
    node_order,
    run_plan,
    task_metric,
)


def read_plexus_inputs(pg: PreparedGraph, layouts: Sequence[LayerLayout], dtype: torch.dtype,
                       operators: Sequence[str] = ("gcn",)) -> PlexusInputs:
    """This rank's blocks for ``layouts`` (one per layer), as tensors of ``dtype``, with each
    layer's block of every operator; the identity also reads the node ids of each layer's
    output rows (N/Gc int64 a layer)."""
    before = pg.bytes_read
    arrays = read_plexus_arrays(pg, layouts)
    out_ids = ([read_node_ids(pg, lay.out_order, lay.rows, lay.rows_pad) for lay in layouts]
               if "self" in operators else None)
    data = PlexusInputs.from_arrays(arrays, dtype, operators, out_ids)
    data.bytes_read = pg.bytes_read - before
    return data


def build_gcn_task(cfg: TrainConfig, ctx: DistContext, pg: PreparedGraph, ledger: CommLedger,
                   registry: StrategyRegistry | None = None, inference: bool = False) -> Task:
    """A :class:`Task` for a grid3d model (``model.name = "gcn"``, or another registered one
    of graph operators; ``registry`` unused: no attention; ``inference``: the layout planned
    for one forward pass)."""
    spec = model_spec(cfg)
    if pg.C < 1:
        raise ConfigError(f"{pg.path}: the prepared graph has no labels to train on")
    check_inputs(cfg, pg)
    check_memory(cfg, pg, ctx.world_size, ctx.device)
    metric = task_metric(cfg, pg)
    rp = run_plan(cfg, pg, ctx.world_size, ctx.device, inference=inference)
    grid = rp.grid  # gcn's plan always has one
    check_grid(pg, grid, cfg.model.layers)
    dt = DTYPES[cfg.dtype]
    emb = cfg.model.node_embedding
    sizes, shape = graph_sizes(pg, emb), ModelShape.of(cfg)
    ops = gcn_chain(sizes, shape)
    lays = chain_layouts(grid, ctx.rank, pg.N, op_widths(ops), rp.gcn_order,
                         pg.sparse_features, ops)
    groups = build_groups(grid, ctx.rank, ctx.world_size, ctx.timeout)
    comms = plexus_comms(groups, ledger, lays[-1])
    data = read_plexus_inputs(pg, lays, dt, spec.operators)
    model = Plexus3DGCN(lays, comms, data.adj, dropout=cfg.model.dropout,
                        input_dropout=cfg.model.input_dropout,
                        block_rows=rp.block_rows, dtype=dt,
                        # the tuned GEMM form is chosen by timing, which load can flip between
                        # a run and its resume: deterministic runs keep the plain product
                        tune_gemm=not cfg.deterministic,
                        seed=cfg.seed, node_ids=data.node_ids, ops=ops, arch=shape.gcn_arch,
                        out_ids=data.out_ids, names=parameter_lists(spec.operators),
                        checkpoint=cfg.model.checkpoint == "block")
    torch.manual_seed(cfg.seed)
    ref = spec.reference(pg.F + emb, cfg.model.hidden, pg.C, num_layers=cfg.model.layers,
                         arch=shape.gcn_arch)
    model.load_reference(ref.state_dict())
    if emb:
        model = WithNodeEmbedding(model, input_embedding(pg, lays[0], data.node_ids[0], emb,
                                                         cfg.seed, dt))
    last = lays[-1]
    labels, masks = data.labels.to(ctx.device), {k: m.to(ctx.device) for k, m in
                                                  data.masks.items()}
    lossf = parallel_binary_cross_entropy if pg.multilabel else parallel_cross_entropy
    return Task(
        model=model.to(ctx.device),
        inputs=data.x.to(ctx.device),
        loss=lambda out: lossf(out, labels, masks["train"], last, comms),
        correct=(lambda out: {}) if pg.multilabel else
        (lambda out: parallel_correct(out, labels, masks, last, comms)),
        metric=metric,
        scores=(lambda out: parallel_scores(out, labels, masks, last, comms))
        if metric == "rocauc" else None,
        ledger=ledger,
        grid=str(grid),
        strategy="plexus3d",
        bytes_read=data.bytes_read,
        amp=AMP.get(cfg.dtype),
        node_order=node_order(pg) if emb else "",
        dataset=dataset_identity(pg),
        dataset_name=dataset_name(pg),
        plan=rp,
    )


def input_embedding(pg: PreparedGraph, first: LayerLayout, ids: torch.Tensor, d: int,
                    seed: int, dtype: torch.dtype) -> NodeEmbedding:
    """This rank's block of the [N, D] node embedding: the rows of its layer-0 input block
    (Q order, ``first.cols``), the table columns among its input columns ``first.in_cols``
    (the input is [features F, embedding D]; columns past F + D are padding)."""
    r0, r1 = first.cols
    c0, c1 = first.in_cols
    lo, hi = max(c0, pg.F), min(c1, pg.F + d)
    return NodeEmbedding(ids[: max(0, r1 - r0)], lo - pg.F, max(0, hi - lo), lo - c0, seed,
                         r0, (pg.N, d), dtype)
