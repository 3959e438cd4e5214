"""The planner scored on this machine: predicted against measured step time and memory.

    .venv/bin/python -m perf.validate_plan --profile SYSTEM.json   # ~45 min on 2 cores
    .venv/bin/python -m perf.validate_plan --profile SYSTEM.json --steps 3 \
        --attention-scales 1,2,4                                    # ~25 min (trimmed)
    .venv/bin/python -m perf.validate_plan --cases physics-gcn --keep   # rerun one case

Coauthor Physics (34,493 nodes, 8,415 features, 0.39% nonzero: CSR input) and Amazon
Computers (13,752 nodes, 767 features, dense input) from ../shared/datasets/gnn-benchmark,
prepared by ``plexgt prep`` (auto layout), are trained on p = 1, 2, 3, 4 ranks (3 and 4
oversubscribe the 2 cores) in every configuration the search can run there: gcn on Physics
(2 layers, hidden 64) on every grid of p, each grid with two or three split axes also
with their rank order flipped (``parallel.axis_order``); gt (hidden 64, 4 heads, 2 blocks)
on both graphs with every strategy and gp_2d head axis; gps (the same) with every strategy,
its GCN path as the search picks it (grid 'auto') and 3D on the planner's grid. What a
configuration leaves open (order, block rows, ring pieces, attention row blocks) the plan
fills, as train does;
the configuration with everything 'auto' is the choice. Each is built by the task builder
``plexgt train`` uses and stepped by its training step (AdamW), one configuration after the
other in one mpiexec per (case, p), in two passes (the second in reverse order, so the VM's
drift weighs on all alike): 2 warm-up steps, ``--steps`` timed per pass (a step = the slowest
rank), the **median** of both passes' steps kept. Memory, in a pass of its own before
them (after an unmeasured warm-up configuration: a process's first steps grow it by ~48 MB
once): the peak resident set of each rank during the third step above its level before the
configuration was built, glibc made to map every block over 128 KiB on its own and to
return freed memory (so the resident set counts live memory); the timed passes run glibc as
a training run has it (blocks reused from the heap): timed under the memory mode, a step
paid a page fault per fresh tensor and took up to 1.6x as long as ``plexgt train``'s, and a
heap left so by a timed configuration inflated the next one's measured memory.
Ranks run cores/p threads each (p = 1: 2 threads on this VM), as ``plexgt train`` sets them
and the planner prices them.

Predictions are :func:`plexgt.plan.choose.choose`'s for the same configuration (the plan
``train`` would run) from the stored system profile of this machine (``--profile``; default
perf/results/bench_agp_system.json, measured by ``plexgt profile`` under ``mpiexec -n 4``).
Scored (:mod:`perf.plan_score`, the score bench_agp's measurements get too): MAPE of
predicted against the median step, overall and by p; per (case, p) with more than one
configuration, whether the choice's median step is within 10% of the fastest measured; per
case, the any-scale choice (p <= 4) against the fastest at any p; memory, predicted over
measured per configuration (median, range). Writes
perf/results/validate_plan.json and ends with one RESULT line.

The VM's speed drifts by tens of percent over minutes, between the (case, p) runs as well as
within them, and no prediction can know it. So the driver times a fixed one-thread probe (a
GEMM and a memory-bound pass, median of five) before and after each mpiexec: each row keeps
its run's mean (``probe_s``), and the summary gives the probe's spread over the whole
validation and, beside the raw MAPE, the MAPE with each measurement scaled to the median of the
rows' probes (``mape_drift_corrected``), which says how much of the error the drift explains.
The choices are scored on the raw medians: one at a (case, p) compares configurations of one
run, which one probe would scale alike; the any-scale choice compares runs, which drift can
reorder (uncorrected here, so that a choice is never scored on a corrected measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from perf import plan_score
from perf.harness import (
    RESULTS_DIR,
    ROOT,
    PeakRSS,
    gnn_benchmark,
    hardware,
    launch,
    malloc_mode,
    module,
    mpiexec,
    prepared,
    result_line,
    rss,
    today,
    trim_heap,
    write_json,
)
from plexgt.data.loader import PreparedGraph
from plexgt.distributed.bootstrap import init_distributed, shutdown
from plexgt.distributed.collectives import CommLedger
from plexgt.distributed.grid import Grid3D, factorizations
from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.choose import ModelShape, choose, gps_grid
from plexgt.plan.knobs import load_config
from plexgt.plan.plexus_cost import PROCESS_BASE_BYTES
from plexgt.tasks import build_task
from plexgt.tasks.task import (
    graph_sizes,
    machine_profile,
    plexus_coefficients_for,
    run_plan,
    system_model_for,
)
from plexgt.training import loop

CASES = {"physics-gcn": ("physics", "gcn"), "physics-gt": ("physics", "gt"),
         "computers-gt": ("computers", "gt"), "physics-gps": ("physics", "gps"),
         "computers-gps": ("computers", "gps")}
MODEL = {"gcn": {"model.name": "gcn", "model.hidden": 64, "model.layers": 2},
         "gt": {"model.name": "gt", "model.hidden": 64, "model.heads": 4, "model.layers": 2},
         "gps": {"model.name": "gps", "model.hidden": 64, "model.heads": 4,
                 "model.layers": 2}}
COMMON = {"progress": False, "model.dropout": 0.0, "model.input_dropout": 0.0,
          "optim.warmup_epochs": 0}
SCALES = (1, 2, 3, 4)


# -- configurations and predictions -------------------------------------------------------
def _cfg(data: Path, model: str, over: dict, profile: Path):  # noqa: ANN202 - TrainConfig
    return load_config(None, {"data": str(data), **COMMON, **MODEL[model],
                              "parallel.profile": str(profile), **over})


def configurations(data: Path, model: str, p: int, profile: Path) -> list[dict]:
    """Every configuration of ``model`` the search can run on p ranks, as config overrides,
    with the plan train makes of it: {'over', 'label', 'predicted_s', 'predicted_bytes',
    'chosen'}, one per distinct plan; the all-'auto' one marked chosen."""
    pg = PreparedGraph(data)
    cfg = _cfg(data, model, {}, profile)
    prof = machine_profile(cfg)
    grid3 = gps_grid(graph_sizes(pg), ModelShape.of(cfg), p, plexus_coefficients_for(prof))
    overs: list[dict] = [{}]
    if model == "gcn":
        for g in factorizations(p):
            overs.append({"parallel.grid": str(g)})
            alt = flipped_order(g)
            if alt:  # the same grid with its two split axes' ranks numbered the other way
                overs.append({"parallel.grid": str(g), "parallel.axis_order": alt})
    else:
        for c in default_registry():
            for a in c.layouts(p) if p > 1 else [1]:
                base = {"parallel.strategy": c.name, "parallel.head_parallel": a}
                overs.append(base)
                if model == "gps" and p > 1:  # and the GCN path 3D on the planner's grid
                    overs.append({**base, "parallel.grid": str(grid3)})
            if p == 1:
                break  # one rank: every strategy is the same step
    out: dict[str, dict] = {}
    for over in overs:
        rp = run_plan(_cfg(data, model, over, profile), pg, p)
        key = f"{rp.label} on {rp.scale}"
        row = out.setdefault(key, {"over": over, "label": rp.label, "scale": rp.scale,
                                   "predicted_s": rp.time_s,
                                   "predicted_bytes": rp.memory_bytes, "chosen": False})
        row["chosen"] = row["chosen"] or not over
    pg.close()
    return list(out.values())


def flipped_order(grid: Grid3D) -> str | None:
    """The rank order of ``grid`` (default order) with its split axes' nesting reversed, or
    None when fewer than two axes are split (every order then numbers the ranks alike)."""
    split = [a for a in grid.order if grid.dim(a) > 1]
    if len(split) < 2:
        return None
    rev = iter(reversed(split))
    return "".join(next(rev) if a in split else a for a in grid.order)


def any_scale_choice(data: Path, model: str, profile: Path) -> str:
    """The search's choice over every scale up to 4 ranks, as '<label> on <scale>'."""
    cfg = _cfg(data, model, {}, profile)
    pg = PreparedGraph(data)
    prof = machine_profile(cfg)
    rp = choose(graph_sizes(pg), ModelShape.of(cfg), 4, system_model_for(prof),
                plexus_coefficients_for(prof), any_scale=True).plan
    pg.close()
    return f"{rp.label} on {rp.scale}"


# -- the worker (under mpiexec) -----------------------------------------------------------
def _build(data: Path, model: str, over: dict, profile: Path, ctx):  # noqa: ANN001, ANN202
    cfg = _cfg(data, model, over, profile)
    task = build_task(cfg, ctx, CommLedger())
    return cfg, task, torch.optim.AdamW(task.model.parameters(), lr=1e-3)


def _memory(data: Path, model: str, over: dict, profile: Path, ctx) -> list[int]:  # noqa: ANN001
    """Every rank's peak resident set during the third step of one configuration above the
    level before it was built, glibc in the memory mode throughout
    (:func:`~perf.harness.malloc_mode`); freed on return. Measured before any configuration
    is timed: a heap the time mode left fragmented (blocks up to 32 MiB reused, trimmed at
    64 MiB) kept a later configuration's
    freed blocks resident, which inflated the measurement of every configuration after the
    first of a run by up to 2.5x (Physics gcn 4x1x1 at p = 4: 62 MB after a clean start,
    154 MB after three timed configurations)."""
    malloc_mode(memory=True)
    trim_heap()
    base = rss()
    cfg, task, opt = _build(data, model, over, profile, ctx)
    for e in range(2):  # warm-up (the optimizer's state appears in the first)
        loop.step(cfg, task, opt, e)
    with PeakRSS() as mem:
        loop.step(cfg, task, opt, 2)
    peaks = [None] * ctx.world_size
    dist.all_gather_object(peaks, mem.peak - base)
    return [int(x) for x in peaks]


def _time(data: Path, model: str, over: dict, profile: Path, steps: int, ctx  # noqa: ANN001
          ) -> dict:
    """Build, warm up and time one configuration on this rank (a step: the slowest rank's),
    glibc as a training run has it; freed on return."""
    malloc_mode(memory=False)
    cfg, task, opt = _build(data, model, over, profile, ctx)
    for e in range(2):
        loop.step(cfg, task, opt, e)
    times = [loop.step(cfg, task, opt, 2 + e)[1] for e in range(steps)]
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"step_s": t.tolist(), "label": task.plan.label}


def worker(args: argparse.Namespace) -> None:
    """A warm-up, a memory pass, then two timed passes over the configurations.

    The warm-up builds and steps the first configuration in the memory mode, unmeasured (a
    warm-up in the time mode left the heap as fragmented as a timed configuration): a
    process's first
    training steps grow its resident set by ~48 MB that stays (library workspaces, allocator
    arenas; 47-48 MB at p = 1, 2, 4 on Physics' gcn, beyond every live tensor), which would
    land on whichever configuration came first. The memory pass measures each configuration
    in the memory mode (:func:`_memory`). The timed passes, the second in reverse order, time
    ``steps`` steps of each: the VM's speed drifts by tens of percent over minutes, and a
    drift then weighs on every configuration alike instead of on whichever was measured
    during it. A configuration's median is over both passes' steps."""
    job = json.loads(Path(args.worker).read_text())
    ctx = init_distributed("gloo", timeout_s=900)
    configs = job["configs"]
    data, model, profile = Path(job["data"]), job["model"], Path(job["profile"])
    _memory(data, model, configs[0]["over"], profile, ctx)  # the warm-up, in memory mode
    runs: list[dict] = [{"measured_bytes": _memory(data, model, c["over"], profile, ctx)}
                        for c in configs]
    for rnd in range(2):
        order = range(len(configs)) if rnd == 0 else reversed(range(len(configs)))
        for i in order:
            r = _time(data, model, configs[i]["over"], profile, job["steps"], ctx)
            runs[i]["label"] = r["label"]
            runs[i]["step_s"] = runs[i].get("step_s", []) + r["step_s"]
    rows = []
    for c, r in zip(configs, runs):
        r["median_s"] = float(statistics.median(r["step_s"]))
        rows.append({**c, **r})
        if ctx.rank == 0:
            print(f"  p={ctx.world_size} {c['label']:<40} median {r['median_s']:.4f} s "
                  f"(predicted {c['predicted_s']:.4f}) memory "
                  f"{max(r['measured_bytes']) / 2**20:.0f} MB "
                  f"(predicted {_model_bytes({**c, 'model': model}) / 2**20:.0f})", flush=True)
    if ctx.rank == 0:
        Path(job["out"]).write_text(json.dumps(rows, indent=1) + "\n")
    shutdown(ctx)


# -- the driver -----------------------------------------------------------------------------
def prep(name: str, work: Path) -> Path:
    """The gnn-benchmark graph ``name`` as ``plexgt prep`` prepares it (auto layout)."""
    return prepared(work / name, ["--input", str(gnn_benchmark(name))])


def speed_probe(repeats: int = 5) -> float:
    """Median seconds of a fixed one-thread workload (a 384^3 GEMM and a pass over 32 MiB,
    each four times): how fast the VM runs now, compared between the runs of a validation."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(384, 384, generator=g)
        v = torch.randn(8 << 20, generator=g)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(4):
                (a @ a).sum()
                (v * 1.0001).sum()
            times.append(time.perf_counter() - t0)
        return float(statistics.median(times))
    finally:
        torch.set_num_threads(threads)


def measure(data: Path, model: str, p: int, configs: list[dict], profile: Path,
            steps: int) -> list[dict]:
    """Every configuration's steps on p ranks (one mpiexec), and the run's ``probe_s``: the
    mean of :func:`speed_probe` before and after it."""
    before = speed_probe()
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"data": str(data), "model": model, "configs": configs,
                                   "profile": str(profile), "steps": steps,
                                   "out": str(out)}))
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // p))}
        launch(mpiexec(p, module("perf.validate_plan", "--worker", str(job))), env=env,
               timeout=3600, capture=False)
        rows = json.loads(out.read_text())
    probe = (before + speed_probe()) / 2
    return [{**r, "probe_s": probe} for r in rows]


def drift(rows: list[dict]) -> dict | None:
    """The probe over the validation's runs, and the MAPE with every measurement scaled to the
    median probe speed; None when the rows have no probe (a run before it existed)."""
    if not rows or any("probe_s" not in r for r in rows):
        return None
    probes = [r["probe_s"] for r in rows]
    ref = statistics.median(probes)
    return {"probe_median_s": ref, "probe_min_s": min(probes), "probe_max_s": max(probes),
            "probe_spread": max(probes) / min(probes) - 1,
            "mape_drift_corrected": plan_score.mape(
                plan_score.ape(r["predicted_s"], r["median_s"] * ref / r["probe_s"])
                for r in rows)}


def _model_bytes(row: dict) -> int:
    """A row's predicted bytes beyond the process's own (the 3D model adds a fixed
    :data:`~plexgt.plan.plexus_cost.PROCESS_BASE_BYTES` for the interpreter and libraries,
    which the measurement, taken above the level before the build, does not see)."""
    return row["predicted_bytes"] - (PROCESS_BASE_BYTES if row["model"] == "gcn" else 0)


def _err(r: dict) -> float:
    """A row's prediction error against its median step."""
    return plan_score.ape(r["predicted_s"], r["median_s"])


def _decision(case: str, p: int | str, opts: list[dict], chosen: int | None,
              name: Callable[[dict], str]) -> dict:
    """The choice ``opts[chosen]`` among measured configurations, by median step (``chosen``
    None: the choice is a configuration nobody measured, as after repricing)."""
    row = {"case": case, "p": p, "pick": "(not measured)", "slower": None, "within": None,
           "options": len(opts)}
    if chosen is None:
        return {**row, "best": name(min(opts, key=lambda r: r["median_s"]))}
    d = plan_score.decision(chosen, {i: r["median_s"] for i, r in enumerate(opts)})
    return {**row, "pick": name(opts[chosen]), "best": name(opts[d["fastest"]]),
            "slower": d["slower"], "within": d["within"]}


def score(rows: list[dict], any_choice: dict[str, str]) -> dict:
    """The planner's score on these measurements (:func:`perf.plan_score.score`: MAPE against
    the median step; per (case, p) with more than one configuration, and per case over every
    p, whether the choice is within 10% of the fastest), by p and model, and the memory
    predicted over measured."""
    decisions = []
    for case in sorted({r["case"] for r in rows}):
        mine = [r for r in rows if r["case"] == case]
        for p in SCALES:
            opts = [r for r in mine if r["p"] == p]
            if len(opts) >= 2:
                chosen = next((i for i, r in enumerate(opts) if r["chosen"]), None)
                decisions.append(_decision(case, p, opts, chosen, lambda r: r["label"]))
        every = [f"{r['label']} on {r['p']}" for r in mine]
        if any_choice[case] in every:
            decisions.append(_decision(case, "any<=4", mine, every.index(any_choice[case]),
                                       lambda r: f"{r['label']} on {r['p']}"))
    mem = [_model_bytes(r) / max(r["measured_bytes"]) for r in rows
           if max(r["measured_bytes"]) > 0]
    scored = plan_score.score([_err(r) for r in rows], [d["slower"] for d in decisions])
    return {
        "mape": scored["mape"],
        "drift": drift(rows),
        "mape_by_p": {str(p): plan_score.mape(_err(r) for r in rows if r["p"] == p)
                      for p in SCALES if any(r["p"] == p for r in rows)},
        "mape_by_model": {m: plan_score.mape(_err(r) for r in rows if r["model"] == m)
                          for m in sorted({r["model"] for r in rows})},
        "decisions": decisions,
        "choice_within_10pct": scored["within_10pct"],
        "decisions_scored": scored["scored"],
        "memory_ratio_median": statistics.median(mem) if mem else None,
        "memory_ratio_min": min(mem) if mem else None,
        "memory_ratio_max": max(mem) if mem else None,
        "worst_time_misses": sorted(({"case": r["case"], "p": r["p"], "label": r["label"],
                                      "predicted_s": r["predicted_s"],
                                      "median_s": r["median_s"]} for r in rows),
                                    key=lambda r: -_err(r))[:8],
    }


def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def repredict(rows: list[dict], profile: Path, work: Path) -> dict[str, str]:
    """The stored measurements priced again from ``profile``: each row's prediction, which
    configuration is the choice at each (case, p), and the any-scale choices; nothing is
    measured."""
    any_choice = {}
    for case in sorted({r["case"] for r in rows}):
        name, model = CASES[case]
        data = work / name
        pg = PreparedGraph(data)
        any_choice[case] = any_scale_choice(data, model, profile)
        for p in SCALES:
            mine = [r for r in rows if r["case"] == case and r["p"] == p]
            if not mine:
                continue
            pick = run_plan(_cfg(data, model, {}, profile), pg, p).label
            for r in mine:
                rp = run_plan(_cfg(data, model, r["over"], profile), pg, p)
                r["predicted_s"], r["predicted_bytes"] = rp.time_s, rp.memory_bytes
                r["chosen"] = r["label"] == pick
        pg.close()
    return any_choice


def _result(s: dict, configurations: int) -> None:
    drift_fields = ({"mape_drift_corrected": s["drift"]["mape_drift_corrected"],
                     "probe_spread": s["drift"]["probe_spread"]} if s["drift"] else {})
    result_line(mape=s["mape"], **drift_fields, choice_within_10pct=s["choice_within_10pct"],
                decisions=s["decisions_scored"], memory_ratio_median=s["memory_ratio_median"],
                configurations=configurations)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--scales", default=",".join(map(str, SCALES)),
                    help="rank counts to run every case on")
    ap.add_argument("--attention-scales", default=None,
                    help="rank counts for the gt and gps cases (default: --scales)")
    ap.add_argument("--steps", type=int, default=4,
                    help="timed steps per configuration in each of the two passes")
    ap.add_argument("--profile", type=Path,
                    default=RESULTS_DIR / "bench_agp_system.json")
    ap.add_argument("--work", type=Path, default=Path("/tmp/plexgt-validate-plan"))
    ap.add_argument("--keep", action="store_true",
                    help="keep the stored result's rows of the cases not run now")
    ap.add_argument("--repredict", action="store_true",
                    help="measure nothing: price the stored run's configurations again "
                         "from --profile (and score them)")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.repredict:
        stored = json.loads((RESULTS_DIR / "validate_plan.json").read_text())
        rows = stored["rows"]
        any_choice = repredict(rows, args.profile, args.work)
        s = score(rows, any_choice)
        stored.update(profile=_rel(args.profile), any_scale_choices=any_choice, summary=s,
                      rows=rows, repredicted=today())
        write_json("validate_plan.json", stored)
        _result(s, len(rows))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    rows, any_choice = [], {}
    t0 = time.perf_counter()
    for case in args.cases.split(","):
        name, model = CASES[case]
        data = prep(name, args.work)
        any_choice[case] = any_scale_choice(data, model, args.profile)
        scales = args.scales if model == "gcn" else args.attention_scales or args.scales
        for p in map(int, scales.split(",")):
            configs = configurations(data, model, p, args.profile)
            print(f"{case} p={p}: {len(configs)} configurations", flush=True)
            for r in measure(data, model, p, configs, args.profile, args.steps):
                rows.append({"case": case, "graph": name, "model": model, "p": p, **r})
    stored = RESULTS_DIR / "validate_plan.json"
    if args.keep and stored.exists():  # the other cases' rows of the stored run
        old = json.loads(stored.read_text())
        ran = set(args.cases.split(","))
        rows += [r for r in old["rows"] if r["case"] not in ran]
        any_choice.update({k: v for k, v in old["any_scale_choices"].items()
                           if k not in ran})
    s = score(rows, any_choice)
    write_json("validate_plan.json", {
        "benchmark": "validate_plan", "date": today(), "hardware": hardware(),
        "profile": _rel(args.profile),
        "notes": "2-core VM shared with other jobs; p = 3, 4 oversubscribe the cores; a step "
                 "is the slowest rank's; median of the timed steps; memory = peak resident "
                 "set during a step above the level before the configuration was built",
        "steps": args.steps, "seconds": time.perf_counter() - t0,
        "any_scale_choices": any_choice, "summary": s, "rows": rows})
    _result(s, len(rows))


if __name__ == "__main__":
    main()
