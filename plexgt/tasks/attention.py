"""gt / gps for ``plexgt train``: node rows over the ranks, attention by a registered strategy.

* Layout (:func:`plexgt.tasks.task.run_plan`, :func:`plexgt.plan.choose.choose`): the
  strategy ``parallel.strategy`` 'gp_ag', 'gp_a2a', 'gp_ring' or 'gp_2d' (head axis
  ``parallel.head_parallel``), its ring pieces and attention row blocks, and gps's GCN path
  (3D on an explicit ``parallel.grid``; with 'auto' on more than one rank, 1D or 3D on the
  3D planner's grid of the job): as configured, and where left open ('auto', 0) AGP's
  fastest on the job's ranks that fits the memory per rank. The Task's grid and strategy name the
  choice ('rows4', 'gp_ag'; '2x2x1', 'gp_ag+plexus3d').
* Each rank reads its rows of Q A Qᵀ (all rows for a head-partitioned strategy) and its
  node rows (:mod:`plexgt.data.loader`); the distributed operators are built from those
  arrays (:func:`plexgt.parallel.rows1d.build_dist_graph`).
* Parameters are replicated; :class:`~plexgt.parallel.rows1d.RowParallel` sums their
  gradients over the ranks in one all-reduce at the end of every backward.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import torch
import torch.distributed as dist

from plexgt.config import TrainConfig
from plexgt.data.loader import (
    PreparedGraph,
    read_adjacency_q,
    read_adjacency_q_edges,
    read_feature_block,
    read_node_ids,
    read_targets,
)
from plexgt.distributed.bootstrap import DistContext
from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.distributed.grid import block_bounds, build_groups
from plexgt.errors import ConfigError
from plexgt.models.node_embedding import NodeEmbedding
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.parallel.gps_dist import DistGPS
from plexgt.parallel.gt_dist import DistGraphTransformer
from plexgt.parallel.node_embedding import WithNodeEmbedding
from plexgt.parallel.redistribute import gcn3d_rows
from plexgt.parallel.rows1d import (
    DistGraph,
    RowData,
    RowParallel,
    build_dist_graph,
    row_binary_cross_entropy,
    row_correct,
    row_cross_entropy,
    row_scores,
)
from plexgt.plan.choose import RunPlan
from plexgt.tasks.devices import check_attention_kernels
from plexgt.tasks.limits import check_memory
from plexgt.tasks.task import (
    AMP,
    DTYPES,
    Task,
    check_inputs,
    dataset_identity,
    dataset_name,
    node_order,
    run_plan,
    task_metric,
)


def read_dist_graph(pg: PreparedGraph, comm: Comm, rp: RunPlan,
                    registry: StrategyRegistry | None = None,
                    dtype: torch.dtype = torch.float32,
                    setup_ledger: CommLedger | None = None,
                    axis_comms: dict[str, Comm] | None = None,
                    timeout: timedelta | None = None, edge_bias: bool = True) -> DistGraph:
    """Read what ``comm.rank``'s operators need for the plan ``rp`` and build them: its
    strategy (looked up in ``registry``, default the built-in one) on its head axis and ring
    pieces, its shape's heads and super nodes, and for gps the GCN path (3D on ``rp.grid``
    with the shape's aggregation blocks, over ``axis_comms``; else 1D)
    (:func:`~plexgt.parallel.rows1d.build_dist_graph` has the details); a strategy's own
    sub-groups are created here, collectively over ``comm``."""
    if rp.shape is None:
        raise ValueError("read_dist_graph needs a plan with its shape (plan.choose's)")
    strategy = (registry or default_registry()).get(rp.strategy)
    heads, super_nodes = rp.shape.heads, rp.shape.super_nodes
    gcn, grid, block_rows = rp.model == "gps", rp.grid, rp.shape.block_rows
    head_parallel, ring_chunks = rp.head_parallel, rp.ring_chunks
    rows = block_bounds(pg.N, comm.size, comm.rank)
    want = strategy.rows_held(pg.N, comm.size, comm.rank, head_parallel)
    edge_attr = None
    if pg.FE and edge_bias:  # the stored pattern read once, with its edges' features
        pattern, ef = read_adjacency_q_edges(pg, want)
        edge_attr = torch.from_numpy(ef).to(dtype)
    else:
        pattern = read_adjacency_q(pg, want)
    mine = pattern if want == rows else read_adjacency_q(pg, rows)
    held = pattern if want != rows else None
    groups = None
    if strategy.groups is not None:
        groups = strategy.groups(comm, head_parallel, comm.ledger, timeout)
    g3 = None
    if gcn and grid is not None:
        g3 = read_adjacency_q(pg, gcn3d_rows(grid, comm.rank, pg.N))
    graph = build_dist_graph(pg.N, mine, comm, strategy, heads, held=held, gcn=gcn,
                             dtype=dtype, setup_ledger=setup_ledger, grid=grid,
                             axis_comms=axis_comms, gcn3d_rows=g3, block_rows=block_rows,
                             groups=groups, head_parallel=head_parallel,
                             ring_chunks=ring_chunks, super_nodes=super_nodes,
                             edge_attr=edge_attr)
    ids = read_node_ids(pg, "Q", rows, -(-pg.N // comm.size))
    return dataclasses.replace(graph, node_ids=torch.from_numpy(ids))


def read_row_data(pg: PreparedGraph, p: int, i: int, dtype: torch.dtype = torch.float32,
                  embedding: int = 0) -> RowData:
    """Features, labels and split masks of block i of p (Q order), padded to ceil(N/p); the
    features widened by ``embedding`` zero columns (where a node embedding is added), or, when
    stored as CSR, kept sparse (a weighted [ceil(N/p), F] CSRGraph: the first layer's X·W is
    then an SpMM)."""
    rows = block_bounds(pg.N, p, i)
    n_loc = -(-pg.N // p)
    t = read_targets(pg, rows, "Q", n_loc)
    if pg.sparse_features:
        x = pg.read_features_csr(rows)
        x.resize((n_loc, pg.F))  # padding rows: empty
    else:
        w = pg.F + embedding
        x = read_feature_block(pg, rows, (0, w), (n_loc, w))
    return RowData.from_arrays(rows, x, t.labels, t.masks, dtype)


def build_attention_task(cfg: TrainConfig, ctx: DistContext, pg: PreparedGraph,
                         ledger: CommLedger, registry: StrategyRegistry | None = None,
                         inference: bool = False) -> Task:
    """A :class:`Task` for ``model.name`` 'gt' or 'gps', its strategy from ``registry``
    (default: the built-in strategies; ``inference``: the layout planned for one forward
    pass)."""
    if pg.C < 1:
        raise ConfigError(f"{pg.path}: the prepared graph has no labels to train on")
    if ctx.world_size > pg.N:
        raise ConfigError(f"{pg.path}: {ctx.world_size} ranks for N={pg.N} nodes")
    check_inputs(cfg, pg)
    check_memory(cfg, pg, ctx.world_size, ctx.device)
    check_attention_kernels(cfg, ctx.device)
    dt = DTYPES[cfg.dtype]
    metric = task_metric(cfg, pg)
    comm = Comm.from_group(dist.group.WORLD, "rows", ledger)
    gps = cfg.model.name == "gps"
    rp = run_plan(cfg, pg, ctx.world_size, ctx.device, registry, inference)
    sname, grid, head_axis = rp.layout
    axis = None
    if grid is not None:
        groups = build_groups(grid, ctx.rank, ctx.world_size, ctx.timeout)
        axis = {a: Comm.from_group(g, a, ledger) for a, g in groups.axis.items()}
    before = pg.bytes_read
    strategy = (registry or default_registry()).get(sname)
    graph = read_dist_graph(pg, comm, rp, registry, dt, axis_comms=axis, timeout=ctx.timeout,
                            edge_bias=cfg.model.edge_bias).to(ctx.device)
    emb = cfg.model.node_embedding
    data = read_row_data(pg, ctx.world_size, ctx.rank, dt, emb).to(ctx.device)
    torch.manual_seed(cfg.seed)  # identical replicated parameters on every rank
    cls = DistGPS if gps else DistGraphTransformer
    model = cls(pg.F + emb, cfg.model.hidden, pg.C, num_layers=cfg.model.layers,
                heads=cfg.model.heads, dropout=cfg.model.dropout,
                input_dropout=cfg.model.input_dropout, ffn_mult=cfg.model.ffn_mult,
                seed=cfg.seed, super_nodes=cfg.model.super_nodes,
                edge_dim=pg.FE if cfg.model.edge_bias else 0,
                block_rows=rp.attention_block_rows or None, norm=cfg.model.norm_kind(True),
                pre_norm=cfg.model.pre_norm, jk=cfg.model.jk,
                checkpoint=cfg.model.checkpoint == "block").to(dt)
    lossf = row_binary_cross_entropy if pg.multilabel else row_cross_entropy
    wrapped: torch.nn.Module = RowParallel(model, graph, comm)
    if emb:
        lo, hi = data.rows
        wrapped = WithNodeEmbedding(wrapped, NodeEmbedding(
            graph.node_ids[: hi - lo], 0, emb, pg.F, cfg.seed, lo, (pg.N, emb), dt))
    return Task(
        model=wrapped.to(ctx.device),
        inputs=data.x,
        loss=lambda out: lossf(out, data.labels, data.masks["train"], comm),
        correct=(lambda out: {}) if pg.multilabel else
        (lambda out: row_correct(out, data.labels, data.masks, comm)),
        metric=metric,
        scores=(lambda out: row_scores(out, data.labels, data.masks, comm))
        if metric == "rocauc" else None,
        ledger=ledger,
        grid=str(grid) if grid is not None else f"rows{ctx.world_size}",
        strategy=strategy.label(ctx.world_size, head_axis)
        + ("+plexus3d" if grid is not None else ""),
        bytes_read=pg.bytes_read - before,
        amp=AMP.get(cfg.dtype),
        node_order=node_order(pg) if emb else "",
        dataset=dataset_identity(pg),
        dataset_name=dataset_name(pg),
        plan=rp,
    )
