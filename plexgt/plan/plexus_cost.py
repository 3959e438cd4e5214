"""Cost of a 3D tensor-parallel GCN step: bytes per rank per axis (exact), time, memory.

The byte formulas use the collectives' own per-rank formulas, operation by operation, so the
ledger of a real run equals :func:`plexus_step_bytes` to the byte (tests check it). Time adds
profiled coefficients: SpMM seconds per nonzero·column, GEMM seconds per multiply-add, and per
axis a latency and a seconds-per-byte (see :class:`Coefficients`).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from plexgt.distributed.collectives import all_gather_bytes, all_reduce_bytes, reduce_scatter_bytes
from plexgt.distributed.grid import Grid3D, factorizations
from plexgt.distributed.layout3d import LayerLayout, layer_layouts, output_plane, row_blocks
from plexgt.models.gcn import GCNOp, jk_hops, layer_widths
from plexgt.parallel.attention.strategy import graph_bytes
from plexgt.parallel.norms import batch_norm_comm, layer_norm_comm
from plexgt.plan.balance import Balance
from plexgt.plan.host import Host, across_group_sizes
from plexgt.plan.placement import Topology


def hop_bytes(lay: LayerLayout, esize: int, block_rows: int | None
              ) -> list[tuple[str, str, int]]:
    """(axis role, op, bytes sent) of a jumping-knowledge hop (aggregate_first, a constant
    identity weight, no bias): the input's all-gather over c, the identity block's blocked
    all-reduce over a, the reduce-scatter over b, and their adjoints."""
    return layer_bytes(replace(lay, order="aggregate_first"), esize, block_rows, True,
                       weighted=False)


def layer_bytes(lay: LayerLayout, esize: int, block_rows: int | None, input_grad: bool,
                gathered_input: bool = False, residual: str = "none", pre_act: bool = False,
                weighted: bool = True) -> list[tuple[str, str, int]]:
    """(axis role, op, bytes sent) of one layer's forward and backward, in issue order
    (``gathered_input``: sparse input features, read already gathered over c; ``residual``:
    the conv's residual path, 'identity' or 'linear', fused into its collectives as
    :class:`~plexgt.parallel.plexus3d.Plexus3DGCN` runs it; ``pre_act``: pre-norm, the
    residual reads the raw input, gathered on its own; ``weighted=False``: aggregate_first
    with a constant weight and no bias, :func:`hop_bytes`)."""
    ga, gb, gc = lay.g
    a, b, c = lay.roles
    din_b, dout_a = lay.d_in // gb, lay.d_out // ga
    rows_pad, cols_pad = lay.rows_pad, lay.cols_pad  # properties: computed once here
    res = residual != "none"
    learned = residual == "linear"
    nbias = 2 if learned else 1
    gather_in = (c, "all_gather", all_gather_bytes(cols_pad * (din_b // gc) * esize, gc))
    scatter_in = (c, "reduce_scatter", reduce_scatter_bytes(cols_pad * din_b * esize, gc))
    raw = [gather_in] if res and pre_act else []
    raw_grad = [scatter_in] if res and pre_act else []
    if lay.order == "gemm_first":
        blocks = row_blocks(rows_pad, block_rows)
        dout_b, dout_ab = lay.d_out // gb, lay.d_out // (ga * gb)
        w_gather = [(c, "all_gather", all_gather_bytes((din_b // gc) * dout_a * esize, gc)),
                    (a, "all_gather", all_gather_bytes(din_b * dout_a * esize, ga))]
        w_grad = [(a, "reduce_scatter", reduce_scatter_bytes(din_b * lay.d_out * esize, ga)),
                  (c, "reduce_scatter", reduce_scatter_bytes(din_b * dout_a * esize, gc))]
        t_scatter = (b, "reduce_scatter", reduce_scatter_bytes(cols_pad * lay.d_out * esize,
                                                               gb))
        t_gather = (b, "all_gather", all_gather_bytes(cols_pad * dout_b * esize, gb))
        ops = [
            *([] if gathered_input else [gather_in]),
            *w_gather,
            t_scatter,
            *((raw + (w_gather if learned else []) + [t_scatter]) if res else []),
            *[(a, "reduce_scatter", reduce_scatter_bytes((r1 - r0) * dout_b * esize, ga))
              for r0, r1 in blocks],
            # backward
            (c, "all_reduce", all_reduce_bytes(nbias * dout_ab * esize, gc)),
            *[(a, "all_gather", all_gather_bytes((r1 - r0) * dout_ab * esize, ga))
              for r0, r1 in blocks],
            t_gather,
            *w_grad,
            *(([t_gather] + (w_grad if learned else []) + raw_grad) if res else []),
        ]
        if input_grad:
            ops.append(scatter_in)
        return ops
    # the residual's rows are aggregated beside Â's: [Â; I] (or diag(Â, I)), 2·rows_pad rows
    blocks = row_blocks(2 * rows_pad if res else rows_pad, block_rows)
    w_gather = (c, "all_gather", all_gather_bytes((din_b // gc) * dout_a * esize, gc))
    w_grad = (c, "reduce_scatter", reduce_scatter_bytes(din_b * dout_a * esize, gc))
    ops = [
        gather_in,
        *raw,
        *[(a, "all_reduce", all_reduce_bytes((r1 - r0) * din_b * esize, ga)) for r0, r1 in blocks],
        *([w_gather] if weighted else []),
        *([w_gather] if learned else []),
        (b, "reduce_scatter", reduce_scatter_bytes(rows_pad * dout_a * esize, gb)),
        # backward
        (b, "all_gather", all_gather_bytes(rows_pad * (dout_a // gb) * esize, gb)),
        *([(c, "all_reduce", all_reduce_bytes(nbias * (dout_a // gb) * esize, gc)), w_grad]
          if weighted else []),
        *([w_grad] if learned else []),
    ]
    if input_grad:
        ops += [(a, "all_reduce", all_reduce_bytes((r1 - r0) * din_b * esize, ga))
                for r0, r1 in blocks]
        ops.append(scatter_in)
        ops += raw_grad
    return ops


def norm_bytes(lay: LayerLayout, norm: str, esize: int, stack: int = 1
               ) -> list[tuple[str, str, int]]:
    """(group, op, bytes sent) of a norm of ``lay``'s output in a training step: LayerNorm's
    row statistics over the plane (a, b), BatchNorm's column statistics over c
    (:mod:`plexgt.parallel.norms`), and the backward's sum of the parameters' gradients over
    their copies (c); ``stack``: the norm of ``stack`` such outputs side by side (jumping
    knowledge 'cat')."""
    if norm == "none":
        return []
    ga, gb, gc = lay.g
    w = stack * lay.d_out // (ga * gb)
    c = lay.roles[2]
    if norm == "layer":
        group, ops = output_plane(lay.roles), layer_norm_comm(lay.rows_pad, esize, ga * gb)
    else:
        group, ops = c, batch_norm_comm(w, esize, gc)
    out = [(group, o.op, o.sent) for o in ops]
    return out + [(c, "all_reduce", all_reduce_bytes(2 * w * esize, gc))]


def chain_bytes(lays: list[LayerLayout], esize: int, block_rows: int | None,
                input_grad: bool, sparse_input: bool, ops: list[GCNOp] | None = None,
                norm: str = "none") -> list[tuple[str, str, int]]:
    """(group, op, bytes sent) of every layer of a chain (``ops``: each layer's residual and
    norms, :func:`plexgt.models.gcn.gcn_ops`; None: plain GCN layers)."""
    out: list[tuple[str, str, int]] = []
    hops = {} if ops is None else jk_hops(ops)
    for path in hops.values():
        for m in path:
            out += hop_bytes(lays[m], esize, block_rows)
    for k, lay in enumerate(lays):
        op = None if ops is None else ops[k]
        out += layer_bytes(lay, esize, block_rows, k > 0 or input_grad,
                           sparse_input and k == 0,
                           "none" if op is None else op.residual,
                           op is not None and op.pre_act)
        if op is not None and op.pre_norm is not None:
            out += norm_bytes(lays[k - 1], norm, esize, lay.d_in // lays[k - 1].d_out)
        if op is not None and op.post_norm is not None:
            out += norm_bytes(lay, norm, esize)
    return out


def loss_bytes(last: LayerLayout, esize: int, multilabel: bool = False
               ) -> list[tuple[str, str, int]]:
    """Parallel cross-entropy: row max and (exp-sum, target) over the class plane, totals over
    c. Multi-label binary cross-entropy is elementwise: (sum, count) over the plane, then c."""
    ga, gb, gc = last.g
    plane = output_plane(last.roles)
    if multilabel:
        return [(plane, "all_reduce", all_reduce_bytes(2 * esize, ga * gb)),
                (last.roles[2], "all_reduce", all_reduce_bytes(2 * esize, gc))]
    return [
        (plane, "all_reduce", all_reduce_bytes(last.rows_pad * esize, ga * gb)),
        (plane, "all_reduce", all_reduce_bytes(last.rows_pad * 2 * esize, ga * gb)),
        (last.roles[2], "all_reduce", all_reduce_bytes(2 * esize, gc)),
    ]


def plexus_step_bytes(grid: Grid3D, rank: int, n: int, dims: list[int], esize: int,
                      block_rows: int | None = None, order: str = "aggregate_first",
                      input_grad: bool = False, multilabel: bool = False,
                      sparse_input: bool = False, ops: list[GCNOp] | None = None,
                      norm: str = "none") -> dict[str, int]:
    """Bytes ``rank`` sends per axis (and plane) in one forward + loss + backward
    (``input_grad``: the input is trained, a node embedding, so layer 0's input gradient is
    communicated too; ``multilabel``: the binary cross-entropy's loss; ``sparse_input``:
    CSR-stored features, layer 0 gemm_first on its input read already gathered; ``ops``
    and ``norm``: a GCN with :class:`~plexgt.models.gcn.GCNArch` options, ``dims`` then its
    :func:`~plexgt.models.gcn.op_widths`)."""
    out: dict[str, int] = defaultdict(int)
    lays = chain_layouts(grid, rank, n, dims, order, sparse_input, ops)
    for axis, _, nbytes in chain_bytes(lays, esize, block_rows, input_grad, sparse_input,
                                       ops, norm):
        out[axis] += nbytes
    for axis, _, nbytes in loss_bytes(lays[-1], esize, multilabel):
        out[axis] += nbytes
    return {k: v for k, v in out.items() if v}


def chain_layouts(grid: Grid3D, rank: int, n: int, dims: list[int], order: str,
                  sparse_input: bool = False, ops: list[GCNOp] | None = None
                  ) -> list[LayerLayout]:
    """The layouts of a chain of ``dims`` (``ops``: their kinds; sparse input: layer 0
    gemm_first), as the gcn task builds them."""
    lays = layer_layouts(grid, rank, n, dims, order,
                         first_order="gemm_first" if sparse_input else None,
                         kinds=None if ops is None else [op.kind for op in ops])
    if ops is not None and len(ops) > 1 and ops[-1].d_in != ops[-2].d_out:
        # jumping knowledge 'cat': the classifier reads the L layers' blocks side by side,
        # each padded as the last GCN layer's output
        stack = ops[-1].d_in // ops[-2].d_out
        lays[-1] = replace(lays[-1], d_in=stack * lays[-2].d_out, d_in_true=ops[-1].d_in)
    return lays


def row1d_step_bytes(p: int, n: int, dims: list[int], esize: int) -> int:
    """Bytes per rank of the 1D baseline: rows over p ranks, H all-gathered every layer.

    Forward all-gathers H [N/p, d] per layer; backward reduce-scatters dH (not for layer 0);
    the replicated weight and bias gradients are all-reduced; the loss sums two scalars.
    """
    rows = -(-n // p)
    total = 0
    for l in range(len(dims) - 1):
        total += all_gather_bytes(rows * dims[l] * esize, p)
        if l > 0:
            total += reduce_scatter_bytes(rows * p * dims[l] * esize, p)
        total += all_reduce_bytes(dims[l] * dims[l + 1] * esize, p)
        total += all_reduce_bytes(dims[l + 1] * esize, p)
    return total + all_reduce_bytes(2 * esize, p)  # the loss total


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
             ops: list[GCNOp] | None = None, norm: str = "none",
             balance: Balance | None = None) -> PlexusEstimate:
    """Predicted step time and memory of ``grid`` (``input_grad``: layer 0's input is
    trained, a node embedding; ``input_density``: the input is CSR-stored with this share of
    nonzeros, its layer-0 GEMM an SpMM priced by it; ``ops``, ``norm``: the GCN's options,
    :func:`rank_cost`; ``balance``: how unevenly the grid's adjacency blocks hold the
    nonzeros, the busiest block priced)."""
    # every rank prices the same: blocks are padded to equal shapes (ceil(N/G) rows, padded
    # widths), so bytes, calls, FMAs and memory depend on the grid's extents, not on which
    # block a rank holds (the tests check rank_cost over every rank); one rank stands for
    # all, which keeps a search over every factorisation of every scale fast
    rc = rank_cost(grid, 0, n, nnz, dims, esize, coef, block_rows, order, input_grad,
                   input_density, ops, norm, balance)
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
              ops: list[GCNOp] | None = None, norm: str = "none",
              balance: Balance | None = None) -> RankCost:
    """Rank ``r``'s step (:class:`RankCost`), as :func:`estimate` prices it (``ops``,
    ``norm``: a GCN with :class:`~plexgt.models.gcn.GCNArch` options, ``dims`` its
    :func:`~plexgt.models.gcn.op_widths`).

    Compute is the busiest rank's: each conv layer's SpMM on the largest adjacency block of
    the layer's [Gc x Ga] split of A1 / A2 (``balance``; without it, the stated default of
    :mod:`plexgt.plan.balance`), each layer's collectives waiting for it. Memory, bytes and
    calls are rank ``r``'s (equal on every rank: blocks are padded to equal shapes; the
    adjacency's nonzeros priced at the mean)."""
    bal = balance or Balance()
    sparse = input_density is not None
    lays = chain_layouts(grid, r, n, dims, order, sparse, ops)
    host, p = coef.host, grid.size
    nbytes, calls, flops_s, mem, comm = 0, 0, 0.0, 0, 0.0
    traffic: dict[tuple[str, str], list[int]] = {}
    for name, op, b in chain_bytes(lays, esize, block_rows, input_grad, sparse, ops, norm):
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
        shard = cols_pad * lay.d_in // (gb * gc) * (2 if lay.layer == 0 else 1)
        mem += int(blk_nnz * 12 * 2)  # CSR + transpose: 8-byte index + 4-byte value
        mem += din_b * dout_a * esize * 4  # W shard, grad, Adam
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
            # input shard (+ staging on layer 0), gathered input (staged twice), whole W
            # block, H·W before and after its reduce-scatter, the aggregate; a sparse input
            # is read already gathered over c: its CSR block alone, no staging and no
            # gathered copies, but used both ways (X·W, Xᵀ·dY), so with its transpose and
            # index caches as a graph keeps them, and both value arrays
            inputs = (shard + 2 * cols_pad * din_b) * esize
            if sparse and lay.layer == 0:
                nnz_in = int(cols_pad * din_b * input_density)
                inputs = graph_bytes(cols_pad, din_b, nnz_in) + 2 * nnz_in * esize
            mem += inputs + (din_b * lay.d_out + cols_pad * lay.d_out
                             + cols_pad * lay.d_out // gb + rows_pad * lay.d_out // gb
                             ) * esize
        else:
            spmm = blk_nnz * din_b * (2 if lay.layer > 0 else 1)
            spmm_fixed = ((2 if lay.layer > 0 else 1) * coef.spmm_s_per_call
                          + (rows_pad + (cols_pad if lay.layer > 0 else 0)) * din_b
                          * coef.spmm_s_per_row_col)
            gemm = rows_pad * din_b * dout_a * 3
            # input shard (and its staging copy on layer 0), gathered input (twice: the
            # backend stages the gather), aggregate, partial product
            mem += (shard + 2 * cols_pad * din_b + rows_pad * din_b + rows_pad * dout_a
                    ) * esize
        if op is not None and op.residual != "none":
            # the residual path: the identity's block beside Â's, its weight (a learned one
            # with its gradient and Adam's moments), and its operands as the conv's
            eye = n / (ga * gc)
            mem += int(eye * 12 * 2) + (din_b * dout_a * esize * 4
                                        if op.residual == "linear" else 0)
            if lay.order == "gemm_first":
                spmm += eye * (lay.d_out // gb) * 2
                gemm += cols_pad * din_b * lay.d_out * 3
                mem += (din_b * lay.d_out + cols_pad * lay.d_out
                        + cols_pad * lay.d_out // gb) * esize
            else:
                spmm += eye * din_b * 2
                gemm += rows_pad * din_b * dout_a * 3
                mem += rows_pad * din_b * esize
            if op.pre_act:  # the raw input gathered on its own
                mem += 2 * cols_pad * din_b * esize
            mem += rows_pad * dout_ab * esize  # the sum
        for j, at in (() if op is None else
                      ((op.pre_norm, lays[lay.layer - 1]), (op.post_norm, lay))):
            if j is not None and norm != "none":
                # the normalised values kept for backward and the norm's output
                width = (lay.d_in // (gb * gc) if at is not lay else dout_ab)
                mem += 2 * at.rows_pad * width * esize
        flops_s += spmm * coef.spmm_s_per_nnz_col + spmm_fixed + gemm * coef.gemm_s_per_fma
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
            flops_s += (eye * din_b * 2 * coef.spmm_s_per_nnz_col
                        + lay.rows_pad * din_b * dout_a * 2 * coef.gemm_s_per_fma)
    if ops is not None and any(op.jk for op in ops):
        head = lays[-1]
        mem += 2 * head.cols_pad * head.d_in // (head.g[1] * head.g[2]) * esize
    mem += PROCESS_BASE_BYTES
    flops_s *= coef.compute_scale * host.compute_factor(p)
    return RankCost(nbytes, calls, flops_s, mem, comm,
                    tuple((a, op, c, b) for (a, op), (c, b) in traffic.items()))


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
