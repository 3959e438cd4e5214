"""AGP: automatic choice of attention strategy and scale from a cost and a memory model.

Time model (Lin, Madduri & Kandemir, DAC 2026), per training step on s ranks with strategy c:
    t_iter(s, c) = α(s)·E + β_c(s)·N,        α(s) ≈ α(1)·κ(s)/s

Every coefficient comes from a system profile (:mod:`plexgt.plan.profile`): kernel rates refitted
from its raw samples, per-element costs read along its size curves, collectives priced on their
measured time-vs-bytes curves.

* α(s)·E: the work s ranks split, on the busiest rank, times κ(s). The sparse-attention
  kernel's forward + backward on the rank's edges and heads (GP-AG: E/s edges x h heads;
  GP-A2A: E edges x ceil(h/s) heads): per edge·head·d' and per edge·head, plus its passes over
  the [h, rows, d'] and [h, cols, d'] arrays (per row·head·d' and per column·head·d'); what
  rebuilding the scores in backward adds (the rings, blocked rows: the profiled recomputing
  kernel over the fused one, :func:`~plexgt.plan.profile.fit_recompute`); for gps the GCN
  SpMM both ways; the row-local part of the blocks (the profiled dense block: per
  row·d², its GEMMs, and per row·d, its memory-bound passes) with the input and output GEMMs.
  Node-proportional passes are priced at the per-element speed the profile's elementwise curve
  gives for the arrays the ranks running at once stream (:meth:`SystemModel.memory_factor`:
  1 in cache, more once they spill to DRAM), so splitting a big graph can gain more than s.
  All of it times the profile's calibration (``SystemModel.compute_scale``): whole one-rank
  training steps over what their kernels add up to in isolation, as the paper fits α on
  profiled iterations. κ(s) >= 1 is the profiled slowdown of s ranks sharing a node; with
  more CPU ranks than cores it is at least κ(full)·s/full (time-sharing,
  :meth:`SystemModel.slowdown`); 1 with one GPU per rank. CPU ranks fewer than the cores
  run cores/s threads each, at the profile's measured speedup of that many threads
  (:meth:`plexgt.plan.host.Host.thread_factor`): one rank on two cores is not two ranks.
* β_c(s)·N: what parallelism adds and does not split. The strategy's collectives, each at its
  exact per-rank bytes (:mod:`plexgt.plan.step_cost`) on the profiled curve of that
  operation and group size (the byte-proportional part time-shared, ×p·threads/cores, when
  CPU ranks' threads outnumber the cores: :meth:`SystemModel.oversubscription`), plus, where
  the profile measured it, the extra a call costs when peers compute between calls
  ("loaded"); its own data movement: GP-AG's kernel streams all N gathered columns of K, V
  and their gradients (the N - N/s beyond its share do not split), GP-A2A permutes [N, d/s]
  between layouts (the profiled copy curve); and the fixed per-call costs (kernel calls per
  head, the dense block's operator overheads, the optimizer on the replicated parameters).
  β_c(1) is those fixed costs only.

The choice is :func:`plexgt.plan.choose.choose`'s, over these estimates: the package has one
chooser. The paper's Algorithm 3 (k = t_iter(1)/N; a (s, c) with s > 1 kept when
s·β_c(s)/(s-1) <= k, and when its memory fits; the argmin of t_iter among the kept) lives on
in ``perf/agp_algorithm3.py``, where the benchmarks that reproduce the paper use it.

For gps the GCN path runs in one of two layouts, and AGP prices the one the step runs:

* 1D (``Workload.gcn_grid`` None): Â rows times the all-gathered X·W, both ways: 2·(E/s)·d
  SpMM per layer in α, the all-gather and reduce-scatter of :func:`~plexgt.parallel.
  gps_dist.gcn1d_comm` in β.
* 3D on ``gcn_grid`` (Plexus, at s = its size): the Â block [N/Gz, N/Gx] times d/Gy columns,
  forward and backward, 2·(E/(Gx·Gz))·d/Gy SpMM per layer in α, and the GEMM of the aggregate
  with the W block, [N/Gz, d/Gy] x [d/Gy, d/Gx], in place of the 1D layer's [N/s, d] x [d, d]
  (the same per-FMA rate); in β the collectives of :func:`~plexgt.parallel.redistribute.
  gcn3d_comm`, each over its group ('rows': the s ranks, or a grid axis of Gx, Gy or Gz):
  the four redistribution all-to-alls between the 1D and the 3D layouts and the Plexus
  layer's all-gather, all-reduce(s) and reduce-scatter, at exact bytes. Ranks move different
  amounts in the redistribution, so the step's collectives are priced on every rank and the
  slowest one's count (``Estimate.comm_rank``).

The search prices both layouts at each scale (the 3D one on :func:`gcn_grid_for`'s grid), so
the choice covers the GCN path too.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from plexgt.distributed.collectives import CommOp
from plexgt.distributed.grid import Grid3D
from plexgt.distributed.layout3d import layer_layouts
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.strategy import AttentionProblem, AttentionStrategy
from plexgt.parallel.redistribute import gcn3d_copy_elems
from plexgt.plan.balance import Balance
from plexgt.plan.host import Host, across_group_sizes
from plexgt.plan.plexus_cost import Coefficients, rank_grids
from plexgt.plan.profile import (
    GT_STEP_SHAPE,
    KERNEL_KINDS,
    counted_recompute,
    curve_time,
    fit_kernels,
    memory_table,
    monotone_curve,
    per_element_curve,
    table_factor,
)
from plexgt.plan.step_cost import model_memory, step_comm_named

ELEMENTWISE_PER_NODE_DIM = {"gt": 60, "gps": 90}
"""Elementwise passes over [N, d] per layer, forward + backward (LayerNorms, residuals, ReLU,
dropout, bias adds, reshapes); a count, not a measurement."""
A2A_COPIES = 8
"""GP-A2A permutes [N, d/s] between node- and head-major layouts about 8 times per layer beyond
the head-major copies the kernel makes anyway (Q, K, V arrive head-major, so the kernel's own
copies of them are free); a count, priced by the profiled copy curve."""
RING_MERGE_PASSES = 6
"""Elementwise passes of one online-softmax merge of a ring block's output into the running
one (log-add-exp of the lse, two weights, scale, add; a count, not a measurement)."""
OPTIMIZER_PASSES = 16
"""AdamW reads and writes ~16 parameter-sized arrays a step, on every rank (replicated)."""
_KERNELS = {
    "spmm_s_per_nnz_col": 2e-9, "sddmm_s_per_nnz_col": 2e-9, "gemm_s_per_fma": 1e-10,
    "elementwise_s_per_elem": 1e-9, "copy_s_per_elem": 1e-9, "attention_s_per_head": 0.0,
    "dense_s_per_row_d2": 0.0, "dense_s_per_row_d": 0.0, "dense_s_per_block": 0.0,
    "attention_s_per_edge_head_dim": 1.2e-8, "attention_s_per_edge_head": 2e-8,
    "attention_s_per_row_head_dim": 4e-9, "attention_s_per_col_head_dim": 4e-9,
}
DEFAULT_KERNELS = _KERNELS | counted_recompute(_KERNELS)


def count_params(model: str, features: int, hidden: int, classes: int, layers: int,
                 ffn_mult: int = 2, super_nodes: int = 0, norm: str = "layer",
                 pre_norm: bool = False, jk: str = "none") -> int:
    """Parameters of :class:`~plexgt.models.gt.GraphTransformer` or :class:`~plexgt.models.gps.
    GPS` (checked against the modules in the tests)."""
    d, m = hidden, ffn_mult
    per_norm = 0 if norm == "none" else 2  # LayerNorm and BatchNorm: a scale and a shift
    block = 4 * (d * d + d) + (d * m * d + m * d) + (m * d * d + d) + 2 * per_norm * d
    if model == "gps":
        block += d * d + d + per_norm * d
    head = d * (layers if jk == "cat" else 1)
    final = per_norm * head if pre_norm else 0
    return (features * d + d + layers * block + head * classes + classes + super_nodes * d
            + final)


@dataclass(frozen=True)
class Workload:
    """One gt or gps training step: graph and model sizes."""

    model: str
    n: int
    e: int
    features: int
    classes: int
    hidden: int = 64
    heads: int = 4
    layers: int = 2
    ffn_mult: int = 2
    esize: int = 4
    gcn_grid: Grid3D | None = None
    """gps: the grid of the 3D GCN path, used at s = its size (the 1D path elsewhere); None:
    the 1D path at every scale."""
    gcn_block_rows: int | None = None
    """gps, 3D path: rows per block of the blocked aggregation (``parallel.block_rows``)."""
    ring_chunks: int = 1
    """gp_ring / gp_2d: pieces each K/V block travels in (``parallel.ring_chunks``)."""
    super_nodes: int = 0
    """Global super nodes S (``model.super_nodes``): N·S more pattern entries for the real
    rows' kernels, and the super rows' merges (their own S·N/p scores are not priced)."""
    attention_block_rows: int = 0
    """gp_ag / gp_a2a: query rows per attention block (``parallel.attention_block_rows``;
    0: whole)."""
    feature_density: float | None = None
    """Share of nonzero input features when they are stored and trained sparse (CSR): the
    input projection is then an SpMM over the nonzeros; None: dense."""
    norm: str = "layer"
    """The blocks' norm (``model.norm``): 'layer', 'batch' (its column statistics are
    all-reduced over the rows) or 'none'."""
    pre_norm: bool = False
    """Pre-norm blocks (and a final norm before the classifier)."""
    jk: str = "none"
    """Jumping knowledge over the blocks' outputs ('cat', 'max', 'sum')."""
    inference: bool = False
    """Price one forward pass (``plexgt predict``) instead of a training step: the forward's
    collectives, a third of the step's kernel time (backward is about twice the forward), no
    optimizer, and :func:`~plexgt.plan.step_cost.model_memory`'s inference memory."""
    checkpoint: bool = False
    """Blocks recomputed in backward (``model.checkpoint = 'block'``): their inputs kept
    instead of their activations, their forward (collectives too) run twice a step.
    Ignored under ``inference`` (no backward: nothing is recomputed)."""
    balance: Balance = field(default_factory=Balance, compare=False)
    """How unevenly row blocks of the stored pattern hold its nonzeros: the busiest rank's
    edges are the mean times its imbalance (:mod:`plexgt.plan.balance`)."""

    def __post_init__(self) -> None:
        if self.model not in ("gt", "gps"):
            raise ValueError(f"AGP plans gt or gps models, not {self.model!r}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by {self.heads} heads")
        if self.gcn_grid is not None and self.model != "gps":
            raise ValueError(f"only gps has a GCN path to run on grid {self.gcn_grid}")

    @property
    def problem(self) -> AttentionProblem:
        return AttentionProblem(self.n, self.e + self.n * self.super_nodes, self.hidden,
                                self.heads, self.esize, ring_chunks=self.ring_chunks,
                                super_nodes=self.super_nodes,
                                block_rows=self.attention_block_rows)

    @property
    def num_params(self) -> int:
        return count_params(self.model, self.features, self.hidden, self.classes, self.layers,
                            self.ffn_mult, self.super_nodes, self.norm, self.pre_norm, self.jk)

    @property
    def batch_norms(self) -> tuple[int, ...]:
        """The width of every BatchNorm a step applies (each all-reduces its statistics over
        the rows): 2 (gt) or 3 (gps) per block, and the final norm of pre-norm."""
        if self.norm != "batch":
            return ()
        per = 3 if self.model == "gps" else 2
        final = (self.hidden * (self.layers if self.jk == "cat" else 1),) if self.pre_norm \
            else ()
        return (self.hidden,) * (per * self.layers) + final

    @property
    def block_batch_norms(self) -> tuple[int, ...]:
        """The BatchNorms inside the blocks (what a checkpointed block recomputes): all of
        :attr:`batch_norms` but pre-norm's final one."""
        bns = self.batch_norms
        return bns[: len(bns) - 1] if self.pre_norm and bns else bns

    @property
    def gcn(self) -> bool:
        return self.model == "gps"

    def grid_at(self, s: int) -> Grid3D | None:
        """The 3D GCN path's grid on s ranks, or None (gt, the 1D path, or s = 1)."""
        g = self.gcn_grid
        return g if self.gcn and g is not None and s > 1 and g.size == s else None


def gcn_grid_for(s: int, n: int, nnz: int, hidden: int, esize: int,
                 coef: Coefficients | None = None) -> Grid3D:
    """The 3D planner's fastest grid of s ranks for gps's GCN path: one d -> d layer in the
    order the path runs it (:func:`plexgt.plan.plexus_cost.rank_grids` on
    [hidden, hidden], aggregate first)."""

    return rank_grids(s, n, nnz, [hidden, hidden], esize, coef or Coefficients(),
                      order="aggregate_first")[0].grid


@dataclass(frozen=True)
class SystemModel:
    """Coefficients read from a system profile (:mod:`plexgt.plan.profile`), or defaults."""

    kernels: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_KERNELS))
    collectives: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)
    """op -> group size -> (latency s, seconds per byte sent)."""
    collective_curves: dict[str, dict[int, tuple[tuple[float, float], ...]]] = field(
        default_factory=dict)
    """op -> group size -> ((bytes sent, seconds), ...) as profiled, sizes ascending, times
    made non-decreasing (:func:`~plexgt.plan.profile.monotone_curve`); preferred over the
    fit where present."""
    memory_curve: tuple[tuple[float, float], ...] = ()
    """(elements, seconds per element) of a streaming elementwise op over sizes: how much
    slower [rows, d] passes get once they fall out of cache (:func:`plexgt.plan.profile.
    memory_factor`)."""
    copy_curve: tuple[tuple[float, float], ...] = ()
    """(elements, seconds per element) of the [N, h, d'] -> [h, N, d'] layout copy."""
    host: Host = field(default_factory=Host)
    """The node's sharing (device, cores, threads, κ, the loaded per-call cost, thread
    speedups): the 3D model's :class:`~plexgt.plan.plexus_cost.Coefficients` hold the same."""
    name: str = "defaults"
    compute_scale: float = 1.0
    """Measured over predicted compute of whole one-rank training steps (the profile's
    ``gt_step`` samples, :func:`step_calibration`): a step runs its kernels back to back on
    data the previous one evicted, where each microbenchmark repeated one kernel on hot
    caches. Multiplies every kernel term (α·E and GP-AG's gathered columns) at every scale."""
    _memory_table: Any = field(init=False, repr=False, compare=False)
    _copy_table: Any = field(init=False, repr=False, compare=False)
    _group_sizes: Any = field(init=False, repr=False, compare=False)
    """The curves' :func:`plexgt.plan.profile.memory_table` (logs taken once, not per size
    asked)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_memory_table", memory_table(self.memory_curve))
        object.__setattr__(self, "_copy_table", memory_table(self.copy_curve))
        ops = set(self.collectives) | set(self.collective_curves)
        object.__setattr__(self, "_group_sizes", {  # op -> profiled group sizes, ascending
            op: tuple(sorted(set(self.collectives.get(op, {}))
                             | set(self.collective_curves.get(op, {})))) for op in ops})

    @classmethod
    def from_profile(cls, prof: dict[str, Any]) -> SystemModel:
        """Coefficients of a system profile; the kernel fits are redone from its raw samples
        (when it has them) by this version's :func:`plexgt.plan.profile.fit_kernels`, and the
        collectives are priced from their measured size curves."""

        kern = dict(DEFAULT_KERNELS)
        kern.update({k: float(v) for k, v in prof.get("kernel_fits", {}).items()})
        if "recompute_s_per_edge_head_dim" not in prof.get("kernel_fits", {}):
            # a profile from before the recompute samples: its attention fit's sixth, the
            # rule it was priced by (not the defaults' CPU numbers)
            kern.update(counted_recompute(kern))
        raw = prof.get("kernels") or {}
        mem: tuple[tuple[float, float], ...] = ()
        cpy: tuple[tuple[float, float], ...] = ()
        if all(raw.get(k) for k in KERNEL_KINDS):  # every kind a profile measures
            kern.update(fit_kernels(raw))
            mem = tuple(per_element_curve(raw["elementwise"]))
            cpy = tuple(per_element_curve(raw["copy"]))
        coll = {op: {int(s): (float(f["latency_s"]), float(f["s_per_byte"]))
                     for s, f in by.items()}
                for op, by in prof.get("collective_fits", {}).items()}
        curves = {op: {int(s): monotone_curve(pts) for s, pts in by.items() if pts}
                  for op, by in prof.get("collectives", {}).items()}
        host = Host.from_profile(prof)
        hw = prof.get("hardware", {})
        name = hw.get("gpu") or hw.get("cpu") or "profile"
        sysm = cls(kern, coll, curves, mem, cpy, host, str(name))
        if mem and raw.get("gt_step"):  # refitted kernels: calibrate their sums on whole steps
            sysm = replace(sysm, compute_scale=step_calibration(sysm, raw["gt_step"]))
        return sysm

    def _call_time(self, op: str, p: int, sent: float) -> float:
        """One call at a profiled group size p: the measured curve, else the linear fit."""
        curve = self.collective_curves.get(op, {}).get(p)
        if curve:
            return curve_time(curve, sent)
        lat, spb = self.collectives[op][p]
        return lat + spb * sent

    def collective_time(self, op: str, p: int, sent: int) -> float:
        """Seconds of one call of ``op`` over p ranks sending ``sent`` bytes per rank.

        At a profiled group size: the profiled time-vs-bytes curve at ``sent`` (piecewise
        linear between the measured sizes, the last segment's slope beyond them), or the
        latency + bytes fit where the profile kept no curve; across group sizes
        :func:`~plexgt.plan.host.across_group_sizes` (the 3D model's rule too).
        """
        if p <= 1:
            return 0.0
        sizes = self._group_sizes.get(op, ())
        if op == "send_recv" and not sizes:
            # a ring step is one exchange with each neighbour, whatever the ring's size: what
            # an all-gather over two ranks does with the same bytes
            return self.collective_time("all_gather", 2, sent)
        if not sizes:
            c = Coefficients()
            return c.latency_s + c.s_per_byte * sent

        return across_group_sizes(sizes, p, lambda q: self._call_time(op, q, sent),
                                  lambda q: self._call_time(op, q, 0))

    def memory_factor(self, elems: float, p: int = 1) -> float:
        """Per-element slowdown of a pass over arrays of ``elems`` elements on each of p
        ranks (1 in cache): the profiled curve at the size the ranks running at once stream."""

        return table_factor(self._memory_table, elems * self.host.sharing(p))

    def copy_time(self, elems: float, p: int = 1) -> float:
        """Seconds of one layout copy of ``elems`` elements on each of p ranks (the profiled
        size curve)."""
        if not self.copy_curve:
            return elems * self.kernels["copy_s_per_elem"]

        return elems * self.copy_curve[0][1] * table_factor(self._copy_table,
                                                            elems * self.host.sharing(p))


@dataclass(frozen=True)
class Estimate:
    """Predicted step of one (strategy, scale)."""

    strategy: str
    scale: int
    alpha: float
    """α(s): seconds per edge (the split work)."""
    beta: float
    """β_c(s): seconds per node (what parallelism adds)."""
    compute_s: float
    """α(s)·E."""
    copy_s: float
    calls_s: float
    comm_s: float
    comm_bytes: int
    """Bytes the busiest rank sends per step."""
    memory: dict[str, int]
    gcn_path: str = ""
    """gps: '1d' or '3d' (the GCN path priced); '' for gt."""
    gcn_grid: Grid3D | None = None
    """The 3D GCN path's grid (gcn_path '3d')."""
    comm_rank: int = 0
    """The rank whose collectives were priced (the slowest; 0 unless the 3D path's
    redistribution makes ranks differ)."""
    head_parallel: int = 1
    """gp_2d: the head axis a it was priced with."""
    label: str = ""
    """The strategy as plans name it, with its head axis where it has one ('gp_2d 4x16':
    a x b; :meth:`~plexgt.parallel.attention.strategy.AttentionStrategy.label`)."""
    rings: bool = False
    """The strategy's K/V blocks travel around a ring (its ring pieces apply)."""

    @property
    def gcn_label(self) -> str:
        """'1d', '3d GxxGyxGz' or '' (gt)."""
        return f"3d {self.gcn_grid}" if self.gcn_grid is not None else self.gcn_path

    @property
    def overhead_s(self) -> float:
        """β_c(s)·N."""
        return self.copy_s + self.calls_s + self.comm_s

    @property
    def time_s(self) -> float:
        return self.compute_s + self.overhead_s


RECOMPUTED = 1 / 3
"""The forward's share of a block's compute in a training step: what checkpointing adds."""


def memory_of(strategy: AttentionStrategy, w: Workload, s: int, head_parallel: int = 1
              ) -> dict[str, int]:
    """Per-rank bytes of ``strategy``'s step on s ranks (:func:`~plexgt.plan.step_cost.
    model_memory`): cheap, so a search drops what cannot fit before pricing its time."""
    prob = replace(w.problem, head_parallel=head_parallel)
    return model_memory(strategy, prob, s, w.layers, w.features, w.classes, w.num_params,
                        w.ffn_mult, w.gcn, w.grid_at(s), w.feature_density, w.pre_norm, w.jk,
                        w.inference, w.checkpoint)


def unsupported(strategy: AttentionStrategy, sysm: SystemModel) -> str:
    """Why the machine cannot run ``strategy``'s kernels at all ('' when it can): a ROCm GPU
    has no ``torch.sparse.sampled_addmm``, which a strategy marked
    :attr:`~plexgt.parallel.attention.strategy.AttentionStrategy.needs_sampled_addmm` computes
    its scores with (no built-in one since the rings' column blocks run on the fused kernel).
    Plans never choose such a strategy, whatever its predicted time."""
    if sysm.host.rocm and strategy.needs_sampled_addmm:
        return "needs torch.sparse.sampled_addmm, which ROCm GPUs lack"
    return ""


def estimate(strategy: AttentionStrategy, w: Workload, s: int, sysm: SystemModel,
             head_parallel: int = 1, comm_ranks: Iterable[int] | None = None) -> Estimate:
    """t_iter(s, c) = α(s)·E + β_c(s)·N and the per-rank memory of ``strategy`` on s ranks
    (``head_parallel``: gp_2d's head axis a, a divisor of s). With gps's 3D path the ranks'
    collectives differ and the slowest rank's are priced: of every rank, or of
    ``comm_ranks`` (a search's sample: pricing all s is O(s) per estimate)."""
    k = sysm.kernels
    prob = replace(w.problem, head_parallel=head_parallel)
    dh, d, L = prob.head_dim, w.hidden, w.layers
    kappa = sysm.host.slowdown(s)
    n_loc = prob.rows(s)  # N at s = 1
    # the attention kernel the busiest rank runs (the strategy's own account of it): its
    # heads, edges, query rows and key columns; the columns that do not shrink with s (GP-AG's
    # gathered ones, a ring's visiting blocks) are overhead (β)
    wk = strategy.work(prob, s)
    h_r, rows = wk.heads, wk.rows
    # the busiest rank's edges: a node-partitioned strategy's share is one of E/edges row
    # blocks of the stored pattern (all its columns), the fullest of them
    e_r = wk.edges * w.balance.imbalance("A1", max(1, round(prob.e / max(wk.edges, 1.0))))

    def side(coef: str, n: float) -> float:
        """The kernel's per-row or per-column passes over [h_r, n, d'] arrays, per layer."""
        x = n * h_r * dh
        return k[coef] * x * sysm.memory_factor(x, s)

    # scores rebuilt in backward (the rings, blocked rows): the profiled recomputation
    # (:func:`~plexgt.plan.profile.fit_recompute`) on the same edges, heads and rows
    edge = L * e_r * h_r * (
        k["attention_s_per_edge_head_dim"] * dh + k["attention_s_per_edge_head"]
        + wk.recompute * (k["recompute_s_per_edge_head_dim"] * dh
                          + k["recompute_s_per_edge_head"]))
    node = L * (side("attention_s_per_row_head_dim", rows)
                + side("attention_s_per_col_head_dim", wk.own_cols))
    if wk.recompute:  # (a search prices ~10^5 estimates: no lookup for nothing)
        node += L * wk.recompute * side("recompute_s_per_row_head_dim", rows)
    gathered = L * (side("attention_s_per_col_head_dim", wk.cols)
                    - side("attention_s_per_col_head_dim", wk.own_cols))
    gathered += L * RING_MERGE_PASSES * wk.merge_elems * k["elementwise_s_per_elem"]
    grid = w.grid_at(s)
    gemm3 = 0.0  # the 3D path's GEMM FMAs per layer beyond the 1D layer's n_loc·d·d
    if grid is not None:  # the 3D GCN path: the rank's Â block on d/Gy columns, both ways

        lay = layer_layouts(grid, 0, w.n, [d, d])[0]
        ga, gb, gc = lay.g
        edge += L * 2 * (lay.d_in // gb) * (
            w.e / (ga * gc) * w.balance.imbalance("A1", gc, ga) * k["spmm_s_per_nnz_col"]
            + (lay.rows_pad + lay.cols_pad) / 2 * k.get("spmm_s_per_row_col", 0.0))
        edge += L * 2 * k.get("spmm_s_per_call", 0.0)
        gemm3 = lay.rows_pad * (lay.d_in // gb) * (lay.d_out // ga) - n_loc * d * d
    elif w.gcn:  # the 1D GCN path: the rank's own rows' edges, both ways
        # output rows: the forward's own n_loc, the backward's (Âᵀ·dZ) all N columns
        edge += L * d * (2 * (w.e / s) * w.balance.imbalance("A1", s) * k["spmm_s_per_nnz_col"]
                         + (n_loc + w.n) * k.get("spmm_s_per_row_col", 0.0))
        edge += L * 2 * k.get("spmm_s_per_call", 0.0)
    # the input projection X·W and its weight gradient Xᵀ·dY (the input is not trained): a
    # GEMM over F columns, or an SpMM over a sparse input's F·density nonzeros a row
    dense_in = 0 if w.feature_density is not None else w.features
    sparse_in = (2 * w.features * w.feature_density * d * k["spmm_s_per_nnz_col"]
                 if w.feature_density is not None else 0.0)
    if k["dense_s_per_row_d2"] or k["dense_s_per_row_d"]:
        # the profiled row-local block (ffn_mult 2), scaled to this FFN and, for gps, the GCN
        # path's linear layer and LayerNorm; its row·d passes at this rank's array size
        scale = (4 + 2 * w.ffn_mult + (1 if w.gcn else 0)) / 8
        per_row = L * (k["dense_s_per_row_d2"] * d * d * scale
                       + k["dense_s_per_row_d"] * d * (1.5 if w.gcn else 1.0)
                       * sysm.memory_factor(n_loc * d, s))
        per_row += (dense_in * d * 2 + d * w.classes * 3) * k["gemm_s_per_fma"] + sparse_in
        gcn_gemm = L * gemm3 * k["dense_s_per_row_d2"] / 8  # its share of the block (1 of 8)
    else:
        fma = dense_in * d * 2 + (L * (4 + 2 * w.ffn_mult + (1 if w.gcn else 0)) * d * d
                                  + d * w.classes) * 3
        per_row = (fma * k["gemm_s_per_fma"] + sparse_in
                   + L * ELEMENTWISE_PER_NODE_DIM[w.model] * d * k["elementwise_s_per_elem"])
        gcn_gemm = L * gemm3 * 3 * k["gemm_s_per_fma"]
    dense = n_loc * per_row + gcn_gemm
    # fixed per-call costs every rank pays whatever its share: kernel calls per head, the
    # dense block's operator overheads, the optimizer over the replicated parameters
    calls = L * (h_r * wk.launches * k["attention_s_per_head"] + k["dense_s_per_block"]) * kappa
    if not w.inference:
        calls += OPTIMIZER_PASSES * w.num_params * k["elementwise_s_per_elem"] * kappa
    # GP-AG makes no layout copies outside the kernel (the gathered K, V and the kernel's
    # node-major dK, dV go to and from the collectives as they are); what the kernel does with
    # the N gathered columns is its per-column cost (``gathered``)
    copy = 0.0
    if wk.copy_elems:  # the all-to-all strategies' permutes (none on one rank)
        copy = L * A2A_COPIES * sysm.copy_time(wk.copy_elems, s) * kappa
    if grid is not None:
        # the 3D GCN path's layout copies (redistributions, zero-filled outputs, their
        # adjoints; rank 0's count, the ranks differ by padding only): ~37 passes a layer
        # over distinct arrays the size of a row block [N/s, d] at 2 ranks, so priced at the
        # rate of streaming them all (not of one cache-resident array copied again). Unpriced,
        # the path measured 10-12% slower than the 1D one it was priced level with
        # (validate_plan's gps at p = 2)
        copy += L * sysm.copy_time(gcn3d_copy_elems(grid, 0, w.n, d), s) * kappa
    # what a kernel term costs on this rank, calibrated: κ(s) and, for CPU ranks fewer than
    # the cores, the speedup of the threads each then runs
    kernels = kappa * sysm.host.thread_factor(s) * sysm.compute_scale
    copy += gathered * kernels
    comm, comm_rank, ops = -1.0, 0, []
    ranks = (range(s) if comm_ranks is None else comm_ranks) if grid is not None else (0,)
    for r in ranks:
        ops_r = step_ops(strategy, w, s, r, head_parallel)
        t = comm_time(ops_r, s, grid, sysm)
        if t > comm:
            comm, comm_rank, ops = t, r, ops_r
    if w.checkpoint and not w.inference:
        # the blocks' forward once more: a third of their step (one product of a GEMM's
        # three; attention's forward pass of its three), input projection and classifier
        # included, which are not recomputed (a few percent of a deep model's)
        edge, node, dense = (t * (1 + RECOMPUTED) for t in (edge, node, dense))
        copy *= 1 + RECOMPUTED
    compute = (edge + node + dense) * kernels
    if w.inference:  # the forward alone: a third of forward + backward (twice the forward)
        compute, copy = compute / 3, copy / 3
    mem = memory_of(strategy, w, s, head_parallel)
    return Estimate(strategy.name, s, compute / max(1, w.e), (copy + calls + comm) / w.n,
                    compute, copy, calls, comm, sum(o.total_sent for _, o in ops), mem,
                    ("3d" if grid is not None else "1d") if w.gcn else "", grid, comm_rank,
                    head_parallel, strategy.label(s, head_parallel), strategy.rings)


def step_calibration(sysm: SystemModel, steps: Iterable[list[float]]) -> float:
    """Median over ``steps`` ([N, E, F, C, hidden, heads, layers, seconds]: one-rank gt
    training steps, the profile's ``gt_step``) of measured over predicted compute, the
    prediction :func:`estimate`'s at s = 1 on ``sysm`` as it is (its fixed per-call costs
    taken off the measurement first). 1.0 with fewer than two usable samples: one step alone,
    a disturbed one, would rescale every kernel term at every scale."""

    one_rank = default_registry().baseline()
    # the samples ran at the profiled thread count: priced without the thread speedup
    base = replace(sysm, compute_scale=1.0, host=replace(sysm.host, thread_speedup={}))
    ratios = []
    for n, e, f, c, hidden, heads, layers, t in steps:
        w = Workload("gt", int(n), int(e), int(f), int(c), int(hidden), int(heads), int(layers),
                     GT_STEP_SHAPE["ffn_mult"])
        est = estimate(one_rank, w, 1, base)
        if est.compute_s > 0 and t > est.overhead_s:
            ratios.append((t - est.overhead_s) / est.compute_s)
    return float(statistics.median(ratios)) if len(ratios) >= 2 else 1.0


def step_ops(strategy: AttentionStrategy, w: Workload, s: int, rank: int = 0,
             head_parallel: int = 1) -> list[tuple[str, CommOp]]:
    """(group name, op) of every collective ``rank`` issues in one step on s ranks: what
    :func:`estimate` prices (the ledger of a run equals them to the byte)."""
    train = not w.inference
    ops = step_comm_named(strategy, replace(w.problem, head_parallel=head_parallel), rank, s,
                          w.layers, w.num_params, w.gcn, w.grid_at(s), w.gcn_block_rows,
                          w.batch_norms if train else (),
                          w.block_batch_norms if w.checkpoint and train else None)
    if w.inference:  # one forward: its collectives (eval BatchNorm uses its running stats)
        ops = [(g, o) for g, o in ops if o.phase == "forward"]
    return ops


def comm_time(ops: list[tuple[str, CommOp]], s: int, grid: Grid3D | None,
              sysm: SystemModel) -> float:
    """Seconds of a rank's collectives: each on its group's profiled curve ('rows': s ranks,
    an axis: its extent in ``grid``) as :meth:`plexgt.plan.host.Host.collective_time` shares
    a node among the job's s ranks (the 3D model's rule too)."""
    def size(name: str, o: CommOp) -> int:
        if o.group_size:  # a strategy's own sub-group (gp_2d's heads and ring axes)
            return o.group_size
        return s if name == "rows" or grid is None else grid.dim(name)

    # identical calls (every layer repeats its block's) priced once: a search prices ~10^5
    calls: Counter[tuple[str, int, int]] = Counter()
    for n, o in ops:
        calls[o.op, size(n, o), max(o.sent, o.recv)] += o.count
    return sum(c * sysm.host.collective_time(partial(sysm.collective_time, op), g, s, b)
               for (op, g, b), c in calls.items())
