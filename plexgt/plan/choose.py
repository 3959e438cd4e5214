"""The one place a run's layout is chosen: :func:`choose`.

``plexgt train`` (on its ranks) and ``plexgt plan`` (on any scale up to the job's) both call
it, so the two never disagree. It plans from sizes alone (:class:`GraphSizes`,
:class:`ModelShape`): a user plans papers100M before preparing it, and a prepared directory
only contributes its manifest's numbers. What the configuration leaves open is searched,
what it fixes is kept:

* gcn: grid, layer order and aggregation blocks (:func:`plexgt.plan.search.search_gcn`),
  priced on the stored pattern's nonzeros E (prep stores the self loops GCN adds, unless
  told not to).
* gt / gps: strategy, gp_2d's head axis, ring pieces, attention row blocks and, for gps, the
  GCN path 1D or 3D on the 3D planner's grid of each scale, priced on the nonzeros of A + I
  (the path adds self loops) (:func:`plexgt.plan.search_attention.search_attention`).
* node-sequence models (layout 'batch'): data-parallel replicas, pipeline stages and their
  layer partition, context-parallel ranks and micro-batches
  (:func:`plexgt.plan.batch_search.search_batch`), priced on the batch's sizes, not the graph's
  edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from plexgt.config import BatchConfig, TrainConfig
from plexgt.distributed.grid import Grid3D, check_world_size, parse_grid
from plexgt.errors import ConfigError
from plexgt.models.gcn import GCNArch, GCNOp, gcn_ops, op_widths
from plexgt.models.registry import default_registry as model_registry
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.strategy import AttentionStrategy, StrategyRegistry
from plexgt.plan.agp import Estimate, SystemModel, Workload, gcn_grid_for
from plexgt.plan.balance import Balance
from plexgt.plan.batch_cost import step_seconds
from plexgt.plan.batch_fits import BatchProfile, default_profile
from plexgt.plan.batch_search import BatchSearch, search_batch
from plexgt.plan.batch_shape import BatchShape
from plexgt.plan.batch_table import from_table
from plexgt.plan.plexus_cost import (
    Coefficients,
    PlexusEstimate,
    comm_split,
    group_extent,
    group_stride,
)
from plexgt.plan.search import GcnSearch, search_gcn
from plexgt.plan.search_attention import AttentionSearch, search_attention


@dataclass(frozen=True)
class GraphSizes:
    """The numbers of a graph a plan needs (a prepared manifest's, or typed by the user)."""

    n: int
    """Nodes N."""
    e: int
    """Stored edges E (self loops included when prep added them)."""
    features: int
    """Input feature width F."""
    classes: int
    """Classes C (at least 1 for planning)."""
    self_loops: bool = True
    """Whether E already holds one self loop per node (prep's default)."""
    feature_density: float | None = None
    """Share of nonzero input features when they are stored (and trained) sparse; None:
    dense."""
    balance: Balance = field(default_factory=Balance, compare=False)
    """How evenly the stored pattern's blocks hold its nonzeros (a prepared manifest's
    counts, :meth:`~plexgt.plan.balance.Balance.from_manifest`; typed sizes: the stated
    default): every layout's busiest rank is priced by it."""

    @property
    def gcn_path_nnz(self) -> int:
        """Nonzeros of A + I, which GPS's GCN path builds from the attention pattern."""
        return self.e + (0 if self.self_loops else self.n)


@dataclass(frozen=True)
class ModelShape:
    """The model and numeric sizes a plan prices."""

    name: str
    """'gcn', 'gt' or 'gps'."""
    hidden: int
    """Hidden width d."""
    layers: int
    """Layers (gcn) or blocks (gt, gps)."""
    heads: int = 4
    """Attention heads (gt, gps)."""
    ffn_mult: int = 2
    """FFN width multiplier (gt, gps)."""
    esize: int = 4
    """Bytes per element of activations."""
    gcn_order: str = "auto"
    """GCN layer order (gcn): 'auto', 'aggregate_first' or 'gemm_first'."""
    block_rows: int | None = None
    """Rows per aggregation block; None: from the cost model."""
    ring_chunks: int = 1
    """Pieces a ring strategy's K/V blocks travel in; 0: the plan's."""
    super_nodes: int = 0
    """Global super nodes (gt, gps)."""
    trained_input: bool = False
    """The input is trained (a node embedding): gcn's layer 0 communicates its gradient."""
    attention_block_rows: int = 0
    """Strategies without a ring: query rows per attention block; 0: the plan's (whole unless
    the memory needs blocks)."""
    axis_order: str = "auto"
    """The grid's rank order, innermost axis first; 'auto': the plan's."""
    norm: str = "auto"
    """``model.norm`` ('auto': the model's own, :attr:`norm_kind`)."""
    pre_norm: bool = False
    """Pre-norm layers or blocks."""
    jk: str = "none"
    """Jumping knowledge ('none', 'cat', 'max', 'sum')."""
    residual: str = "none"
    """grid3d models: residual connections ('none', 'identity', 'linear')."""
    input_proj: bool = False
    """grid3d models: an input Linear before the first graph layer."""
    head: bool = False
    """grid3d models: a linear classifier after the last graph layer."""
    init: str = "torch"
    """grid3d models: the graph layers' initialisation ('torch', 'glorot')."""
    inference: bool = False
    """Price one forward pass (``plexgt predict``, ``plan --inference``) instead of a
    training step: no autograd graph, gradients or optimizer state, each layer's activations
    freed as the next consumes them, so a layout may fit that training's does not."""
    checkpoint: bool = False
    """Activation checkpointing per block (``model.checkpoint = 'block'``; a training
    step's: ``inference`` has no backward to recompute for, and ignores it)."""
    batch: BatchConfig | None = None
    """Node-sequence models: the step's sequences (their sizes, not the graph's edges, set
    the cost); None for the full-graph models."""
    embedding: int = 0
    """Columns D of a node-embedding table (``model.node_embedding``)."""
    mesh_fixed: tuple[tuple[str, Any], ...] = ()
    """Node-sequence models: the layout keys the config fixes (dp, pp, cp, stages,
    micro_batches; the others are searched)."""

    @classmethod
    def of(cls, cfg: TrainConfig, inference: bool = False) -> ModelShape:
        """The planners' view of a run's configuration: the one place the config's model and
        layout keys become a shape (``plexgt train``, ``plexgt predict`` with
        ``inference`` and ``plexgt plan`` all come here)."""
        m, par = cfg.model, cfg.parallel
        spec = model_registry().get(m.name)
        name = spec.planned_as  # gcn prices every 3D-grid model
        batch = cfg.batch if spec.layout == "batch" else None
        return cls(name, m.hidden, m.layers, m.heads, m.ffn_mult, cfg.esize,
                   par.gcn_order, par.block_rows or None, par.ring_chunks, m.super_nodes,
                   m.node_embedding > 0, par.attention_block_rows, par.axis_order,
                   m.norm_kind(spec.attention), m.pre_norm, m.jk, m.residual, m.input_proj,
                   m.head, m.init, inference, m.checkpoint == "block", batch,
                   m.node_embedding, mesh_fixed(cfg) if batch is not None else ())

    @property
    def norm_kind(self) -> str:
        """The norm with 'auto' resolved: 'layer' for gt and gps, 'none' for gcn."""
        if self.norm != "auto":
            return self.norm
        return "none" if self.name == "gcn" else "layer"

    @property
    def gcn_arch(self) -> GCNArch:
        """The grid3d models' options, as the reference takes them."""
        return GCNArch(self.input_proj, self.head, self.residual, self.norm_kind,
                       self.pre_norm, self.jk, self.init)


def mesh_fixed(cfg: TrainConfig) -> tuple[tuple[str, Any], ...]:
    """The node-sequence layout keys a config fixes: ``parallel.dp/pp/cp`` and ``stages``
    other than 'auto', ``micro_batches`` other than 0 (parsed: the config check has
    refused what does not parse)."""
    par = cfg.parallel
    out: list[tuple[str, Any]] = [(k, int(getattr(par, k))) for k in ("dp", "pp", "cp")
                                  if getattr(par, k) != "auto"]
    if par.stages != "auto":
        out.append(("stages", tuple(int(x) for x in par.stages.split(","))))
    if par.micro_batches:
        out.append(("micro_batches", par.micro_batches))
    return tuple(out)


def batch_shape(sizes: GraphSizes, shape: ModelShape) -> BatchShape:
    """A node-sequence model's sizes for :mod:`plexgt.plan.batch_shape` (the input width
    without the embedding's columns, which it counts apart)."""
    b = shape.batch
    assert b is not None
    return BatchShape(shape.layers, shape.hidden, shape.heads, b.size, b.sequences,
                      sizes.features - shape.embedding, sizes.classes, shape.ffn_mult,
                      b.global_nodes,
                      b.targets, sizes.n if shape.embedding else 0, shape.embedding,
                      shape.esize)


def gcn_chain(sizes: GraphSizes, shape: ModelShape) -> list[GCNOp]:
    """A GCN's ops (:func:`plexgt.models.gcn.gcn_ops`): input Linear, GCN layers, classifier
    as ``shape`` has them."""
    return gcn_ops(sizes.features, shape.hidden, max(1, sizes.classes), shape.layers,
                   shape.gcn_arch)


def gcn_dims(sizes: GraphSizes, shape: ModelShape) -> list[int]:
    """Widths of a GCN's layers (ops), input to output: [F, d, ..., d, C]."""
    return op_widths(gcn_chain(sizes, shape))


def resolve_grid(text: str, world_size: int, axis_order: str = "auto") -> Grid3D | None:
    """An explicit 'GxxGyxGz' (with its ':order', else ``axis_order`` when not 'auto')
    checked against the world size, or None for 'auto'."""
    if text == "auto":
        return None
    grid = parse_grid(text)
    if ":" not in text and axis_order != "auto":
        grid = grid.with_order(axis_order)
    check_world_size(grid, world_size)
    return grid


def workload(sizes: GraphSizes, shape: ModelShape, grid: Grid3D | None = None) -> Workload:
    """AGP's view of a gt / gps step (``grid``: gps's 3D GCN path, else 1D; ring chunks 0,
    'the plan's', as 1)."""
    gps = shape.name == "gps"
    return Workload(shape.name, sizes.n, sizes.e, sizes.features, max(1, sizes.classes),
                    shape.hidden, shape.heads, shape.layers, shape.ffn_mult, shape.esize,
                    gcn_grid=grid if gps else None,
                    gcn_block_rows=shape.block_rows if gps else None,
                    ring_chunks=shape.ring_chunks or 1, super_nodes=shape.super_nodes,
                    attention_block_rows=shape.attention_block_rows,
                    feature_density=sizes.feature_density, norm=shape.norm_kind,
                    pre_norm=shape.pre_norm, jk=shape.jk, inference=shape.inference,
                    checkpoint=shape.checkpoint, balance=sizes.balance)


def candidates(strategy: str, registry: StrategyRegistry | None = None
               ) -> list[AttentionStrategy]:
    """The strategies a choice may take: every registered one for 'auto', else that one."""
    reg = registry or default_registry()
    if strategy == "auto":
        return list(reg)
    if strategy not in reg:
        raise ConfigError(f"parallel.strategy: unknown {strategy!r}; known: auto, "
                          f"{', '.join(reg.names())}")
    return [reg.get(strategy)]


class Layout(NamedTuple):
    """A gt / gps run's attention layout: the strategy, gps's 3D GCN grid (None: the 1D path
    or gt), and gp_2d's head axis a (1 for every other strategy)."""

    strategy: str
    grid: Grid3D | None = None
    head_parallel: int = 1


def check_head_axis(cands: list[AttentionStrategy], world_size: int, head_parallel: int
                    ) -> None:
    """ConfigError when a configured head axis cannot tile the ranks for a candidate that
    has one (strategies without a head axis ignore ``parallel.head_parallel``)."""
    for c in cands:
        try:
            c.check_head_axis(world_size, head_parallel)
        except ValueError:
            raise ConfigError(f"parallel.head_parallel: {head_parallel} does not divide the "
                              f"{world_size} ranks") from None


def gps_grid(sizes: GraphSizes, shape: ModelShape, s: int, coef: Coefficients) -> Grid3D:
    """The 3D planner's grid of s ranks for GPS's GCN path (one d -> d layer)."""
    return gcn_grid_for(s, sizes.n, sizes.gcn_path_nnz, shape.hidden, shape.esize, coef)


# -- the one choice -----------------------------------------------------------------------
@dataclass(frozen=True)
class RunPlan:
    """A run's whole layout, as :func:`choose` decides it for both ``plexgt train`` and
    ``plexgt plan``."""

    model: str
    scale: int
    """Ranks it runs on."""
    grid: Grid3D | None = None
    """gcn: its grid; gps: the 3D GCN path's (None: the 1D path); gt: None."""
    strategy: str = ""
    """gt / gps: the attention strategy."""
    head_parallel: int = 1
    """gp_2d: the head axis a."""
    ring_chunks: int = 1
    """gp_ring / gp_2d: pieces of each K/V block."""
    attention_block_rows: int = 0
    """gp_ag / gp_a2a: attention query rows per block (0: whole)."""
    gcn_order: str = "auto"
    """gcn: the layer order."""
    block_rows: int | None = None
    """gcn: aggregation rows per block (None: whole)."""
    mesh: tuple[int, int, int] | None = None
    """Node-sequence models: (dp, pp, cp), data-parallel replicas of pipeline stages of
    context-parallel ranks."""
    micro_batches: int = 0
    """Node-sequence models: GPipe micro-batches per step."""
    stages: tuple[int, ...] = ()
    """Node-sequence models: layers per pipeline stage."""
    time_s: float = 0.0
    """Predicted seconds per training step."""
    memory_bytes: int = 0
    """Predicted peak bytes per rank."""
    label: str = ""
    """The searched configuration's name ('2x2x4 gemm_first block_rows=whole',
    'gp_2d 2x8 chunks=2 gcn 3d 2x2x4')."""
    split: tuple[tuple[str, float], ...] = ()
    """Where the predicted step's seconds go: compute, and each collective by axis with where
    its groups sit (gcn), or the attention step's compute, copies, per-call costs and
    collectives (gt / gps): so a user sees why this configuration."""
    shape: ModelShape | None = None
    """The model it was priced for (the config's, :meth:`ModelShape.of`): what a reader of the
    plan needs beyond the layout (heads, super nodes, aggregation blocks), so it takes the
    plan whole instead of a dozen loose arguments."""
    coefficients: str = ""
    """Where the machine coefficients it was priced with came from (a profile, the host's
    quick calibration, the defaults), as a plan's reader is told."""

    @property
    def layout(self) -> Layout:
        return Layout(self.strategy, self.grid, self.head_parallel)


class Choice(NamedTuple):
    """:func:`choose`'s answer: the plan, and the search behind it (every scale's best, the
    time-memory frontier, what was priced and pruned)."""

    plan: RunPlan
    search: GcnSearch | AttentionSearch | BatchSearch


def gcn_split(est: PlexusEstimate, coef: Coefficients) -> tuple[tuple[str, float], ...]:
    """A 3D step's seconds: compute, then each axis's collectives with their placement."""
    topo, g = coef.topology, est.grid
    out = [("compute (SpMM and GEMM, calibrated)", est.compute_s)]
    for axis, op, t in comm_split(est.traffic, g, coef):
        size, stride = group_extent(g, axis), group_stride(g, axis)
        where = (topo.group(size, stride).describe() if topo is not None
                 else f"{size} ranks stride {stride}")
        out.append((f"{op} over {axis}: {where}", t))
    return tuple(out)


def attention_split(est: Estimate) -> tuple[tuple[str, float], ...]:
    """A gt / gps step's seconds as AGP prices them."""
    return (("compute (attention kernels, dense blocks, GCN path: α·E)", est.compute_s),
            ("layout copies", est.copy_s), ("per-call costs", est.calls_s),
            (f"collectives ({est.comm_bytes / 1e6:.4g} MB sent by the busiest rank)",
             est.comm_s))


class NothingFits(ConfigError):
    """No configuration fits the memory per rank: the one line says the limit, the ranks and
    the least memory per rank any priced configuration needs."""

    least_memory: tuple[int, int] | None = None
    """(bytes per rank, scale) of the configuration that needs the least, or None when the
    search priced nothing."""


def choose(sizes: GraphSizes, shape: ModelShape, world_size: int, sysm: SystemModel,
           coef: Coefficients, memory_per_rank: int | None = None, strategy: str = "auto",
           grid: str = "auto", head_parallel: int = 0, any_scale: bool = False,
           registry: StrategyRegistry | None = None,
           batch_table: dict[str, Any] | None = None) -> Choice:
    """The fastest predicted configuration that fits ``memory_per_rank``, searched over what
    the configuration leaves open ('auto' grid and strategy, head_parallel 0, gcn_order
    'auto', block rows / ring chunks / attention block rows 0): on exactly ``world_size``
    ranks (what a run of that many ranks can take), or on any s <= world_size with
    ``any_scale`` (what ``plexgt plan`` reports). gcn: :func:`~plexgt.plan.search.
    search_gcn`; gt / gps: :func:`~plexgt.plan.search_attention.search_attention`. A
    configuration given whole is priced, not checked against the memory: the user's call.
    ``shape.inference`` prices one forward pass instead of a training step (``plexgt
    predict``'s, so it may choose fewer ranks a layer than training did).

    Node-sequence models are priced from ``batch_table`` (a system profile's measured
    ``batch`` table, :func:`~plexgt.plan.batch_table.from_table`) when there is one.

    Raises :class:`NothingFits` (a ConfigError) when nothing fits."""
    if shape.batch is not None:
        prof = None if not batch_table else from_table(batch_table, batch_shape(sizes, shape),
                                                       sysm.host)
        return choose_batch_layout(sizes, shape, world_size, sysm, memory_per_rank, any_scale,
                                   prof)
    fixed = resolve_grid(grid, world_size, shape.axis_order)
    scales = None if any_scale and fixed is None else [world_size]
    if shape.name == "gcn":
        open_ = fixed is None or shape.gcn_order == "auto" or not shape.block_rows
        found = search_gcn(sizes.n, sizes.e, gcn_dims(sizes, shape), shape.esize, coef,
                           world_size, memory_per_rank if open_ else None, shape.gcn_order,
                           scales, input_grad=shape.trained_input,
                           input_density=sizes.feature_density, grid=fixed,
                           block_rows=shape.block_rows, axis_order=shape.axis_order,
                           ops=gcn_chain(sizes, shape), norm=shape.norm_kind,
                           inference=shape.inference, checkpoint=shape.checkpoint,
                           balance=sizes.balance)
        c = found.chosen
        if c is None:
            raise _none_fits(memory_per_rank, world_size, any_scale, found.least_memory)
        return Choice(RunPlan("gcn", c.scale, c.grid, gcn_order=c.order,
                              block_rows=c.block_rows, time_s=c.est.time_s,
                              memory_bytes=c.est.memory_bytes, label=c.label,
                              split=gcn_split(c.est, coef), shape=shape), found)
    w = workload(sizes, shape)
    cands = candidates(strategy, registry)
    check_head_axis(cands, world_size, head_parallel)
    vary = (shape.ring_chunks == 0, shape.attention_block_rows == 0)
    gps3 = None
    if shape.name == "gps" and world_size > 1:
        gps3 = (lambda s: fixed) if fixed is not None else (
            lambda s: gps_grid(sizes, shape, s, coef))
    whole = (strategy != "auto" and (head_parallel or cands[0].head_axes is None)
             and not any(vary)
             and (shape.name != "gps" or fixed is not None))
    found = search_attention(w, cands, world_size, sysm, None if whole else memory_per_rank,
                             scales, head_parallel, gps3, refine=any_scale, vary=vary,
                             only_3d=fixed is not None)
    c = found.chosen
    if c is None:
        raise _none_fits(memory_per_rank, world_size, any_scale, found.least_memory)
    return Choice(RunPlan(shape.name, c.scale, c.gcn_grid, c.strategy, c.head_parallel,
                          c.ring_chunks, c.block_rows, time_s=c.est.time_s,
                          memory_bytes=c.memory_bytes, label=c.label,
                          split=attention_split(c.est), shape=shape), found)


def choose_batch_layout(sizes: GraphSizes, shape: ModelShape, world_size: int,
                        sysm: SystemModel, memory_per_rank: int | None = None,
                        any_scale: bool = False, profile: BatchProfile | None = None
                        ) -> Choice:
    """A node-sequence model's layout on ``world_size`` ranks (``any_scale``: on any power of
    two up to it, or it): the fastest fitting (dp, pp, cp, K, partition) of
    :func:`~plexgt.plan.batch_search.search_batch`, priced with ``profile`` (default: counted
    from ``sysm``'s rates)."""
    bs = batch_shape(sizes, shape)
    prof = profile or default_profile(bs, sysm)
    limit = float("inf") if memory_per_rank is None else memory_per_rank
    scales = [world_size]
    if any_scale:
        scales = sorted({2**i for i in range(world_size.bit_length()) if 2**i <= world_size}
                        | {world_size})
    best: tuple[int, BatchSearch] | None = None
    least: tuple[int, int] | None = None
    for p in scales:
        found = search_batch(bs, p, prof, limit, dict(shape.mesh_fixed) if p == world_size
                             or not shape.mesh_fixed else _fixed_at(shape, p))
        if found.least_memory is not None and (least is None or found.least_memory < least[0]):
            least = (found.least_memory, p)
        if found.best is not None and (best is None or found.best.step_s
                                       < best[1].best.step_s):  # type: ignore[union-attr]
            best = (p, found)
    if best is None:
        raise _none_fits(memory_per_rank, world_size, any_scale, least)
    p, found = best
    c = found.best
    assert c is not None
    cost = step_cost_parts(bs, prof, c)
    return Choice(RunPlan(shape.name, p, mesh=(c.dp, c.pp, c.cp), micro_batches=c.micro_batches,
                          stages=c.stages, time_s=c.step_s, memory_bytes=c.peak_bytes,
                          label=c.label, split=cost, shape=shape, coefficients=prof.source),
                  found)


def _fixed_at(shape: ModelShape, p: int) -> dict[str, Any]:
    """The fixed layout keys that a smaller scale p can still take (a fixed extent that does
    not divide p is left to the search there)."""
    return {k: v for k, v in shape.mesh_fixed if k in ("stages", "micro_batches")
            or p % int(v) == 0}


def step_cost_parts(bs: BatchShape, prof: BatchProfile, c: Any) -> tuple[tuple[str, float],
                                                                          ...]:
    """Where a node-sequence step's predicted seconds go: the pipeline's slots (bubbles
    included) and the rest (the sequences built before it, the gradient all-reduce and the
    optimizer after it)."""
    sc = step_seconds(bs, prof, c.mesh, c.stages)
    k, pp = c.micro_batches, c.pp
    return ((f"pipeline: the {pp} stages' micro-batch times summed + ({k} - 1 micro-batches) "
             f"x the slowest stage's {sc.slot_s:.4g} s (ring exchanges and p2p included)",
             sc.pipeline_s),
            ("building the replica's sequences, the gradient all-reduce over the stage group "
             "and the optimizer", sc.tail_s))


def _none_fits(limit: int | None, world_size: int, any_scale: bool,
               least: tuple[int, int] | None) -> NothingFits:
    where = f"on up to {world_size} ranks" if any_scale else f"on {world_size} ranks"
    if limit is None:
        return NothingFits(f"no configuration {where}")
    need = "" if least is None else (f"; the least any needs is {least[0] / 2**30:.3g} GiB "
                                     f"per rank, on {least[1]} ranks")
    err = NothingFits(f"no configuration fits {limit / 2**30:.2f} GiB per rank {where} (the "
                      f"memory model's prediction{need}; parallel.memory_per_rank_gb sets "
                      "the limit)")
    err.least_memory = least
    return err


def smallest_fitting_world(sizes: GraphSizes, shape: ModelShape, above: int, most: int,
                           sysm: SystemModel, coef: Coefficients, memory_per_rank: int,
                           strategy: str = "auto", head_parallel: int = 0,
                           registry: StrategyRegistry | None = None) -> RunPlan | None:
    """The plan on the fewest ranks in (above, most] that fits ``memory_per_rank``, or None:
    what to ask for when a job of ``above`` ranks has no configuration that fits. Doubling
    finds a world size that fits, then bisection the least; it assumes that more ranks need
    no more memory each (true of every layout's shards; a world size whose only grids are
    lopsided can break it, so the answer is the least the bisection met)."""

    def at(p: int) -> RunPlan | None:
        try:
            return choose(sizes, shape, p, sysm, coef, memory_per_rank, strategy,
                          head_parallel=head_parallel, registry=registry).plan
        except NothingFits:
            return None
        except ConfigError:  # a configured head axis that does not tile p ranks
            return None

    lo, hi, found = above, above, None
    while found is None and hi < most:
        lo, hi = hi, min(most, 2 * hi)
        found = at(hi)
    if found is None:
        return None
    while hi - lo > 1:  # lo does not fit, hi does
        mid = (lo + hi) // 2
        got = at(mid)
        if got is None:
            lo = mid
        else:
            hi, found = mid, got
    return found
