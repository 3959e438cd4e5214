"""AGP's Algorithm 3 (Lin, Madduri & Kandemir), kept for the benchmarks that reproduce the paper.

plexgt chooses a layout with one search (:func:`plexgt.plan.choose.choose`); this module is the
paper's own selection over :mod:`plexgt.plan.agp`'s estimates, for ``perf/bench_agp.py``,
``perf/predict_lin_table2.py``, ``perf/plan_papers100m.py`` and ``perf/strong_scaling.py``,
which compare against the paper's tables: k = t_iter(1)/N; a (s, c) with s > 1 is kept when
s·β_c(s)/(s-1) <= k — with the estimate's terms, when t_iter(s, c) <= t_iter(1) (up to β(1),
and exactly where α(s) = α(1)·κ(s)/s) — and when its predicted per-rank memory fits; the argmin
of t_iter among the kept (and s = 1, if it fits) is chosen. Nothing that does not fit is ever
chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from plexgt.distributed.grid import Grid3D
from plexgt.parallel.attention.strategy import AttentionStrategy
from plexgt.plan.agp import Estimate, SystemModel, Workload, estimate, unsupported

NEAR_TIE = 0.10
"""Predicted gaps up to this are flagged as near-ties in the plan. On the 2-core test VM, ten
fresh profiles put GP-AG's prediction against GP-A2A's at p = 2 anywhere in a band 10-23%
wide per graph (the loaded per-call cost moves most), and measured options that close were
mostly within each other's step-time noise: which is faster is not settled by the model."""

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
    runs: str = ""
    """Why the machine cannot run the strategy (:func:`~plexgt.plan.agp.unsupported`); ''
    when it can."""


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
         sysm: SystemModel, memory_limit: int | None = None,
         gcn_grids: dict[int, Grid3D] | None = None, head_parallel: int = 0) -> Plan:
    """Algorithm 3 over ``strategies`` x ``scales`` with the memory filter (module docstring).

    gp_2d is priced at every head axis a of each scale (its divisors), or at
    ``head_parallel`` alone when given. gps: ``gcn_grids`` (scale -> grid of that many ranks)
    adds, at each of those scales s > 1, a row per strategy with the GCN path 3D on that grid
    next to the row of ``w``'s own path, so the choice covers the path too."""
    if not strategies:
        raise ValueError("no attention strategy to plan with")
    one = estimate(strategies[0], w, 1, sysm)
    k = one.time_s / w.n
    rows = []
    for c in strategies:
        for s in sorted(set(scales)):
            for a in c.layouts(s, head_parallel):
                first = s == 1 and c is strategies[0]
                ests = [one if first else estimate(c, w, s, sysm, a)]
                g = (gcn_grids or {}).get(s)
                if w.gcn and g is not None and s > 1 and g != w.grid_at(s):
                    if g.size != s:
                        raise ValueError(f"GCN grid {g} has {g.size} ranks, not {s}")
                    ests.append(estimate(c, replace(w, gcn_grid=g), s, sysm, a))
                for est in ests:
                    fits = memory_limit is None or est.memory["total"] <= memory_limit
                    score = math.inf if s == 1 else s * est.beta / (s - 1)
                    rows.append(PlanRow(est, fits, s == 1 or score <= k, score,
                                        runs=unsupported(c, sysm)))
    ok = [r for r in rows if r.fits and r.passes and not r.runs]
    best = min(ok, key=lambda r: (r.est.time_s, r.est.scale), default=None)
    for r in rows:
        if r is best:
            r.chosen, r.why = True, "fastest predicted among those that fit and pass"
        elif r.runs:
            r.why = f"not on this machine: {r.runs}"
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
            if slower <= NEAR_TIE:
                r.why += " (a near-tie: within what re-profiling moves a prediction)"
    return Plan(w, k, rows, memory_limit)


def format_plan(pl: Plan) -> list[str]:
    """The table ``plexgt plan`` prints."""
    w = pl.workload
    gcn = f"{'gcn path':<9} " if w.gcn else ""
    lines = [
        f"{w.model}: N={w.n} E={w.e} F={w.features} C={w.classes} hidden={w.hidden} "
        f"heads={w.heads} layers={w.layers}; k = t_iter(1)/N = {pl.k:.3e} s",
        f"{'strategy':<12} {gcn}{'s':>4} {'t_iter s':>9} {'α·E s':>8} {'β·N s':>8} "
        f"{'comm s':>8} {'MB sent':>8} {'mem GiB':>8} {'fits':>4} {'sβ/(s-1)':>9} "
        f"{'chosen':>6}  why",
    ]
    for r in pl.rows:
        e = r.est
        score = "-" if math.isinf(r.score) else f"{r.score:.2e}"
        path = f"{e.gcn_label:<9} " if w.gcn else ""
        lines.append(
            f"{e.label:<12} {path}{e.scale:>4} {e.time_s:>9.4f} {e.compute_s:>8.4f} "
            f"{e.overhead_s:>8.4f} {e.comm_s:>8.4f} {e.comm_bytes / 1e6:>8.2f} "
            f"{e.memory['total'] / 2**30:>8.3f} {'yes' if r.fits else 'no':>4} {score:>9} "
            f"{'*' if r.chosen else '':>6}  {r.why}")
    c = pl.choice
    if c is None:
        lines.append("no strategy and scale fits the memory limit")
    else:
        via = f", GCN path {c.est.gcn_label}" if w.gcn else ""
        lines.append(f"choice: {c.est.label}{via} on {c.est.scale} rank(s), predicted "
                     f"{c.est.time_s:.4f} s per step, {c.est.memory['total'] / 2**30:.3f} GiB "
                     f"per rank")
    return lines
