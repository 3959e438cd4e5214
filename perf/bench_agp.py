"""AGP validation: measured vs predicted t_iter of GP-AG / GP-A2A at p = 1, 2, 4, and AGP's picks.

    .venv/bin/python -m perf.bench_agp                 # everything (~10 min on 2 cores)
    .venv/bin/python -m perf.bench_agp --graphs syn5,computers --steps 3

1. Prepares (plexgt prep, double permutation, symmetrised) Amazon Computers, Coauthor CS,
   Coauthor Physics (real N and E; bag-of-words features projected to 128 dense dimensions by a
   fixed Gaussian matrix, so the input GEMM does not drown the attention being measured) and
   SBM graphs of 5 to 500 edges per node (N scaled down as the degree grows).
2. Profiles the machine: ``mpiexec -n 4 plexgt profile``.
3. For p = 1, 2, 4 (one mpiexec each, in ``--rounds`` interleaved rounds; p = 4 oversubscribes
   the 2 cores), trains the distributed gt (hidden 64, 4 heads, 2 layers, float32, AdamW) with
   each strategy, the two strategies' steps alternated (A B B A ...) so that drifting load
   falls on both alike: the fastest of ``--steps`` timed steps over all rounds (``--steps //
   --rounds`` a launch, after 2 warm-up steps; a step = the slowest rank; the minimum because
   other jobs on a shared machine only add time; the median is kept too), and, in one more
   launch with glibc returning every freed block, the peak of each rank's resident memory
   during one step above its level before it (one strategy at a time).
4. Predicts every (graph, strategy, p) with :mod:`plexgt.plan.agp` from the profile, and
   lets AGP choose among the measured (strategy, p), with and without the p = 1 option.

Writes perf/results/bench_agp.json and .png (the profile: bench_agp_system.json; a new run
overwrites them, the date is inside the JSON) and ends with one RESULT line.

    .venv/bin/python -m perf.bench_agp --reevaluate perf/results/bench_agp.json

measures nothing: it recomputes the current model's predictions and AGP's choices for a stored
run's measurements, from that run's stored profile (or ``--profile``) and graph sizes, so a
model change is scored on the same data (``--write`` keeps the result as JSON).

Scoring (:func:`summarise`). A decision (per graph: the scale and strategy among the 5 measured
options, p = 1 counted once; also the strategy at p = 2 and at p = 4) is a *strict* hit when
AGP's pick is the option with the fastest step; its slowdown is the pick's fastest step over
the best one's. Steps on a shared machine vary by tens of percent, so each decision is also
scored *within the noise*: a pick whose per-step times are not larger than the fastest option's
(p >= 0.05, one-sided: Wilcoxon signed-rank over the alternated step pairs of two strategies at
the same p, Mann-Whitney U across p) is not measurably slower. Both are reported, with the
ties behind them: graphs whose runner-up is within 5% of the fastest, and graphs where some
other option is not measurably slower than the fastest; and the strict hit rate over the
others, where the measurement names one fastest option. The decisions are also scored by
median step: the fastest of tens of steps is one lucky draw, and the noisier options (more
ranks on the 2 cores) draw luckier ones. MAPE is over distinct measurements, against the fastest
step (the bench's t_iter) and the median step. MAPE and the share of choices within 10% of
the fastest are :mod:`perf.plan_score`'s, the score validate_plan gives its own measurements.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from scipy.stats import mannwhitneyu, wilcoxon

from perf import plan_score
from perf.agp_algorithm3 import plan
from perf.harness import (
    DATASETS_DIR,
    RESULTS_DIR,
    GraphSource,
    PeakRSS,
    hardware,
    launch,
    module,
    mpiexec,
    plexgt,
    prepare_all,
    projected_graph,
    result_line,
    rss,
    today,
    write_json,
)
from plexgt.data.loader import PreparedGraph
from plexgt.data.synthetic import sbm
from plexgt.distributed.bootstrap import init_distributed, shutdown
from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.gt_dist import DistGraphTransformer
from plexgt.parallel.rows1d import all_reduce_gradients, row_cross_entropy
from plexgt.plan.agp import SystemModel, Workload, estimate
from plexgt.plan.choose import ModelShape, RunPlan
from plexgt.tasks.attention import read_dist_graph, read_row_data

REAL = ("computers", "cs", "physics")
"""The real graphs (:data:`perf.harness.GNN_BENCHMARK`), their features projected to
:data:`PROJECTED_FEATURES` dense dimensions."""
# name -> (nodes, edges per node)
SYNTHETIC = {"syn5": (8000, 5), "syn20": (6000, 20), "syn50": (4000, 50),
             "syn100": (3000, 100), "syn200": (2000, 200), "syn500": (2000, 500)}
SCALES = (1, 2, 4)
MODEL = {"hidden": 64, "heads": 4, "layers": 2, "ffn_mult": 2}
VALIDATED = ("gp_ag", "gp_a2a")
"""The strategies this validation measures and AGP chooses among (the stored runs hold these
two; the ring strategies are measured side by side in ``bench_ring.py``)."""
PROJECTED_FEATURES = 128


# -- data -------------------------------------------------------------------------------------
def sources(names: list[str], datasets: Path,
            synthetic: dict[str, tuple[int, int]] | None = None) -> dict[str, GraphSource]:
    """The graphs ``names`` for :func:`perf.harness.prepare_all`: a real one with its features
    projected, an SBM one of ``synthetic``'s (default :data:`SYNTHETIC`) nodes and edges per
    node (8 classes, 64 features)."""
    synthetic = SYNTHETIC if synthetic is None else synthetic
    out: dict[str, GraphSource] = {}
    for name in names:
        if name in REAL:
            out[name] = partial(projected_graph, name, PROJECTED_FEATURES, datasets)
        else:
            n, deg = synthetic[name]
            out[name] = partial(sbm, num_nodes=n, num_edges=n * deg, num_classes=8,
                                num_features=64, seed=1)
    return out


PREP = {"symmetrize": True, "seed": 3}
"""How :func:`sources`' graphs are prepared (symmetrised, double permutation of seed 3), here
and in bench_ring."""


# -- the per-rank worker (under mpiexec) ------------------------------------------------------
def _setup(pg, sname: str, p: int, rank: int):  # noqa: ANN001, ANN202
    """(one training step, its ledger, the graph's resident bytes) of the distributed gt
    with strategy ``sname`` on this rank; the step is not yet warmed up."""
    ledger = CommLedger()
    comm = Comm.from_group(dist.group.WORLD, "rows", ledger)
    gc.collect()
    rss0 = rss()
    shape = ModelShape("gt", MODEL["hidden"], MODEL["layers"], MODEL["heads"], MODEL["ffn_mult"])
    graph = read_dist_graph(pg, comm, RunPlan("gt", p, strategy=sname, shape=shape))
    data = read_row_data(pg, p, rank)
    graph_rss = rss() - rss0
    torch.manual_seed(0)
    model = DistGraphTransformer(pg.F, MODEL["hidden"], pg.C, MODEL["layers"], MODEL["heads"],
                                 dropout=0.0, ffn_mult=MODEL["ffn_mult"])
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = row_cross_entropy(model(data.x, graph), data.labels, data.masks["train"], comm)
        loss.backward()
        all_reduce_gradients(model, comm)
        opt.step()

    return step, ledger, graph_rss


def _timed(step) -> float:  # noqa: ANN001
    """Seconds of one step on this rank, started together (barrier)."""
    dist.barrier()
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def _measure(pg, name: str, group: list[str], p: int, rank: int, steps: int,  # noqa: ANN001
             memory_pass: bool) -> list[dict]:
    """The rows (rank 0; [] elsewhere) of the strategies in ``group`` on graph ``name``: their
    steps alternated (time), or one step's peak resident set (memory, one strategy). A
    function of its own so the models, optimizer states and graphs die with it, before the
    next group or graph is built."""
    built = {s: _setup(pg, s, p, rank) for s in group}
    for step, _, _ in built.values():
        for _ in range(1 if memory_pass else 2):
            step()
    gc.collect()
    times: dict[str, list[float]] = {s: [] for s in group}
    for _, ledger, _ in built.values():
        ledger.reset()
    peak = base = 0
    if memory_pass:
        (sname,) = group
        with PeakRSS() as mem:
            base = rss()
            times[sname].append(_timed(built[sname][0]))
        peak = mem.peak
    else:
        for i in range(steps):
            for sname in (group if i % 2 == 0 else group[::-1]):
                times[sname].append(_timed(built[sname][0]))
    rows = []
    for sname in group:
        _, ledger, graph_rss = built[sname]
        tt = torch.tensor(times[sname], dtype=torch.float64)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        peaks = [None] * p
        dist.all_gather_object(peaks, [peak - base, graph_rss,
                                       ledger.total(kind="sent") // len(times[sname])])
        if rank == 0:
            rows.append({
                "graph": name, "strategy": sname, "p": p, "n": pg.N, "e": pg.E,
                "f": pg.F, "c": pg.C, "step_s": tt.tolist(),
                "t_iter": float(np.min(tt.numpy())),
                "t_iter_median": float(np.median(tt.numpy())),
                "peak_activation_bytes": [int(x[0]) for x in peaks],
                "graph_rss_bytes": [int(x[1]) for x in peaks],
                "sent_bytes_per_step": [int(x[2]) for x in peaks],
            })
            print(f"  p={p} {name:<10} {sname:<7} t_iter {rows[-1]['t_iter']:.4f} s",
                  flush=True)
    return rows


def worker(args: argparse.Namespace) -> None:
    """Time mode: every strategy of a graph is built up front and their steps alternate, the
    order flipped every step (A B B A ...), so the load other jobs put on the machine, which
    drifts over seconds, falls on both alike and step i of one pairs with step i of the
    other. Memory mode: one strategy at a time, one step, its peak resident set."""
    ctx = init_distributed("gloo", timeout_s=900)
    torch.manual_seed(ctx.rank)
    p = ctx.world_size
    results = []
    memory_pass = args.mode == "memory"
    for name, path in json.loads(args.worker).items():
        pg = PreparedGraph(path)
        names = ["gp_ag"] if p == 1 else list(VALIDATED)
        groups = [[s] for s in names] if memory_pass else [names]
        for group in groups:
            results += _measure(pg, name, group, p, ctx.rank, args.steps, memory_pass)
        pg.close()
    if ctx.rank == 0:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    shutdown(ctx)


# -- driver -----------------------------------------------------------------------------------
NOISE_ALPHA = 0.05
"""A choice whose step times are not slower than the fastest's at this significance (one-sided
Wilcoxon signed-rank over the alternated step pairs at the same p, Mann-Whitney U across p) is
within the measurement noise; a GP-AG/GP-A2A pair is *decided* below it (two-sided signed-rank,
:func:`strategy_pairs`). Needs at least 6 pairs: with 5 or fewer the signed-rank test cannot
reach it, and every same-p option would count as within the noise."""
MIN_PAIRS = 6
TIE_GAP = 0.05
"""Candidates whose fastest steps are this close count as a tie in the report."""


def _slower_p(pick: list[float], best: list[float], paired: bool = False) -> float:
    """p-value for 'the pick's step times are larger than the best's' (1.0 when they are the
    same samples): one-sided Wilcoxon signed-rank over step i of one against step i of the
    other when ``paired`` (the two alternated step by step in the same launches, so a load
    spike hits both), else one-sided Mann-Whitney U."""
    if pick is best or sorted(pick) == sorted(best):
        return 1.0
    if paired:
        if len(pick) != len(best):
            raise ValueError(f"paired step times of unequal lengths ({len(pick)}, {len(best)}): "
                             "the steps were not alternated")
        diff = np.log(np.asarray(pick)) - np.log(np.asarray(best))
        if not diff.any():
            return 1.0
        return float(wilcoxon(diff, alternative="greater").pvalue)
    return float(mannwhitneyu(pick, best, alternative="greater").pvalue)


def _choice(graph: str, label: str, pick: tuple[str, int], cands: dict, steps: dict,
            paired: bool = False) -> dict:
    """One decision: AGP's pick against the measured fastest of ``cands`` ({key: t_iter}),
    strictly (fastest step) and within the noise of the per-step samples (``paired``: options
    at the same p were alternated step by step, so those are compared pair by pair); and
    strictly by median step (a fastest step is one lucky draw, and the noisier option, more
    ranks on the 2 cores, draws luckier ones)."""
    by_fastest = plan_score.decision(pick, cands)
    best = by_fastest["fastest"]
    ranked = sorted(cands.values())

    def slower(k: tuple[str, int]) -> float:
        return _slower_p(steps[k], steps[best], paired and k[1] == best[1])

    p_slower = slower(pick)
    tied = sorted(k for k in cands if k != best and slower(k) >= NOISE_ALPHA)
    by_median = plan_score.decision(pick, {k: float(np.median(steps[k])) for k in cands})
    best_med = by_median["fastest"]
    return {"graph": graph, "decision": label, "agp": list(pick), "fastest": list(best),
            "agp_s": cands[pick], "fastest_s": cands[best],
            "slowdown": by_fastest["slower"],
            "hit": pick == best,
            "p_slower": p_slower, "noise_hit": pick == best or p_slower >= NOISE_ALPHA,
            "runner_up_gap": ranked[1] / ranked[0] - 1 if len(ranked) > 1 else None,
            "tied_with_fastest": [list(k) for k in tied],
            "fastest_by_median": list(best_med), "hit_by_median": pick == best_med,
            "slowdown_by_median": by_median["slower"]}


def analyse(measured: list[dict], prof: dict, paired: bool = False) -> dict:
    """Predictions, errors and AGP's choices for every measured configuration.

    Decisions per graph: ``scale_and_strategy`` (AGP's plan over p = 1, 2, 4 and both
    strategies, against the fastest of the 5 measured options; p = 1 is one option, run once),
    ``at_p4`` (the plan at p = 4 alone) and ``strategy_at_p2`` / ``strategy_at_p4`` (GP-AG or
    GP-A2A by predicted time at that p). Each is scored strictly (the pick is the measured
    fastest, by its fastest step) and within the noise (:data:`NOISE_ALPHA`; ``paired``: the
    run alternated the strategies step by step, :func:`worker`).
    """
    reg = default_registry()
    sysm = SystemModel.from_profile(prof)
    rows = []
    by_graph: dict[str, dict] = {}
    steps: dict[str, dict] = {}
    for m in measured:
        w = Workload("gt", m["n"], m["e"], m["f"], m["c"], MODEL["hidden"], MODEL["heads"],
                     MODEL["layers"], MODEL["ffn_mult"], 4)
        names = list(VALIDATED) if m["p"] == 1 else [m["strategy"]]
        med = m.get("t_iter_median", float(np.median(m["step_s"])))
        for sname in names:  # p = 1: one measurement stands for both strategies
            est = estimate(reg.get(sname), w, m["p"], sysm)
            att = est.memory["attention_activations"] + est.memory["dense_activations"]
            row = {**{k: m[k] for k in ("graph", "p", "n", "e", "t_iter")}, "strategy": sname,
                   "t_iter_median": med,
                   "predicted": est.time_s, "ape": plan_score.ape(est.time_s, m["t_iter"]),
                   "ape_median": plan_score.ape(est.time_s, med),
                   "alpha": est.alpha, "beta": est.beta,
                   "compute_s": est.compute_s, "copy_s": est.copy_s, "calls_s": est.calls_s,
                   "comm_s": est.comm_s,
                   "predicted_activation_bytes": att,
                   "measured_activation_bytes": max(m["peak_activation_bytes"]),
                   "predicted_graph_bytes": est.memory["graph"],
                   "measured_graph_rss_bytes": max(m["graph_rss_bytes"])}
            rows.append(row)
            by_graph.setdefault(m["graph"], {"w": w})[(sname, m["p"])] = row
            steps.setdefault(m["graph"], {})[(sname, m["p"])] = m["step_s"]
    choices = []
    for g, d in by_graph.items():
        w = d.pop("w")
        meas = {k: r["t_iter"] for k, r in d.items()}
        one = next(k for k in meas if k[1] == 1) if any(k[1] == 1 for k in meas) else None
        for label, scales in (("scale_and_strategy", list(SCALES)), ("at_p4", [4])):
            pl = plan(w, [reg.get(s) for s in VALIDATED], scales, sysm)
            # without the one-rank option nothing may pass Algorithm 3's test: then, as a job
            # of that size does (plan.choose.choose_strategy), the fastest predicted
            c = pl.choice.est if pl.choice else min((r.est for r in pl.rows),
                                                    key=lambda e: e.time_s)
            # one rank is one option, whatever strategy name the plan gives it
            cands = {k: v for k, v in meas.items() if k[1] in scales and (k[1] > 1 or k == one)}
            pick = (c.strategy, c.scale) if c.scale > 1 else one
            choices.append(_choice(g, label, pick, cands, steps[g], paired))
        for p in SCALES[1:]:
            pick = min(("gp_ag", "gp_a2a"), key=lambda s, p=p: d[(s, p)]["predicted"])
            cands = {(s, p): meas[(s, p)] for s in ("gp_ag", "gp_a2a")}
            choices.append(_choice(g, f"strategy_at_p{p}", (pick, p), cands, steps[g],
                                   paired))
    out = {"rows": rows, "choices": choices}
    if paired:
        out["strategy_pairs"] = strategy_pairs(measured)
    return out


def strategy_pairs(measured: list[dict], draws: int = 2000) -> list[dict]:
    """Per graph and p > 1, GP-AG's step i over GP-A2A's step i for the alternated steps: the
    median ratio, its 95% bootstrap interval (resampling the pairs, fixed seed), the two-sided
    Wilcoxon signed-rank p-value, and ``decided``: p-value < :data:`NOISE_ALPHA`, the test
    the decisions are scored with (the interval, of the median rather than the signed-rank
    test's pseudo-median, can touch 1 where the test is just below it)."""
    steps = {(m["graph"], m["strategy"], m["p"]): np.asarray(m["step_s"]) for m in measured}
    out = []
    for (g, s, p), ag in steps.items():
        a2a = steps.get((g, "gp_a2a", p))
        if s != "gp_ag" or p == 1 or a2a is None or len(a2a) != len(ag):
            continue
        lr = np.log(ag / a2a)
        p_value = float(wilcoxon(lr).pvalue) if lr.any() else 1.0
        rng = np.random.default_rng(0)
        boot = np.median(lr[rng.integers(0, lr.size, (draws, lr.size))], axis=1)
        lo, hi = np.exp(np.percentile(boot, [2.5, 97.5]))
        out.append({"graph": g, "p": p, "pairs": int(lr.size),
                    "ag_over_a2a": float(np.exp(np.median(lr))), "ci95": [float(lo), float(hi)],
                    "p_value": p_value, "decided": p_value < NOISE_ALPHA})
    return out


def _tie(c: dict) -> bool:
    return c["runner_up_gap"] is not None and c["runner_up_gap"] <= TIE_GAP


def summarise(analysis: dict) -> dict:
    """Error of the predictions and quality of AGP's choices, strict and noise-aware.

    MAPE is over distinct measurements (p = 1 once), against the fastest step (``mape``, the
    bench's t_iter) and the median step (``mape_median``). For the 9 scale-and-strategy
    decisions: ``agp_hit_rate`` (the pick is the measured fastest), ``agp_max_slowdown`` and
    ``agp_within_10pct`` (by fastest steps), ``agp_noise_hit_rate`` (the pick is the fastest or
    not measurably slower, :data:`NOISE_ALPHA`), ``ties_5pct`` (graphs whose runner-up is within
    :data:`TIE_GAP` of the fastest) and ``ties_noise`` (graphs where some other option is not
    measurably slower than the fastest), and ``agp_hit_rate_resolved`` over the ``resolved``
    decisions, those whose fastest option is measurably faster than every other (None when
    there are none): where the measurement can name the fastest, whether AGP picked it.
    ``agp_hit_rate_by_median`` and ``agp_max_slowdown_by_median``: the same decisions scored
    by median steps.
    """
    rows = [r for r in analysis["rows"] if r["p"] > 1 or r["strategy"] == "gp_ag"]
    ch = analysis["choices"]
    hits = [c for c in ch if c["decision"] == "scale_and_strategy"]
    strat = [c for c in ch if c["decision"].startswith("strategy_at")]
    resolved = [c for c in hits if not c["tied_with_fastest"]]
    scored = plan_score.score([r["ape"] for r in rows], [c["slowdown"] for c in hits])
    return {
        "mape": scored["mape"],
        "mape_median": plan_score.mape(r["ape_median"] for r in rows),
        "mape_by_p": {str(p): plan_score.mape(r["ape"] for r in rows if r["p"] == p)
                      for p in SCALES},
        "agp_hit_rate": float(np.mean([c["hit"] for c in hits])),
        "agp_noise_hit_rate": float(np.mean([c["noise_hit"] for c in hits])),
        "agp_within_10pct": scored["within_10pct"],
        "agp_max_slowdown": max(c["slowdown"] for c in hits),
        "agp_hit_rate_by_median": float(np.mean([c["hit_by_median"] for c in hits])),
        "agp_max_slowdown_by_median": max(c["slowdown_by_median"] for c in hits),
        "decisions": len(hits),
        "ties_5pct": sum(_tie(c) for c in hits),
        "ties_noise": sum(bool(c["tied_with_fastest"]) for c in hits),
        "resolved": len(resolved),
        "agp_hit_rate_resolved": (float(np.mean([c["hit"] for c in resolved])) if resolved
                                  else None),
        "strategy_hit_rate": float(np.mean([c["hit"] for c in strat])),
        "strategy_noise_hit_rate": float(np.mean([c["noise_hit"] for c in strat])),
        "strategy_ties_5pct": sum(_tie(c) for c in strat),
        "at_p4_hit_rate": float(np.mean([c["hit"] for c in ch if c["decision"] == "at_p4"])),
    }


def _fmt(k: list | tuple) -> str:
    return f"{k[0]}@{k[1]}" if k[1] > 1 else "1 rank"


def report(analysis: dict, summ: dict) -> None:
    """The per-graph decisions and the per-configuration errors, printed."""
    print(f"{'graph':<10} {'AGP':>11} {'fastest':>11} {'slowdown':>8} {'p(slower)':>9} "
          f"{'runner-up':>9}  not measurably slower than the fastest")
    for c in analysis["choices"]:
        if c["decision"] != "scale_and_strategy":
            continue
        mark = "hit" if c["hit"] else ("noise" if c["noise_hit"] else "MISS")
        print(f"{c['graph']:<10} {_fmt(c['agp']):>11} {_fmt(c['fastest']):>11} "
              f"{100 * c['slowdown']:>7.1f}% {c['p_slower']:>9.3f} "
              f"{100 * (c['runner_up_gap'] or 0.0):>8.1f}%  "
              f"{', '.join(_fmt(k) for k in c['tied_with_fastest']) or '-'}  [{mark}]")
    print(f"{'graph':<10} {'config':>11} {'measured':>8} {'median':>8} {'predicted':>9} "
          f"{'err':>6} {'compute':>8} {'copy':>7} {'calls':>7} {'comm':>7}")
    for r in analysis["rows"]:
        if r["p"] == 1 and r["strategy"] != "gp_ag":
            continue
        print(f"{r['graph']:<10} {_fmt((r['strategy'], r['p'])):>11} {r['t_iter']:>8.4f} "
              f"{r['t_iter_median']:>8.4f} {r['predicted']:>9.4f} "
              f"{100 * (r['predicted'] / r['t_iter'] - 1):>+5.0f}% {r['compute_s']:>8.4f} "
              f"{r['copy_s']:>7.4f} {r['calls_s']:>7.4f} {r['comm_s']:>7.4f}")
    print(f"MAPE {100 * summ['mape']:.1f}% (vs median step {100 * summ['mape_median']:.1f}%; "
          + ", ".join(f"p={p} {100 * v:.1f}%" for p, v in summ["mape_by_p"].items()) + ")")
    print(f"AGP (scale and strategy, {summ['decisions']} graphs): fastest "
          f"{100 * summ['agp_hit_rate']:.0f}% strict, {100 * summ['agp_noise_hit_rate']:.0f}% "
          f"within noise; within 10% {100 * summ['agp_within_10pct']:.0f}%; max slowdown "
          f"{100 * summ['agp_max_slowdown']:.1f}%; ties: {summ['ties_5pct']} graphs with the "
          f"runner-up within {100 * TIE_GAP:.0f}%, {summ['ties_noise']} with an option not "
          f"measurably slower than the fastest")
    print(f"by median step: fastest {100 * summ['agp_hit_rate_by_median']:.0f}%, max slowdown "
          f"{100 * summ['agp_max_slowdown_by_median']:.1f}%")
    for sp in analysis.get("strategy_pairs", []):
        lo, hi = sp["ci95"]
        print(f"{sp['graph']:<10} p={sp['p']}: GP-AG / GP-A2A step {sp['ag_over_a2a']:.3f} "
              f"[{lo:.3f}, {hi:.3f}] over {sp['pairs']} alternated pairs"
              + ("" if sp["decided"] else "  (undecided)"))
    if summ["resolved"]:
        print(f"where the fastest is measurably faster than every other option "
              f"({summ['resolved']} graphs): AGP picks it "
              f"{100 * summ['agp_hit_rate_resolved']:.0f}%")
    print(f"strategy at fixed p: {100 * summ['strategy_hit_rate']:.0f}% strict, "
          f"{100 * summ['strategy_noise_hit_rate']:.0f}% within noise "
          f"({summ['strategy_ties_5pct']} of {2 * summ['decisions']} within "
          f"{100 * TIE_GAP:.0f}%)")


def reevaluate(path: Path, profile: Path | None) -> dict:
    """Predictions and choices of the current model for a stored run's measurements, offline:
    the run's own profile (or ``profile``) and graph sizes, nothing re-measured."""
    old = json.loads(path.read_text())
    prof_path = profile or Path(old["profile"])
    if not prof_path.exists():  # stored with another checkout's absolute path
        prof_path = path.parent / Path(old["profile"]).name
    prof = json.loads(prof_path.read_text())
    an = analyse(old["measured"], prof, bool(old.get("paired_steps")))
    summ = summarise(an)
    print(f"re-evaluating {path} with profile {prof_path} "
          f"({len(old['measured'])} measured configurations)")
    report(an, summ)
    stored = old.get("summary", {})
    if stored:
        print("stored run's summary: " + ", ".join(
            f"{k} {v:.4f}" for k, v in stored.items()
            if k in ("mape", "agp_hit_rate", "agp_within_10pct", "agp_max_slowdown",
                     "strategy_hit_rate")))
    return {"source": str(path), "profile": str(prof_path), "analysis": an, "summary": summ}


def plot(analysis: dict, path: Path, title: str) -> None:
    # matplotlib is an optional dependency (the perf extra), imported only to draw
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.8))
    colors = {"gp_ag": "tab:blue", "gp_a2a": "tab:orange"}
    marks = {1: "o", 2: "s", 4: "^"}
    for r in analysis["rows"]:
        a.scatter(r["t_iter"], r["predicted"], c=colors[r["strategy"]], marker=marks[r["p"]],
                  s=28)
        b.scatter(max(r["measured_activation_bytes"], 1) / 2**20,
                  r["predicted_activation_bytes"] / 2**20, c=colors[r["strategy"]],
                  marker=marks[r["p"]], s=28)
    for ax, lab in ((a, "t_iter (s)"), (b, "activation memory per rank (MiB)")):
        lo, hi = ax.get_xlim()
        lo2, hi2 = ax.get_ylim()
        lim = (min(lo, lo2), max(hi, hi2))
        ax.plot(lim, lim, "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"measured {lab}")
        ax.set_ylabel(f"predicted {lab}")
    for s, c in colors.items():
        a.scatter([], [], c=c, label=s)
    for p, m in marks.items():
        a.scatter([], [], c="gray", marker=m, label=f"p={p}")
    a.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default=",".join([*REAL, *SYNTHETIC]))
    ap.add_argument("--steps", type=int, default=8, help="timed steps per config, all rounds")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds")
    ap.add_argument("--work", type=Path, default=Path("/tmp/plexgt-bench-agp"))
    ap.add_argument("--profile", type=Path, help="reuse a system profile instead of measuring")
    ap.add_argument("--reevaluate", type=Path, metavar="BENCH_JSON",
                    help="measure nothing: the current model's predictions and choices for a "
                         "stored run's measurements, from its stored profile (or --profile)")
    ap.add_argument("--write", type=Path, metavar="JSON",
                    help="with --reevaluate: also write the re-evaluation here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="time", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    if args.reevaluate:
        out = reevaluate(args.reevaluate, args.profile)
        if args.write:
            args.write.write_text(json.dumps(out, indent=1, default=list) + "\n")
            print(f"wrote {args.write}")
        _result(out["summary"], mode="reevaluate",
                configs=len(out["analysis"]["rows"]) - sum(
                    r["p"] == 1 and r["strategy"] != "gp_ag" for r in out["analysis"]["rows"]))
        return

    t_start = time.perf_counter()
    names = [g for g in args.graphs.split(",") if g]
    if not (DATASETS_DIR / "gnn-benchmark").exists():
        names = [g for g in names if g not in REAL]
        print("no ../shared/datasets: real graphs skipped", flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    dirs = prepare_all(sources(names, DATASETS_DIR), args.work, **PREP)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # memory pass: every allocation over 64 KiB is its own mapping, returned when freed, so the
    # resident set follows live tensors (the timing pass keeps glibc's defaults: realistic)
    env_mem = {**env, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
    prof_path = args.profile or RESULTS_DIR / "bench_agp_system.json"
    if args.profile is None:
        print("profiling (mpiexec -n 4 plexgt profile) ...", flush=True)
        launch(mpiexec(4, plexgt("profile", "--out", str(prof_path))), env=env, capture=False)
    prof = json.loads(Path(prof_path).read_text())
    measured = []
    spec = json.dumps({k: str(v) for k, v in dirs.items()})
    # timing in rounds, p = 1, 2, 4 interleaved, the fastest step over all rounds kept: the
    # other jobs' load drifts over minutes, and must not favour whichever p ran in a calm one
    rounds = max(1, args.rounds)
    steps = max(1, args.steps // rounds)
    if steps * rounds < MIN_PAIRS:
        print(f"warning: {steps * rounds} alternated pairs per option, fewer than {MIN_PAIRS}: "
              "no same-p option can be told apart, every one is 'within the noise'", flush=True)
    timed: dict[tuple[str, str, int], dict] = {}
    for k in range(rounds):
        for p in SCALES:
            out = args.work / f"measured_p{p}_time{k}.json"
            print(f"measuring p={p} (time, round {k + 1}/{rounds}) ...", flush=True)
            launch(mpiexec(p, module("perf.bench_agp", "--worker", spec, "--out", str(out),
                                     "--steps", str(steps), "--mode", "time")),
                   env=env, capture=False)
            for t in json.loads(out.read_text()):
                key = (t["graph"], t["strategy"], p)
                if key in timed:
                    t["step_s"] = timed[key]["step_s"] + t["step_s"]
                    t["t_iter"] = min(t["step_s"])
                    t["t_iter_median"] = float(np.median(t["step_s"]))
                timed[key] = t
    for p in SCALES:
        out = args.work / f"measured_p{p}_memory.json"
        print(f"measuring p={p} (memory) ...", flush=True)
        launch(mpiexec(p, module("perf.bench_agp", "--worker", spec, "--out", str(out),
                                 "--steps", "1", "--mode", "memory")),
               env=env_mem, capture=False)
        for m in json.loads(out.read_text()):
            t = timed[(m["graph"], m["strategy"], p)]
            t["peak_activation_bytes"] = m["peak_activation_bytes"]
            t["graph_rss_bytes"] = m["graph_rss_bytes"]
            measured.append(t)
    an = analyse(measured, prof, paired=True)
    summ = summarise(an)
    rows = an["rows"]
    mem_ratio = [r["predicted_activation_bytes"] / max(1, r["measured_activation_bytes"])
                 for r in rows]
    summ["activation_pred_over_measured_median"] = float(np.median(mem_ratio))
    summ["seconds"] = time.perf_counter() - t_start
    hw = hardware()
    payload = {
        "date": today(), "hardware": hw, "profile": str(prof_path),
        "profile_hardware": prof.get("hardware"), "profile_software": prof.get("software"),
        "model": MODEL, "steps": args.steps, "paired_steps": True,
        "graphs": {k: str(v) for k, v in dirs.items()},
        "notes": ("p = 2 and 4 run on a 2-core machine shared with other jobs (p = 4 "
                  "oversubscribed 2x); real graphs keep N and E, features projected to "
                  f"{PROJECTED_FEATURES} dims; synthetic SBM N scaled down with degree"),
        "measured": measured, "analysis": an, "summary": summ,
    }
    jpath = write_json("bench_agp.json", payload)
    plot(an, RESULTS_DIR / "bench_agp.png",
         f"AGP on {hw['cpu']} ({hw['usable_cores']} cores), gt h=64 4 heads 2 layers: "
         f"MAPE {100 * summ['mape']:.1f}%, AGP picks fastest {100 * summ['agp_hit_rate']:.0f}% "
         f"({100 * summ['agp_noise_hit_rate']:.0f}% within noise)")
    report(an, summ)
    print(f"wrote {jpath}")
    _result(summ, configs=len(measured), cpu=hw["cpu"].replace(" ", "_"),
            cores=hw["usable_cores"], seconds=summ["seconds"])


def _result(summ: dict, **extra: object) -> None:
    keys = ("mape", "mape_median", "agp_hit_rate", "agp_noise_hit_rate", "agp_within_10pct",
            "agp_max_slowdown", "agp_hit_rate_by_median", "agp_max_slowdown_by_median",
            "ties_5pct", "ties_noise", "resolved", "agp_hit_rate_resolved",
            "strategy_hit_rate",
            "strategy_noise_hit_rate")
    result_line(bench="agp", **{k: summ[k] for k in keys if summ.get(k) is not None},
                **{k: summ[k] for k in ("activation_pred_over_measured_median",) if k in summ},
                **extra)

if __name__ == "__main__":
    main()
