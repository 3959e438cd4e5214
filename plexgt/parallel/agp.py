"""AGP: automatic choice of attention strategy and scale from a cost and a memory model.

Time model (Lin, Madduri & Kandemir, DAC 2026), per training step on s ranks with strategy c:

    t_iter(s, c) = α(s)·E + β_c(s)·N,        α(s) = α(1)·κ(s)/s

* α(1)·E: all the work one rank does alone, which s ranks split: the sparse-attention
  kernel's forward + backward (per edge·head·d' and per edge·head, profiled), for gps the GCN
  SpMM both ways, and the row-local part of the blocks (projections, LayerNorms, FFN: the
  profiled dense block, per row·d² and per row·d) with the input and output GEMMs (per node,
  expressed per edge of this graph). Both strategies split it evenly (GP-AG: E/s edges x h
  heads; GP-A2A: E edges x h/s heads). κ(s) >= 1 is the profiled slowdown of s ranks sharing
  a node's cores (1 with one GPU per rank).
* β_c(s)·N: what parallelism adds and does not split, per node: the strategy's collectives
  priced by the profile (the exact per-rank bytes of :mod:`plexgt.parallel.attention_cost`
  times seconds-per-byte, plus a latency per call), its own data movement (GP-AG copies the
  gathered [N, d] K, V and their full-size gradients; GP-A2A permutes [N, d/s]), and the
  fixed per-call costs (the kernel's per-head calls on the heads a rank loops over, the dense
  block's operator overheads, the optimizer on the replicated parameters). β_c(1) is those
  fixed costs only.

Selection is the paper's Algorithm 3 with a memory filter: k = t_iter(1)/N; a (s, c) with s > 1
is kept when s·β_c(s)/(s-1) <= k — with the terms above, exactly when t_iter(s, c) <= t_iter(1)
(up to β(1)) — and when its predicted per-rank memory fits; the argmin of t_iter among the
kept (and s = 1, if it fits) is chosen. Nothing that does not fit is ever chosen.

For gps the GCN path is priced in the 1D layout (:func:`~plexgt.parallel.attention_cost.
gcn1d_comm`); the 3D path's exact bytes are :func:`~plexgt.parallel.redistribute.gcn3d_comm`,
but AGP does not yet choose between the two paths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from plexgt.parallel.attention_cost import model_memory, step_comm
from plexgt.parallel.plexus_cost import Coefficients
from plexgt.parallel.strategies import AttentionProblem, AttentionStrategy, head_splits

ELEMENTWISE_PER_NODE_DIM = {"gt": 60, "gps": 90}
"""Elementwise passes over [N, d] per layer, forward + backward (LayerNorms, residuals, ReLU,
dropout, bias adds, reshapes); a count, not a measurement."""
AG_COPIES = 6
"""GP-AG moves [N, d] this many times per layer outside the wire: gathered K and V copied to
head-major, full-size dK and dV written by the kernel and laid out for the reduce-scatter."""
A2A_COPIES = 8
"""GP-A2A permutes [N, d/s] between node- and head-major layouts 8 times per layer."""
OPTIMIZER_PASSES = 16
"""AdamW reads and writes ~16 parameter-sized arrays a step, on every rank (replicated)."""
DEFAULT_KERNELS = {
    "spmm_s_per_nnz_col": 2e-9, "sddmm_s_per_nnz_col": 2e-9, "gemm_s_per_fma": 1e-10,
    "elementwise_s_per_elem": 1e-9, "copy_s_per_elem": 1e-9, "attention_s_per_head": 0.0,
    "dense_s_per_row_d2": 0.0, "dense_s_per_row_d": 0.0, "dense_s_per_block": 0.0,
    "attention_s_per_edge_head_dim": 1.2e-8, "attention_s_per_edge_head": 2e-8,
}


def count_params(model: str, features: int, hidden: int, classes: int, layers: int,
                 ffn_mult: int = 2) -> int:
    """Parameters of :class:`~plexgt.models.gt.GraphTransformer` or :class:`~plexgt.models.gps.
    GPS` (checked against the modules in the tests)."""
    d, m = hidden, ffn_mult
    block = 4 * (d * d + d) + (d * m * d + m * d) + (m * d * d + d) + 2 * 2 * d
    if model == "gps":
        block += d * d + d + 2 * d
    return features * d + d + layers * block + d * classes + classes


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

    def __post_init__(self) -> None:
        if self.model not in ("gt", "gps"):
            raise ValueError(f"AGP plans gt or gps models, not {self.model!r}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by {self.heads} heads")

    @property
    def problem(self) -> AttentionProblem:
        return AttentionProblem(self.n, self.e, self.hidden, self.heads, self.esize)

    @property
    def num_params(self) -> int:
        return count_params(self.model, self.features, self.hidden, self.classes, self.layers,
                            self.ffn_mult)

    @property
    def gcn(self) -> bool:
        return self.model == "gps"


@dataclass(frozen=True)
class SystemModel:
    """Coefficients read from a system profile (:mod:`plexgt.profile`), or defaults."""

    kernels: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_KERNELS))
    collectives: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)
    """op -> group size -> (latency s, seconds per byte sent)."""
    contention: dict[int, float] = field(default_factory=dict)
    cores: int = 1
    threads: int = 1
    """Threads per rank in the profiled runs."""
    device: str = "unspecified"
    """'cpu' (ranks share cores: κ > 1 when oversubscribed), 'cuda', or 'unspecified' (κ = 1)."""
    name: str = "defaults"

    @classmethod
    def from_profile(cls, prof: dict[str, Any]) -> SystemModel:
        kern = dict(DEFAULT_KERNELS)
        kern.update({k: float(v) for k, v in prof.get("kernel_fits", {}).items()})
        coll = {op: {int(s): (float(f["latency_s"]), float(f["s_per_byte"]))
                     for s, f in by.items()}
                for op, by in prof.get("collective_fits", {}).items()}
        cont = {int(s): float(v) for s, v in prof.get("contention", {}).items()}
        hw = prof.get("hardware", {})
        name = hw.get("gpu") or hw.get("cpu") or "profile"
        threads = int(prof.get("software", {}).get("threads_per_rank") or 1)
        return cls(kern, coll, cont, int(hw.get("cores") or 1), threads,
                   str(hw.get("device", "cpu")), str(name))

    def collective_time(self, op: str, p: int, sent: int) -> float:
        """Seconds of one call of ``op`` over p ranks sending ``sent`` bytes per rank.

        Between profiled group sizes the coefficients are interpolated; beyond the largest the
        bandwidth term is kept and the latency grows with the p-1 steps of a ring.
        """
        if p <= 1:
            return 0.0
        by = self.collectives.get(op) or {}
        if not by:
            c = Coefficients()
            return c.latency_s + c.s_per_byte * sent
        sizes = sorted(by)
        if p in by:
            lat, spb = by[p]
        elif p < sizes[0]:
            lat, spb = by[sizes[0]]
        elif p > sizes[-1]:
            lat, spb = by[sizes[-1]]
            lat *= (p - 1) / max(1, sizes[-1] - 1)
        else:
            hi = next(s for s in sizes if s > p)
            lo = max(s for s in sizes if s < p)
            w = (p - lo) / (hi - lo)
            lat = by[lo][0] * (1 - w) + by[hi][0] * w
            spb = by[lo][1] * (1 - w) + by[hi][1] * w
        return lat + spb * sent

    def slowdown(self, p: int) -> float:
        """κ(p): how much slower each of p busy ranks computes than one rank alone."""
        if self.device != "cpu":
            return max(1.0, self.contention.get(p, 1.0))
        # p single-threaded ranks on c cores cannot each run faster than c/p of a core, whatever
        # a profile taken on a busy machine measured
        bound = p * self.threads / max(1, self.cores)
        if p in self.contention:
            return max(1.0, bound, self.contention[p])
        below = [s for s in self.contention if s < p]
        if below:
            s0 = max(below)
            if self.contention[s0] > 1.0:  # already sharing cores: grows with the rank count
                bound = max(bound, self.contention[s0] * p / s0)
        return max(1.0, bound)


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

    @property
    def overhead_s(self) -> float:
        """β_c(s)·N."""
        return self.copy_s + self.calls_s + self.comm_s

    @property
    def time_s(self) -> float:
        return self.compute_s + self.overhead_s


def estimate(strategy: AttentionStrategy, w: Workload, s: int, sysm: SystemModel) -> Estimate:
    """t_iter(s, c) = α(s)·E + β_c(s)·N and the per-rank memory of ``strategy`` on s ranks."""
    k = sysm.kernels
    prob = w.problem
    h, dh, d, L = w.heads, prob.head_dim, w.hidden, w.layers
    kappa = sysm.slowdown(s)
    edge1 = L * w.e * h * (k["attention_s_per_edge_head_dim"] * dh
                           + k["attention_s_per_edge_head"])
    if w.gcn:
        edge1 += L * 2 * w.e * d * k["spmm_s_per_nnz_col"]
    n_loc = prob.rows(s)
    if k["dense_s_per_row_d2"] or k["dense_s_per_row_d"]:
        # the profiled row-local block (ffn_mult 2), scaled to this FFN and, for gps, the GCN
        # path's linear layer and LayerNorm
        scale = (4 + 2 * w.ffn_mult + (1 if w.gcn else 0)) / 8
        per_row = L * (k["dense_s_per_row_d2"] * d * d * scale
                       + k["dense_s_per_row_d"] * d * (1.5 if w.gcn else 1.0))
        per_row += (w.features * d * 2 + d * w.classes * 3) * k["gemm_s_per_fma"]
    else:
        fma = w.features * d * 2 + (L * (4 + 2 * w.ffn_mult + (1 if w.gcn else 0)) * d * d
                                    + d * w.classes) * 3
        per_row = (fma * k["gemm_s_per_fma"]
                   + L * ELEMENTWISE_PER_NODE_DIM[w.model] * d * k["elementwise_s_per_elem"])
    node1 = w.n * per_row
    heads_here = h if not strategy.full_graph else head_splits(h, s)[0]
    # fixed per-call costs every rank pays whatever its share: kernel calls per head, the
    # dense block's operator overheads, the optimizer over the replicated parameters
    calls = L * (heads_here * k["attention_s_per_head"] + k["dense_s_per_block"]) * kappa
    calls += OPTIMIZER_PASSES * w.num_params * k["elementwise_s_per_elem"] * kappa
    if s == 1:
        copy = 0.0
    elif strategy.full_graph:
        copy = L * A2A_COPIES * s * n_loc * heads_here * dh * k["copy_s_per_elem"] * kappa
    else:
        copy = L * AG_COPIES * s * n_loc * d * k["copy_s_per_elem"] * kappa
    ops = step_comm(strategy, prob, 0, s, L, w.num_params, w.gcn)
    comm = sum(sysm.collective_time(o.op, s, max(o.sent, o.recv)) for o in ops)
    # the busiest rank: E/s edges x h heads (node partition) or E edges x ceil(h/s) heads
    edge = edge1 * (heads_here / h if strategy.full_graph else 1 / s) * kappa
    compute = edge + node1 * n_loc / w.n * kappa
    mem = model_memory(strategy, prob, s, L, w.features, w.classes, w.num_params, w.ffn_mult,
                       w.gcn)
    return Estimate(strategy.name, s, compute / max(1, w.e), (copy + calls + comm) / w.n,
                    compute, copy, calls, comm, sum(o.sent for o in ops), mem)


@dataclass
class PlanRow:
    est: Estimate
    fits: bool
    passes: bool
    """Algorithm 3's test s·β/(s-1) <= k (always True at s = 1)."""
    score: float
    """s·β_c(s)/(s-1) (inf at s = 1)."""
    chosen: bool = False
    why: str = ""


@dataclass
class Plan:
    workload: Workload
    k: float
    """t_iter(1)/N."""
    rows: list[PlanRow]
    memory_limit: int | None

    @property
    def choice(self) -> PlanRow | None:
        return next((r for r in self.rows if r.chosen), None)


def scales_for(world_size: int) -> list[int]:
    """1, 2, 4, ... up to the world size, and the world size."""
    out = [s for s in (2 ** i for i in range(31)) if s <= world_size]
    if world_size not in out:
        out.append(world_size)
    return out


def plan(w: Workload, strategies: list[AttentionStrategy], scales: list[int],
         sysm: SystemModel, memory_limit: int | None = None) -> Plan:
    """Algorithm 3 over ``strategies`` x ``scales`` with the memory filter (module docstring)."""
    if not strategies:
        raise ValueError("no attention strategy to plan with")
    one = estimate(strategies[0], w, 1, sysm)
    k = one.time_s / w.n
    rows = []
    for c in strategies:
        for s in sorted(set(scales)):
            est = one if s == 1 and c is strategies[0] else estimate(c, w, s, sysm)
            fits = memory_limit is None or est.memory["total"] <= memory_limit
            score = math.inf if s == 1 else s * est.beta / (s - 1)
            rows.append(PlanRow(est, fits, s == 1 or score <= k, score))
    ok = [r for r in rows if r.fits and r.passes]
    best = min(ok, key=lambda r: (r.est.time_s, r.est.scale), default=None)
    for r in rows:
        if r is best:
            r.chosen, r.why = True, "fastest predicted among those that fit and pass"
        elif not r.fits:
            r.why = (f"needs {r.est.memory['total'] / 2**30:.2f} GiB > "
                     f"{(memory_limit or 0) / 2**30:.2f} GiB per rank")
        elif not r.passes:
            r.why = f"s·β/(s-1) = {r.score:.3g} > k = {k:.3g} s/node: overhead eats the speedup"
        elif best is not None and r.est.scale == 1 and best.est.scale == 1:
            r.why = "same as the chosen (one rank: no communication)"
        else:
            slower = r.est.time_s / best.est.time_s - 1 if best else 0.0
            r.why = f"{100 * slower:.0f}% slower than the chosen"
    return Plan(w, k, rows, memory_limit)


def format_plan(pl: Plan) -> list[str]:
    """The table ``plexgt plan`` prints."""
    w = pl.workload
    lines = [
        f"{w.model}: N={w.n} E={w.e} F={w.features} C={w.classes} hidden={w.hidden} "
        f"heads={w.heads} layers={w.layers}; k = t_iter(1)/N = {pl.k:.3e} s",
        f"{'strategy':<8} {'s':>3} {'t_iter s':>9} {'α·E s':>8} {'β·N s':>8} {'comm s':>8} "
        f"{'MB sent':>8} {'mem GiB':>8} {'fits':>4} {'sβ/(s-1)':>9} {'chosen':>6}  why",
    ]
    for r in pl.rows:
        e = r.est
        score = "-" if math.isinf(r.score) else f"{r.score:.2e}"
        lines.append(
            f"{e.strategy:<8} {e.scale:>3} {e.time_s:>9.4f} {e.compute_s:>8.4f} "
            f"{e.overhead_s:>8.4f} {e.comm_s:>8.4f} {e.comm_bytes / 1e6:>8.2f} "
            f"{e.memory['total'] / 2**30:>8.3f} {'yes' if r.fits else 'no':>4} {score:>9} "
            f"{'*' if r.chosen else '':>6}  {r.why}")
    c = pl.choice
    if c is None:
        lines.append("no strategy and scale fits the memory limit")
    else:
        lines.append(f"choice: {c.est.strategy} on {c.est.scale} rank(s), predicted "
                     f"{c.est.time_s:.4f} s per step, {c.est.memory['total'] / 2**30:.3f} GiB "
                     f"per rank")
    return lines
