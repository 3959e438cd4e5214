"""Cost of a 3D tensor-parallel GCN step: bytes per rank per axis (exact), time, memory.

The byte formulas (:mod:`plexgt.plan.plexus_bytes`, re-exported here) use the collectives'
own per-rank formulas, operation by operation, so the ledger of a real run equals
:func:`plexus_step_bytes` to the byte (tests check it). Time adds
profiled coefficients: SpMM seconds per call, per output row·column and per nonzero·column
(the busiest block's, :mod:`plexgt.plan.balance`), GEMM seconds per multiply-add, and per
axis a latency and a seconds-per-byte (see :class:`Coefficients`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from plexgt.distributed.collectives import all_reduce_bytes, reduce_scatter_bytes
from plexgt.distributed.grid import Grid3D, factorizations
from plexgt.distributed.layout3d import LayerLayout, row_blocks
from plexgt.models.gcn import GCNOp, jk_hops, layer_widths
from plexgt.parallel.attention.strategy import INDEX_BYTES, graph_bytes
from plexgt.plan.balance import Balance
from plexgt.plan.host import Host, across_group_sizes
from plexgt.plan.placement import Topology
from plexgt.plan.plexus_bytes import (  # noqa: F401 - re-exported: the byte formulas' home before
    chain_bytes,
    chain_layouts,
    hop_bytes,
    layer_bytes,
    loss_bytes,
    norm_bytes,
    plexus_step_bytes,
    row1d_step_bytes,
)


@dataclass(frozen=True)
class Coefficients:
    """Machine coefficients for the time model (measured by ``plexgt profile``)."""

    spmm_s_per_nnz_col: float = 2e-9
    """SpMM seconds per (nonzero x dense column)."""
    gemm_s_per_fma: float = 1e-10
    """GEMM seconds per multiply-add."""
    spmm_s_per_call: float = 0.0
    """SpMM seconds per call (launch, its output's allocation): what a rank pays whatever
    its share (0 for a profile that did not fit it: then per nonzero only)."""
    spmm_s_per_row_col: float = 0.0
    """SpMM seconds per output row x dense column (its output's writes, the row pointers):
    what does not shrink with the nonzeros of a sparse block."""
    latency_s: float = 2e-5
    """Seconds per collective call (at group sizes the profile did not measure)."""
    s_per_byte: float = 1e-9
    """Seconds per byte sent by one rank (at group sizes the profile did not measure)."""
    collectives: tuple[tuple[str, int, float, float], ...] = ()
    """(operation, group size, latency s, seconds per byte) as the profile fitted them: each
    call of a step is priced on its own operation's fit at its group's size (a reduce-scatter
    over 2 ranks is not an all-gather over the whole node)."""
    host: Host = field(default_factory=Host)
    """The node's sharing: κ(s), the threads of CPU ranks fewer than the cores, time-shared
    collectives and the per-call cost of a collective between busy phases."""
    topology: Topology | None = None
    """Where a machine's ranks sit (a machine description's placement): collectives priced by
    their group's size and stride, so the grid's axis order matters. None (a measured
    profile of one node): by group size alone."""
    compute_scale: float = 1.0
    """Measured over predicted compute of whole one-rank GCN training steps (the profile's
    ``gcn_step`` samples, :func:`gcn_step_calibration`): what the SpMM and GEMM rates, timed
    alone on hot caches, leave out of a step (its elementwise passes, the loss, AdamW, the
    sparse products' transposes on cold operands)."""
    _fits: Any = field(init=False, repr=False, compare=False)
    _prices: Any = field(init=False, repr=False, compare=False)

    @classmethod
    def from_profile(cls, prof: dict[str, Any] | None) -> Coefficients:
        """A system profile's (``plexgt profile``) coefficients, or the defaults without one:
        its four fitted numbers, the per-group-size collective fits, the node's sharing and
        the whole-step calibration."""
        if not prof:
            return cls()
        table = tuple((op, int(g), float(f["latency_s"]), float(f["s_per_byte"]))
                      for op, by in sorted((prof.get("collective_fits") or {}).items())
                      if op in LAYER_OPS for g, f in sorted(by.items(), key=lambda x: int(x[0])))
        topo = Topology.from_dict(prof["placement"]) if prof.get("placement") else None
        coef = cls(**prof["plexus"], collectives=table, host=Host.from_profile(prof),
                   topology=topo)
        steps = (prof.get("kernels") or {}).get("gcn_step")
        return replace(coef, compute_scale=gcn_step_calibration(coef, steps or []))

    def __post_init__(self) -> None:
        fits: dict[str, dict[int, tuple[float, float]]] = {}  # op -> g -> (latency, s/byte)
        for op, g, lat, spb in self.collectives:
            fits.setdefault(op, {})[g] = (lat, spb)
        object.__setattr__(self, "_fits", fits)
        object.__setattr__(self, "_prices", {})

    def price(self, op: str, g: int, p: int, stride: int = 1) -> tuple[float, float]:
        """(seconds per call, seconds per byte) of one ``op`` over g of a job's p ranks whose
        members are ``stride`` ranks apart: with a :attr:`topology`, its placement's latency
        and bandwidth; else the per-call parts (latency, the loaded wait) at :meth:`~plexgt.
        plan.host.Host.call_group` and the bytes at g's rate time-shared (:meth:`~plexgt.
        plan.host.Host.bytes_time`).
        Remembered per (op, g, p, stride): a search prices ~10^6 calls over a few dozen."""
        key = (op, g, p, stride)
        got = self._prices.get(key)
        if got is None:
            if self.topology is not None and g > 1:
                got = self.topology.call(op, g, stride)
            else:
                got = (self.host.per_call_time(lambda q: self.call(op, q)[0], g, p),
                       self.host.bytes_time(self.call(op, g)[1], p))
            self._prices[key] = got
        return got

    def call(self, op: str, g: int) -> tuple[float, float]:
        """(latency s, seconds per byte) of one ``op`` over g ranks: its profiled fits
        across group sizes (:func:`~plexgt.plan.host.across_group_sizes`: the latency grows
        with a ring's steps beyond the largest group, the bandwidth does not), else the
        global pair."""
        if g <= 1:
            return 0.0, 0.0
        fits = self._fits.get(op)
        if not fits:
            return self.latency_s, self.s_per_byte
        lat = across_group_sizes(fits, g, lambda q: fits[q][0], lambda q: fits[q][0])
        return lat, across_group_sizes(fits, g, lambda q: fits[q][1], lambda q: 0.0)


def gcn_step_calibration(coef: Coefficients, steps: list[list[float]]) -> float:
    """Median over ``steps`` ([N, E, F, C, hidden, layers, density, seconds]: one-rank GCN
    training steps, density 0 for a dense input) of measured over predicted compute on
    ``coef`` uncalibrated, at the profiled thread count. 1.0 with fewer than two samples: one
    step alone, a disturbed one, would rescale every term at every scale."""
    base = replace(coef, compute_scale=1.0, host=Host())
    ratios = []
    for n, e, f, c, hidden, layers, density, t in steps:
        dims = layer_widths(int(f), int(hidden), int(c), int(layers))
        pred = rank_cost(Grid3D(1, 1, 1), 0, int(n), int(e), dims, 4, base,
                         input_density=density or None).compute_s
        if pred > 0:
            ratios.append(t / pred)
    return float(statistics.median(ratios)) if len(ratios) >= 2 else 1.0


LAYER_OPS = ("all_gather", "reduce_scatter", "all_reduce")
"""The collectives a 3D layer and its loss issue (the profile's other fits are not read)."""


#: resident bytes of a rank before any data (interpreter, torch, MPI, gloo buffers)
PROCESS_BASE_BYTES = 350 << 20


Traffic = tuple[tuple[str, str, int, int], ...]
"""(group, op, calls, bytes) of one rank's step, summed per group (an axis; a norm's plane,
'xy') and operation."""


@dataclass(frozen=True)
class PlexusEstimate:
    grid: Grid3D
    bytes_per_rank: int
    """Max over ranks of bytes sent per step."""
    comm_s: float
    compute_s: float
    memory_bytes: int
    """Max over ranks: process base, adjacency blocks, activations, parameters and Adam."""
    traffic: Traffic = ()
    """What the step sends, by axis and operation (:func:`comm_split` prices it)."""

    @property
    def time_s(self) -> float:
        return self.comm_s + self.compute_s


def comm_split(traffic: Traffic, grid: Grid3D, coef: Coefficients
               ) -> list[tuple[str, str, float]]:
    """(axis, op, seconds) of a step's collectives on ``grid`` (its extents and axis order:
    where each axis's groups sit, so what they cost)."""
    p = grid.size
    out = []
    for axis, op, calls, nbytes in traffic:
        per_call, per_byte = coef.price(op, group_extent(grid, axis), p,
                                        group_stride(grid, axis))
        out.append((axis, op, calls * per_call + nbytes * per_byte))
    return out


def reorder(est: PlexusEstimate, order: str, coef: Coefficients) -> PlexusEstimate:
    """``est`` on the same grid with ranks numbered in axis order ``order``: the same
    computation, bytes and memory; only the collectives' prices move."""
    grid = est.grid.with_order(order)
    comm = sum(t for _, _, t in comm_split(est.traffic, grid, coef))
    return replace(est, grid=grid, comm_s=comm)


def estimate(grid: Grid3D, n: int, nnz: int, dims: list[int], esize: int,
             coef: Coefficients, block_rows: int | None = None, order: str = "auto",
             input_grad: bool = False, input_density: float | None = None,
             ops: list[GCNOp] | None = None, norm: str = "none", inference: bool = False,
             checkpoint: bool = False, balance: Balance | None = None) -> PlexusEstimate:
    """Predicted step time and memory of ``grid`` (``inference``: one forward pass,
    :func:`rank_cost`; ``input_grad``: layer 0's input is trained, a node embedding;
    ``input_density``: the input is CSR-stored with this share of nonzeros, its layer-0 GEMM
    an SpMM priced by it; ``ops``, ``norm``, ``checkpoint``: the GCN's options,
    :func:`rank_cost`; ``balance``: how unevenly the grid's adjacency blocks hold the
    nonzeros, the busiest block priced)."""
    # every rank prices the same: blocks are padded to equal shapes (ceil(N/G) rows, padded
    # widths), so bytes, calls, FMAs and memory depend on the grid's extents, not on which
    # block a rank holds (the tests check rank_cost over every rank); one rank stands for
    # all, which keeps a search over every factorisation of every scale fast
    rc = rank_cost(grid, 0, n, nnz, dims, esize, coef, block_rows, order, input_grad,
                   input_density, ops, norm, inference, checkpoint, balance)
    return PlexusEstimate(grid, rc.nbytes, rc.comm_s, rc.compute_s, rc.mem, rc.traffic)


class RankCost(NamedTuple):
    """One rank's step as :func:`estimate` prices it."""

    nbytes: int
    """Bytes sent."""
    calls: int
    """Collective calls (of any bytes)."""
    compute_s: float
    """SpMM and GEMM seconds, calibrated, at this scale's κ and threads."""
    mem: int
    """Peak bytes."""
    comm_s: float
    """Collective seconds: each call at its group's latency, the loaded per-call cost and
    its bytes (time-shared when CPU ranks outnumber the cores), each group placed by the
    grid's axis order."""
    traffic: Traffic = ()
    """The same calls and bytes by axis and operation."""
    memory: MemoryParts | None = None
    """``mem`` by what holds it."""


class MemoryParts(NamedTuple):
    """A rank's peak bytes (:class:`RankCost` ``mem``) by what holds them."""

    base: int
    """The process before any data (:data:`PROCESS_BASE_BYTES`)."""
    graph: int
    """The adjacency blocks (and the identity's: residuals, jumping knowledge's hops), with
    their transposes for backward; jumping knowledge's hops' working sets and stack."""
    inputs: int
    """The task's input features (:func:`input_bytes`)."""
    parameters: int
    """The weights' shards, their gradients and AdamW's two moments (the shards alone for
    inference)."""
    activations: int
    """What a step creates beyond the gradients: the tensors every layer keeps for its
    backward, and the largest layer's working set at its peak moment (the forward's or the
    backward's)."""

    @property
    def total(self) -> int:
        return self.base + self.graph + self.inputs + self.parameters + self.activations


def group_extent(grid: Grid3D, name: str) -> int:
    """Ranks in the group ``name``: a grid axis ('x') or plane ('xy')."""
    out = 1
    for axis in name:
        out *= grid.dim(axis)
    return out


def group_stride(grid: Grid3D, name: str) -> int:
    """Rank distance between the nearest members of the group ``name`` (an axis, or a plane:
    its inner axis's stride, the placement a plane's collective is priced at)."""
    return min(grid.stride(axis) for axis in name)


def rank_cost(grid: Grid3D, r: int, n: int, nnz: int, dims: list[int], esize: int,
              coef: Coefficients, block_rows: int | None = None, order: str = "auto",
              input_grad: bool = False, input_density: float | None = None,
              ops: list[GCNOp] | None = None, norm: str = "none", inference: bool = False,
              checkpoint: bool = False, balance: Balance | None = None) -> RankCost:
    """Rank ``r``'s step (:class:`RankCost`), as :func:`estimate` prices it (``ops``,
    ``norm``: a GCN with :class:`~plexgt.models.gcn.GCNArch` options, ``dims`` its
    :func:`~plexgt.models.gcn.op_widths`). ``checkpoint``: every op a checkpointed block,
    which keeps its input shard alone until backward runs its forward again: activations of
    the inputs plus the largest block's, one more forward's SpMMs, GEMMs and collectives.

    ``inference``: one forward under ``torch.inference_mode`` (``plexgt predict``) instead
    of a training step: the forward's collectives and FMAs alone; no transposed Â blocks
    (``drop_backward`` frees them), weights without gradients or AdamW's moments, and only
    the largest layer's live activations (no autograd graph keeps the others) plus the
    input shard and the logits shard being written. No backward: ``checkpoint`` is moot.

    Compute is the busiest rank's: each conv layer's SpMM on the largest adjacency block of
    the layer's [Gc x Ga] split of A1 / A2 (``balance``; without it, the stated default of
    :mod:`plexgt.plan.balance`), per call, per output row·column and per nonzero·column,
    each layer's collectives waiting for it. Bytes and calls are rank ``r``'s (equal on
    every rank: blocks are padded to equal shapes); memory too, but with the fullest
    adjacency block's CSR (the peak that must fit is the busiest rank's), by part
    (:class:`MemoryParts`); a training step's activations are its peak moment: what the
    layers before one keep, beside that layer's forward working set, its aggregation's
    forward or backward, or its input gradient's reduce-scatter, as the live tensors of a
    step count them (tests/mpi/test_plexus_peak_memory.py)."""
    checkpoint = checkpoint and not inference
    bal = balance or Balance()
    sparse = input_density is not None
    lays = chain_layouts(grid, r, n, dims, order, sparse, ops)
    host, p = coef.host, grid.size
    nbytes, calls, flops_s, mem, comm = 0, 0, 0.0, 0, 0.0
    params = 0  # the weights' shards, their gradients and Adam's moments (in ``mem``)
    # activations: every layer's kept tensors (checkpointing: its input alone; inference:
    # none) and the largest layer's rest, its working set (checkpointing: recomputed, one
    # at a time; inference: all of it, each layer's freed as the next consumes it)
    kept, largest, peak = 0, 0, 0
    resident = input_bytes(lays[0], esize, input_density)
    # gloo, the CPU ranks' backend, reduce-scatters a copy of its input (counted by the
    # live tensors of a step)
    staged = host.device == "cpu"
    adj_copies = 1 if inference else 2  # Â's CSR block, and its transpose for backward
    w_copies = 1 if inference else 4  # W shard, and its gradient and Adam's two moments
    traffic: dict[tuple[str, str], list[int]] = {}
    for name, op, b in chain_bytes(lays, esize, block_rows, input_grad, sparse, ops, norm,
                                   checkpoint, forward_only=inference):
        if b:
            nbytes += b
            calls += 1
            per_call, per_byte = coef.price(op, group_extent(grid, name), p,
                                            group_stride(grid, name))
            comm += per_call + b * per_byte
            t = traffic.setdefault((name, op), [0, 0])
            t[0] += 1
            t[1] += b
    for lay in lays:
        op = None if ops is None else ops[lay.layer]
        ga, gb, gc = lay.g
        rows_pad, cols_pad = lay.rows_pad, lay.cols_pad  # properties: computed once here
        din_b, dout_a, dout_ab = lay.d_in // gb, lay.d_out // ga, lay.d_out // (ga * gb)
        # a node-wise layer's operator is the identity's block: N/(Ga·Gc) entries
        # the busiest rank's block: the mean times the split's imbalance (conv layers)
        blk_nnz = (nnz * bal.imbalance(lay.matrix, gc, ga) if lay.kind == "conv" else n
                   ) / (ga * gc)
        # the input shard, or its staging copy for the all-gather over c (layer 0's own
        # shard is the task's, in ``resident``)
        shard = cols_pad * lay.d_in // (gb * gc)
        w_shard = lay.d_in // (gb * gc) * dout_a * esize  # [d_in/(Gb·Gc), d_out/Ga]
        mem += int(blk_nnz * 12 * adj_copies)  # 8-byte index + 4-byte value
        params += w_shard * w_copies
        act = 0  # the layer's activations (what checkpointing drops)
        if lay.order == "gemm_first":
            # the SpMM runs forward and backward on d_out/Gb columns; GEMM on input rows;
            # per call and per output row·column: the forward's rows_pad, the backward's
            # (Âᵀ·dY) cols_pad
            spmm = blk_nnz * (lay.d_out // gb) * 2
            spmm_fixed = (2 * coef.spmm_s_per_call + (rows_pad + cols_pad) * (lay.d_out // gb)
                          * coef.spmm_s_per_row_col)
            gemm = cols_pad * din_b * lay.d_out * (3 if lay.layer else 2)
            if sparse and lay.layer == 0:
                # a CSR input's X·W and Xᵀ·dY are SpMMs over its nonzeros, d_out columns
                spmm += 2 * cols_pad * din_b * input_density * lay.d_out
                gemm = 0
            # the forward's share: one SpMM of two, one GEMM of three (of two on layer 0)
            # (and its SpMM's one call, on rows_pad output rows)
            fwd = (spmm / 2 * coef.spmm_s_per_nnz_col
                   + gemm / (3 if lay.layer else 2) * coef.gemm_s_per_fma
                   + coef.spmm_s_per_call
                   + rows_pad * (lay.d_out // gb) * coef.spmm_s_per_row_col)
            # the forward's moments up to the aggregation (counted by the live tensors of a
            # step): the input gathered over c [cols_pad, d_in/Gb] beside its transposed
            # staging copy (where c splits it; else the input itself, kept by the layer
            # before or the task's; a sparse input is read already gathered, ``resident``);
            # the gathered input beside the whole W block [d_in/Gb, d_out], H·W
            # [cols_pad, d_out] and, where b splits it, its transposed staging copy, gloo's
            # (CPU ranks) and the reduce-scatter's result (and, as aggregate_first's, the
            # staging copy gloo's worker may still hold)
            gathered = cols_pad * din_b if gc > 1 and not (sparse and lay.layer == 0) else 0
            hw = cols_pad * lay.d_out
            act += max(shard + gathered if gathered else 0,
                       gathered + (shard if gathered and staged else 0) + din_b * lay.d_out
                       + hw + ((1 + staged) * hw + hw // gb if gb > 1 else 0)) * esize
            # the aggregation's backward (its peak moment on every grid counted here, by
            # the live tensors of a step): dY [rows_pad, d_out/(Ga·Gb)], its all-gather over
            # a [Ga·rows_pad, ·], the gathered rows reordered to [rows_pad, d_out/Gb] (a
            # copy where a splits, one row block at a time) and Âᵀ·dY's three
            # [cols_pad, d_out/Gb]: dT, the SpMM's product and the zeros it adds to. On a
            # grid that splits the rows over a (x at layer 0) the gathered and reordered
            # dY are N rows each, which nothing else of the step reaches
            # (a residual's T is stacked under H·W: Âᵀ·dY on twice the rows)
            dout_b = lay.d_out // gb
            step = max(r1 - r0 for r0, r1 in row_blocks(rows_pad, block_rows))
            res_rows = 2 if op is not None and op.residual != "none" else 1
            back = (rows_pad * dout_ab + rows_pad * dout_b + (step * dout_b if ga > 1 else 0)
                    + 3 * res_rows * cols_pad * dout_b) * esize
            # and its forward's: T [cols_pad, d_out/Gb] (and, where b splits, H·W
            # [cols_pad, d_out] it was reduce-scattered from, which the layer holds until it
            # returns), the output [rows_pad, d_out/(Ga·Gb)], a row block's Â·T with the
            # zeros the SpMM adds to or, where a splits, every block's product reordered by
            # column block for the reduce-scatter, which gloo (CPU ranks) reduces in a copy
            # of its own
            forward = (res_rows * cols_pad * (dout_b + (lay.d_out if gb > 1 else 0))
                       + rows_pad * dout_ab + step * dout_b
                       + (rows_pad * dout_b * (1 + staged) if ga > 1 else step * dout_b)
                       ) * esize
        else:
            spmm = blk_nnz * din_b * (2 if lay.layer > 0 else 1)
            spmm_fixed = ((2 if lay.layer > 0 else 1) * coef.spmm_s_per_call
                          + (rows_pad + (cols_pad if lay.layer > 0 else 0)) * din_b
                          * coef.spmm_s_per_row_col)
            gemm = rows_pad * din_b * dout_a * 3
            fwd = (blk_nnz * din_b * coef.spmm_s_per_nnz_col + gemm / 3 * coef.gemm_s_per_fma
                   + coef.spmm_s_per_call + rows_pad * din_b * coef.spmm_s_per_row_col)
            # the forward's moments (counted by the live tensors of a step): the input
            # gathered over c [cols_pad, d_in/Gb] beside its transposed staging copy (where c
            # splits it; else the input itself, kept by the layer before or the task's);
            # the aggregate Z [rows_pad, d_in/Gb] (twice the rows beside a residual's
            # identity) beside the gathered input and a row block's SpMM product with the
            # zeros it adds to; Z beside the partial product [rows_pad, d_out/Ga], its
            # transposed staging copy and gloo's (CPU ranks) for the reduce-scatter over b,
            # and its result. gloo's worker may hold a gather's staging copy into the next
            # op (a run sees it there or not): counted there
            res_rows = 2 if op is not None and op.residual != "none" else 1
            step = max(r1 - r0 for r0, r1 in row_blocks(res_rows * rows_pad, block_rows))
            gathered = cols_pad * din_b if gc > 1 else 0
            z = res_rows * rows_pad * din_b
            act += max(shard + gathered if gc > 1 else 0,
                       gathered + (shard if gathered and staged else 0) + z
                       + 2 * step * din_b,
                       z + rows_pad * dout_a * (1 + (1 + staged if gb > 1 else 0))
                       + rows_pad * dout_ab) * esize
            # the aggregation's backward, once the GEMM's has freed what it kept: dZ and its
            # copy [rows_pad, d_in/Gb] (twice the rows beside a residual's identity), and
            # Âᵀ·dZ's three [cols_pad, d_in/Gb]: dH, the SpMM's product and its zeros (none
            # where the input needs no gradient: dense features, layer 0)
            back = (2 * z + 3 * cols_pad * din_b) * esize if lay.layer > 0 or input_grad \
                else 0
            forward = 0
        # the input's gradient reduce-scattered over c (the gather's adjoint), once the
        # layer's own backward has freed what it kept: dX [cols_pad, d_in/Gb], its
        # transposed staging copy, gloo's copy of that, and the [·, d_in/(Gb·Gc)] result
        grads_in = lay.layer > 0 or input_grad
        gather_back = ((2 + staged) * cols_pad * din_b + cols_pad * din_b // gc) * esize \
            if gc > 1 and grads_in and not (sparse and lay.layer == 0) else 0
        if op is not None and op.residual != "none":
            # the residual path: the identity's block beside Â's, its weight (a learned one
            # with its gradient and Adam's moments), and its operands as the conv's
            eye = n / (ga * gc)
            mem += int(eye * 12 * adj_copies)
            params += w_shard * w_copies if op.residual == "linear" else 0
            fwd += eye * (lay.d_out // gb if lay.order == "gemm_first" else din_b) * \
                coef.spmm_s_per_nnz_col + (cols_pad * din_b * lay.d_out if lay.order ==
                                           "gemm_first" else rows_pad * din_b * dout_a
                                           ) * coef.gemm_s_per_fma
            if lay.order == "gemm_first":
                spmm += eye * (lay.d_out // gb) * 2
                gemm += cols_pad * din_b * lay.d_out * 3
                act += (din_b * lay.d_out + cols_pad * lay.d_out
                        + cols_pad * lay.d_out // gb) * esize
            else:
                spmm += eye * din_b * 2
                gemm += rows_pad * din_b * dout_a * 3
                act += rows_pad * din_b * esize
            if op.pre_act:  # the raw input gathered on its own
                act += 2 * cols_pad * din_b * esize
            act += rows_pad * dout_ab * esize  # the sum
        # what autograd keeps of the layer until its backward (the rest of ``act`` lives
        # while the layer runs): the GEMM's input (the aggregate, aggregate_first; the
        # gathered input, gemm_first, a tensor of its own only where c splits it, and the
        # raw input beside it, pre-norm residual), the ReLUs' outputs, the norms' normalised
        # values (below)
        raw = op is not None and op.residual != "none" and op.pre_act
        if lay.order == "gemm_first":
            gathered = gc > 1 and not (sparse and lay.layer == 0)
            held = cols_pad * din_b * ((1 + raw) if gathered else raw)
        else:
            held = rows_pad * din_b * (2 if op is not None and op.residual != "none" else 1)
        post = op.post_act if op is not None else lay.layer < len(lays) - 1
        held = (held + (cols_pad * lay.d_in // (gb * gc) if op is not None and op.pre_act
                        else 0) + (rows_pad * dout_ab if post else 0)) * esize
        for j, at in (() if op is None else
                      ((op.pre_norm, lays[lay.layer - 1]), (op.post_norm, lay))):
            if j is not None and norm != "none":
                # the normalised values kept for backward and the norm's output
                width = (lay.d_in // (gb * gc) if at is not lay else dout_ab)
                act += 2 * at.rows_pad * width * esize
                held += at.rows_pad * width * esize
        if inference:  # the forward's FMAs; nothing kept for a backward
            flops_s += fwd
            largest = max(largest, act)
            continue
        flops_s += spmm * coef.spmm_s_per_nnz_col + spmm_fixed + gemm * coef.gemm_s_per_fma
        # the backward's moment comes once the ReLU's backward has replaced its output
        # by dY (counted in ``back``)
        relu = rows_pad * dout_ab * esize if post else 0
        if not checkpoint:
            # the layer's moments beside what the layers before it keep: its forward's
            # working set, its aggregation's forward and backward (gemm_first: beside the
            # gathered input the GEMM's backward still needs), its input gradient's
            # reduce-scatter; then it keeps its own
            held = min(held, act)
            during = held - relu if lay.order == "gemm_first" else 0
            peak = max(peak, kept + act, kept + held - relu + forward, kept + during + back,
                       kept + gather_back)
            kept += held
            continue
        # the block's input shard stays (checkpoint's saved input; the working sets above
        # hold no copy of it); the rest is rebuilt in backward, one block at a time, and its
        # backward runs beside what it keeps
        inp = cols_pad * lay.d_in // (gb * gc) * esize
        kept += inp
        largest = max(largest, act, min(held, act) - relu + max(forward, back), gather_back)
        flops_s += fwd
    for path in ({} if ops is None else jk_hops(ops)).values():
        for m in path:
            # a hop: its identity block, gathered input (staged), aggregate, partial
            # product and output; the combined layers, side by side or stacked
            lay = lays[m]
            ga, gb, gc = lay.g
            din_b, dout_a = lay.d_in // gb, lay.d_out // ga
            eye = n / (ga * gc)
            mem += int(eye * 24) + (2 * lay.cols_pad * din_b + lay.rows_pad * din_b
                                    + lay.rows_pad * dout_a + lay.rows_pad * dout_a // gb
                                    ) * esize
            flops_s += (eye * din_b * coef.spmm_s_per_nnz_col + lay.rows_pad * din_b * dout_a
                        * coef.gemm_s_per_fma) * (1 if inference else 2)
    if ops is not None and any(op.jk for op in ops):
        head = lays[-1]
        mem += 2 * head.cols_pad * head.d_in // (head.g[1] * head.g[2]) * esize
    if not (inference or checkpoint):  # the step's peak moment, or the loss's
        kept, largest = max(peak, kept), 0
    if inference:
        # the last layer's logits shard, which predict's all-to-all reads and sends (the
        # input is the task's, ``resident``)
        last = lays[-1]
        kept = last.rows_pad * last.d_out // (last.g[0] * last.g[1]) * esize
    parts = MemoryParts(PROCESS_BASE_BYTES, mem, resident, params,
                        kept + largest)
    flops_s *= coef.compute_scale * host.compute_factor(p)
    return RankCost(nbytes, calls, flops_s, parts.total, comm,
                    tuple((a, op, c, b) for (a, op), (c, b) in traffic.items()), parts)


def input_bytes(first: LayerLayout, esize: int, density: float | None = None) -> int:
    """The task's input features on a rank, there before a step and after it: the dense
    shard [N/Ga, d_in/(Gb·Gc)] of layer 0's layout; or, CSR-stored (``density``: the share
    of nonzeros), the block [N/Ga, d_in/Gb] read already gathered over c, used both ways
    (X·W, Xᵀ·dT), so with its transpose and index caches as a
    :class:`~plexgt.ops.csr.CSRGraph` keeps them (:func:`graph_bytes`) but one edge
    permutation (the transpose's own, which only attention builds), and both value arrays:
    40 + 2·esize bytes a nonzero, measured on Coauthor Physics' blocks."""
    ga, gb, gc = first.g
    if density is None:
        return first.cols_pad * first.d_in // (gb * gc) * esize
    cols = first.d_in // gb
    nnz = int(first.cols_pad * cols * density)
    return graph_bytes(first.cols_pad, cols, nnz) - nnz * INDEX_BYTES + 2 * nnz * esize


def rank_grids(world_size: int, n: int, nnz: int, dims: list[int], esize: int,
               coef: Coefficients, memory_limit: int | None = None, order: str = "auto",
               input_grad: bool = False, input_density: float | None = None
               ) -> list[PlexusEstimate]:
    """Every factorisation of ``world_size``, fastest first (those over ``memory_limit`` last)."""
    ests = [estimate(g, n, nnz, dims, esize, coef, order=order, input_grad=input_grad,
                     input_density=input_density)
            for g in factorizations(world_size)]
    return sorted(ests, key=lambda e: (memory_limit is not None and e.memory_bytes > memory_limit,
                                       e.time_s))


def layout_block_rows(layouts: list[LayerLayout], nnz: int, esize: int, coef: Coefficients
                      ) -> int | None:
    """One rows-per-block for a model's layers: the cost model's pick for the layer with the
    most to overlap (the smallest), from global sizes only, so every rank of an all-reduce
    group cuts the same blocks."""
    picks = [default_block_rows(lay, nnz // (lay.g[0] * lay.g[2]), esize, coef)
             for lay in layouts if lay.kind == "conv"]
    return min((p for p in picks if p), default=None)


def default_block_rows(lay: LayerLayout, block_nnz: int, esize: int, coef: Coefficients,
                       max_blocks: int = 64) -> int | None:
    """Rows per aggregation block that minimise the modelled layer-aggregation time.

    With k blocks the pipeline costs about max(S, C) + min(S, C)/k + k·latency, where S is the
    block's SpMM time and C its all-reduce (gemm_first: reduce-scatter) time over a: the
    optimum is k = sqrt(min(S, C) / latency). None (one block) when nothing is to be
    overlapped (Ga = 1).
    """
    ga, gb, _ = lay.g
    if ga == 1 or lay.rows_pad == 0:
        return None
    if lay.order == "gemm_first":  # blocks are reduce-scattered, on d_out/Gb columns
        cols = lay.d_out // gb
        nbytes = reduce_scatter_bytes(lay.rows_pad * cols * esize, ga)
    else:
        cols = lay.d_in // gb
        nbytes = all_reduce_bytes(lay.rows_pad * cols * esize, ga)
    spmm = block_nnz * cols * coef.spmm_s_per_nnz_col
    comm = nbytes * coef.s_per_byte
    k = max(1, min(max_blocks, int(round((min(spmm, comm) / coef.latency_s) ** 0.5))))
    return -(-lay.rows_pad // k)
