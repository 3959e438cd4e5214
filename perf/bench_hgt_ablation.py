"""MegaGraph's ablation at small scale: hgt's layouts side by side on Amazon Computers.

    flock /tmp/plexgt-timing.lock .venv/bin/python -m perf.bench_hgt_ablation   # ~5-8 min
    .venv/bin/python -m perf.bench_hgt_ablation --quick        # a smoke run (~1 min)

MegaGraph's ablation (Computers, 32 layers, hidden 128, 32 heads, batch 256, 2 GPUs) found:
context parallelism (CP) cuts peak memory 5.2x at 13 % more time than DP / PP,
heterogeneous pipeline parallelism (PP) is the fastest, an even PP split is dominated by CP,
pure data parallelism (DP) is never on the time-memory frontier; and a 24-layer model on 4
GPUs puts ~65 % more memory on the first stage under an even split. Here: hgt with 16 layers,
hidden 64, 8 heads, sequences of N' = 256 nodes (64 targets, 2-hop context, 1 global node),
8 sequences a step (so dp = 1, 2, 4 divide them), dropout 0, float32, AdamW, and a
13,752 x D node-embedding table on the first stage with D = 64: the planner's memory model
puts the first stage of an even 4-stage split (K = 8) at 1.65x the others' mean at D = 64
(MegaGraph's ~65 %; D = 32 gives 1.43x, 128 gives 2.09x), so the excess is visible without
the table drowning the blocks.

For W = 2 and W = 4 ranks (one mpiexec each; W = 4 oversubscribes the 2 cores of this VM,
one thread a rank), five layouts, each from plexgt's planner (:func:`plexgt.plan.choose.
choose`, the plan ``plexgt plan --model hgt`` prints, priced from the system profile's measured
``batch`` table: ``plexgt profile`` under ``mpiexec -n 4`` on this VM, stored as
perf/results/hgt_ablation_system.json; a profile without one prices from counts) with some
keys fixed:

* ``cp``:       dp 1, pp 1, cp W (MegaGraph's baseline); K the search's.
* ``even_pp``:  pp W, the even partition, K the search's for pp = W.
* ``hetero_pp``: pp W, the search's memory-balanced partition: its fastest partition of
  least peak memory per rank among every pp = W partition (the frontier's memory end;
  without a memory limit the search's fastest pp = W partition is the even one here, see
  the story), at the same K.
* ``dp``:       dp W, K the search's.
* ``choice``:   nothing fixed: the search's own pick (shares a measurement with the layout
  it equals).
* ``dp_weak``:  dp W on W·8 sequences a step, MegaGraph's data parallelism (each replica
  the single process's 8 sequences; plexgt's ``dp`` splits one step's 8 instead): its memory
  is what MegaGraph compares CP with; its step does W times the work
  (``time_per_cp_step_vs_cp`` divides by W). Not in the frontier or the pairwise ratios.

Each is built by the task builder ``plexgt train`` uses and stepped as its loop steps a
batch task (AdamW, clipping), one after the other in one mpiexec per W. Memory, in a pass of
its own first (after one unrecorded configuration: what a process allocates once): the peak
resident set of each rank during the third step above its level before the configuration
was built, glibc made to map every block over 128 KiB on its own and to return freed memory
(perf/validate_plan.py's method: on the CPU the resident set is the tensor tracker), reported
per rank, per pipeline stage (max over its ranks) and as the max over ranks. Time, in two
passes (the second in reverse order, against the VM's drift), under training's allocator: 2
warm-up steps, then ``--steps`` steps per pass, each the slowest rank's (a barrier before
each); the median of both passes' steps. The load average (/proc/loadavg) is recorded
before and after each W. Predicted: the step time from the profile's measured table, the
memory per stage as counted (the tensors' bytes, :func:`~plexgt.plan.batch_fits.
default_profile`'s memory terms), comparable with the peak tensors measured; the table's
memory fit prices a CPU rank's resident set (allocator slack included: 1.5-1.9x the counts
in its fits), which the resident column shows.

Writes perf/results/hgt_ablation.json and ends with one RESULT line (hgt_ablation.md is the
story, written by hand).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function

from perf.harness import (
    DATASETS_DIR,
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
from plexgt.plan.batch_fits import default_profile
from plexgt.plan.batch_search import BatchCandidate, BatchSearch, price
from plexgt.plan.batch_table import from_table
from plexgt.plan.choose import ModelShape, batch_shape, choose
from plexgt.plan.knobs import load_config
from plexgt.plan.pareto import frontier
from plexgt.tasks import build_task
from plexgt.tasks.task import (
    graph_sizes,
    machine_profile,
    plexus_coefficients_for,
    system_model_for,
)
from plexgt.training.optim import clip_gradients, make_optimizer

MODEL = {"model.name": "hgt", "model.layers": 16, "model.hidden": 64, "model.heads": 8,
         "model.node_embedding": 64, "model.dropout": 0.0, "model.input_dropout": 0.0,
         "batch.size": 256, "batch.targets": 64, "batch.sequences": 8, "progress": False}
QUICK = {**MODEL, "model.layers": 4, "model.hidden": 32, "model.heads": 4,
         "model.node_embedding": 16, "batch.size": 64, "batch.targets": 16,
         "batch.sequences": 4}
WORLDS = (2, 4)
LAYOUTS = ("cp", "even_pp", "hetero_pp", "dp", "choice", "dp_weak")
COMPARED = ("cp", "even_pp", "hetero_pp", "dp")
"""The layouts of one step of G sequences (the frontier and the pairwise ratios)."""
PROFILE = RESULTS_DIR / "hgt_ablation_system.json"
SPLIT = ROOT / "configs" / "splits" / "amazon-computer_split.npz"
WARMUP = 2
MEASURED = "bench_hgt_ablation.measured_step"
"""The profiler region of the step whose tensor peak is measured."""


# -- the layouts and their predictions ------------------------------------------------------
def _cfg(data: Path, model: dict, profile: Path, over: dict | None = None):  # noqa: ANN202
    return load_config(None, {"data": str(data), **model, "parallel.profile": str(profile),
                              **(over or {})})


def _search(data: Path, model: dict, profile: Path, world: int, fixed: dict
            ) -> tuple[BatchCandidate, BatchSearch]:
    """The planner's choice on ``world`` ranks with the layout keys ``fixed`` (config
    overrides), as ``plexgt plan`` makes it, and the search behind it."""
    cfg = _cfg(data, model, profile, fixed)
    pg = PreparedGraph(data)
    prof = machine_profile(cfg)
    try:
        rp, found = choose(graph_sizes(pg, cfg.model.node_embedding), ModelShape.of(cfg),
                           world, system_model_for(prof), plexus_coefficients_for(prof),
                           batch_table=prof.get("batch"))
    finally:
        pg.close()
    assert isinstance(found, BatchSearch) and found.best is not None
    assert found.best.label == rp.label
    return found.best, found


def _row(c: BatchCandidate) -> dict:
    """A layout as config overrides, with the planner's prediction."""
    return {"label": c.label, "dp": c.dp, "pp": c.pp, "cp": c.cp, "K": c.micro_batches,
            "stages": list(c.stages), "predicted_s": c.step_s,
            "predicted_stage_bytes": list(c.stage_bytes),
            "over": {"parallel.dp": str(c.dp), "parallel.pp": str(c.pp),
                     "parallel.cp": str(c.cp), "parallel.micro_batches": c.micro_batches,
                     "parallel.stages": ",".join(map(str, c.stages))}}


def layouts(data: Path, model: dict, profile: Path, world: int) -> dict[str, dict]:
    """The five layouts of the module doc on ``world`` ranks, each with its prediction; the
    pp = W search's fastest partition too (``pp_fastest``, predicted only)."""
    cp, _ = _search(data, model, profile, world, {"parallel.dp": "1", "parallel.pp": "1",
                                                  "parallel.cp": str(world)})
    fast, found = _search(data, model, profile, world, {"parallel.pp": str(world)})
    layers = int(model["model.layers"])
    if layers % world:
        raise ValueError(f"{layers} layers do not split evenly over {world} stages")
    cfg = _cfg(data, model, profile)
    pg = PreparedGraph(data)
    bs = batch_shape(graph_sizes(pg, cfg.model.node_embedding), ModelShape.of(cfg))
    pg.close()
    # priced as choose prices: the system profile's measured batch table where it has one
    # (plexgt profile's), else the counted default profile on its rates
    sysp = machine_profile(cfg)
    sysm = system_model_for(sysp)
    prof = from_table(sysp["batch"], bs, sysm.host) if sysp.get("batch") else \
        default_profile(bs, sysm)
    even = price(bs, prof, fast.mesh, [layers // world] * world)
    lean = min((c for c in found.candidates if c.micro_batches == fast.micro_batches),
               key=lambda c: (c.peak_bytes, c.step_s))
    dp, _ = _search(data, model, profile, world, {"parallel.dp": str(world)})
    choice, whole = _search(data, model, profile, world, {})
    weak_seq = {"batch.sequences": str(int(model["batch.sequences"]) * world)}
    weak, _ = _search(data, model, profile, world, {"parallel.dp": str(world), **weak_seq})
    out = {"cp": _row(cp), "even_pp": _row(even), "hetero_pp": _row(lean), "dp": _row(dp),
           "choice": _row(choice), "dp_weak": _row(weak)}
    out["dp_weak"]["over"].update(weak_seq)
    # memory as counted (the tensors' bytes, what this bench measures): the table's memory
    # fit prices a CPU rank's resident set (allocator slack, libraries), ~1.9x the tensors
    counted = default_profile(bs, sysm)
    for n, c in (("cp", cp), ("even_pp", even), ("hetero_pp", lean), ("dp", dp),
                 ("choice", choice)):
        out[n]["predicted_stage_bytes"] = list(price(bs, counted, c.mesh, c.stages).stage_bytes)
    wbs = replace(bs, sequences=bs.sequences * world)
    out["dp_weak"]["predicted_stage_bytes"] = list(
        price(wbs, default_profile(wbs, sysm), weak.mesh, weak.stages).stage_bytes)
    for n, r in out.items():
        r["sequences"] = int((weak_seq if n == "dp_weak" else model)["batch.sequences"])
    out["choice"]["frontier"] = [c.label for c in whole.frontier]
    out["even_pp"]["pp_fastest"] = fast.label
    return out


def same_layout(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("dp", "pp", "cp", "K", "stages", "sequences"))


# -- the worker (under mpiexec) -----------------------------------------------------------
def _build(data: Path, model: dict, profile: Path, over: dict, ctx):  # noqa: ANN001, ANN202
    cfg = _cfg(data, model, profile, over)
    task = build_task(cfg, ctx, CommLedger())
    return cfg, task, make_optimizer(cfg, task.model)


def _step(cfg, task, opt, i: int) -> float:  # noqa: ANN001
    """One optimizer step as the loop takes a batch task's (train_step, clipping, AdamW):
    this rank's seconds, from a barrier."""
    dist.barrier()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    task.train_step(0, i % task.steps(0))
    if cfg.optim.clip_norm > 0:
        clip_gradients(task.model, cfg.optim.clip_norm)
    opt.step()
    return time.perf_counter() - t0


def _memory(job: dict, over: dict, ctx) -> list[list[int]]:  # noqa: ANN001
    """[peak resident bytes above the pre-build level, stage, dp, cp] of every rank in the
    third step of one layout, glibc in the memory mode throughout (validate_plan's method)."""
    malloc_mode(memory=True)
    trim_heap()
    base = rss()
    cfg, task, opt = _build(Path(job["data"]), job["model"], Path(job["profile"]), over, ctx)
    for i in range(WARMUP):
        _step(cfg, task, opt, i)
    gc.collect()
    with PeakRSS() as mem:
        _step(cfg, task, opt, WARMUP)
    m = task.model
    got: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(got, [int(mem.peak - base), m.p, m.d, m.c])
    del task, opt
    return got


def _allocations(prof: profile) -> tuple[list[tuple[int, int]], int, tuple[int, int]]:
    """The live tensor bytes after every CPU allocation and free the profiler saw, as
    (time ns, bytes) in time order; the bytes of allocations it never saw freed; the (start,
    end) ns of the ``MEASURED`` region.

    The profiler reports each c10 CPU allocation and each free made on a thread where it
    is on (pointer and size); the bytes are counted here from 0 at the profile's start,
    frees matched to allocations by pointer (frees of older blocks are left out). A block
    freed on another thread is never reported freed: gloo's worker thread sometimes drops
    the last reference to the gradient all-reduce's flat bucket (4 B a parameter, 5.9 MB for
    the whole model), and c10's own running total then kept it for the rest of the run (cp
    at W = 2 measured 96.8 then 91.2 MiB). So a block still unfreed when the profile ends,
    after the layout was deleted and collected inside it, is counted as never alive (the
    buckets live after the backward's peak), and its bytes are returned to report."""
    raw, window = [], (0, 0)
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.typed[0] == _EventType.Allocation and e.typed[1].device.type == "cpu":
            raw.append((e.start_time_ns, int(e.typed[1].ptr), int(e.typed[1].alloc_size)))
        elif e.name == MEASURED:
            window = (e.start_time_ns, e.end_time_ns)
    raw.sort()
    live: dict[int, int] = {}  # ptr -> index in raw of its allocation
    freed: set[int] = set()
    for i, (_, ptr, size) in enumerate(raw):
        if size > 0:
            live[ptr] = i  # an unseen free of the block before at this address
        elif ptr in live:
            freed.add(live.pop(ptr))
    lost = sum(raw[i][2] for i in live.values())
    out, total, alive = [], 0, set()
    for i, (t, ptr, size) in enumerate(raw):
        if size > 0 and i in freed:
            total += size
            alive.add(ptr)
        elif size < 0 and ptr in alive:
            total += size
            alive.discard(ptr)
        else:
            continue
        out.append((t, total))
    return out, lost, window


def _tensors(job: dict, over: dict, ctx) -> list[list[int]]:  # noqa: ANN001
    """[peak tensor bytes, bytes live at the step's start, bytes never seen freed, stage, dp,
    cp] of every rank in the third step of one layout: torch's profiler tracks every CPU
    allocation from before the build (parameters, optimizer state, activations, the
    sampler's stacked rows; :func:`_allocations`), so the peak is what a GPU's
    ``max_memory_allocated`` counts, without the sampler's numpy caches and the process's
    libraries, which the resident set holds."""
    trim_heap()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        cfg, task, opt = _build(Path(job["data"]), job["model"], Path(job["profile"]), over,
                                ctx)
        for i in range(WARMUP):
            _step(cfg, task, opt, i)
        gc.collect()
        with record_function(MEASURED):
            _step(cfg, task, opt, WARMUP)
        m = task.model
        coords = [m.p, m.d, m.c]
        del task, opt, m
        gc.collect()
    events, lost, (lo, hi) = _allocations(prof)
    before = [total for t, total in events if t < lo]
    start = before[-1] if before else 0
    peak = max([start, *(total for t, total in events if lo <= t <= hi)])
    got: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(got, [int(peak), int(start), int(lost), *coords])
    return got


def _time(job: dict, over: dict, ctx) -> list[float]:  # noqa: ANN001
    """``steps`` step times (the slowest rank's) after the warm-up, training's allocator."""
    malloc_mode(memory=False)
    cfg, task, opt = _build(Path(job["data"]), job["model"], Path(job["profile"]), over, ctx)
    for i in range(WARMUP):
        _step(cfg, task, opt, i)
    t = torch.tensor([_step(cfg, task, opt, WARMUP + i) for i in range(job["steps"])],
                     dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    del task, opt
    return t.tolist()


def worker(path: Path) -> None:
    job = json.loads(path.read_text())
    ctx = init_distributed("gloo", timeout_s=900)
    runs = job["runs"]
    _memory(job, runs[-1]["over"], ctx)  # unrecorded: what a process allocates once
    for r in runs:  # the resident sets first: the profiler's records would be in them
        r["rss"] = _memory(job, r["over"], ctx)
    for r in runs:
        r["ranks"] = _tensors(job, r["over"], ctx)
        if ctx.rank == 0:
            print(f"  W={ctx.world_size} {r['name']:<10} {r['label']:<30} tensors "
                  f"{max(x[0] for x in r['ranks']) / 2**20:.1f} MiB, resident "
                  f"{max(x[0] for x in r['rss']) / 2**20:.1f} MiB", flush=True)
    for rnd in range(2):
        for r in runs if rnd == 0 else reversed(runs):
            r["step_s"] = r.get("step_s", []) + _time(job, r["over"], ctx)
    if ctx.rank == 0:
        Path(job["out"]).write_text(json.dumps(runs) + "\n")
    shutdown(ctx)


# -- the driver -----------------------------------------------------------------------------
def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def measure(data: Path, model: dict, profile: Path, world: int, runs: list[dict],
            steps: int) -> list[dict]:
    """Every run's memory and step times on ``world`` ranks (one mpiexec)."""
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"data": str(data), "model": model, "profile": str(profile),
                                   "runs": runs, "steps": steps, "out": str(out)}))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
        launch(mpiexec(world, module("perf.bench_hgt_ablation", "--worker", str(job))),
               env=env, timeout=1800, capture=False)
        return json.loads(out.read_text())


def stage_peaks(ranks: list[list[int]], pp: int) -> list[int]:
    """Per pipeline stage: the largest peak of its ranks."""
    return [max(r[0] for r in ranks if r[-3] == s) for s in range(pp)]


def excess(stages: list[float]) -> float | None:
    """Stage 0 over the mean of the others, less 1 (None with one stage)."""
    if len(stages) < 2:
        return None
    return stages[0] / (sum(stages[1:]) / (len(stages) - 1)) - 1


def summarize(rows: dict[str, dict]) -> dict[str, Any]:
    """Ratios (to CP and pairwise, measured and predicted), the measured frontier, the
    first stage's excess and MegaGraph's four claims, for one W."""
    for r in rows.values():
        r["median_s"] = float(statistics.median(r["step_s"]))
        half = len(r["step_s"]) // 2  # the two passes' medians: the VM's drift between them
        r["pass_medians_s"] = [float(statistics.median(r["step_s"][:half])),
                               float(statistics.median(r["step_s"][half:]))]
        r["stage_bytes"] = stage_peaks(r["ranks"], r["pp"])
        r["peak_bytes"] = max(x[0] for x in r["ranks"])
        r["unseen_free_bytes"] = max(x[2] for x in r["ranks"])
        r["rss_stage_bytes"] = stage_peaks(r["rss"], r["pp"])
        r["rss_peak_bytes"] = max(x[0] for x in r["rss"])
        r["predicted_peak_bytes"] = max(r["predicted_stage_bytes"])
    base = rows["cp"]
    for r in rows.values():
        r["time_vs_cp"] = r["median_s"] / base["median_s"]
        r["time_per_cp_step_vs_cp"] = r["time_vs_cp"] * base["sequences"] / r["sequences"]
        r["memory_vs_cp"] = r["peak_bytes"] / base["peak_bytes"]
        r["rss_vs_cp"] = r["rss_peak_bytes"] / base["rss_peak_bytes"]
        r["predicted_time_vs_cp"] = r["predicted_s"] / base["predicted_s"]
        r["predicted_memory_vs_cp"] = r["predicted_peak_bytes"] / base["predicted_peak_bytes"]
        r["predicted_over_measured_s"] = r["predicted_s"] / r["median_s"]
        r["predicted_over_measured_bytes"] = r["predicted_peak_bytes"] / r["peak_bytes"]
    names = list(COMPARED)
    pairs = {f"{a}/{b}": {"time": rows[a]["median_s"] / rows[b]["median_s"],
                          "memory": rows[a]["peak_bytes"] / rows[b]["peak_bytes"]}
             for a in names for b in names if a != b}
    pts = [rows[n] for n in names]
    front = [names[i] for i in frontier(pts, lambda r: r["median_s"],
                                        lambda r: r["peak_bytes"])]
    pfront = [names[i] for i in frontier(pts, lambda r: r["predicted_s"],
                                         lambda r: r["predicted_peak_bytes"])]
    fastest = min(names, key=lambda n: rows[n]["median_s"])
    cp, dp, even, weak = rows["cp"], rows["dp"], rows["even_pp"], rows["dp_weak"]
    ex = {k: {"measured": excess(rows[k]["stage_bytes"]),
              "predicted": excess(rows[k]["predicted_stage_bytes"])}
          for k in ("even_pp", "hetero_pp")}
    return {
        "pairwise_measured": pairs, "frontier_measured": front, "frontier_predicted": pfront,
        "fastest_measured": fastest,
        "choice_vs_fastest": rows["choice"]["median_s"] / rows[fastest]["median_s"],
        "first_stage_excess": ex,
        "claims": {
            "cp_memory_cut_vs_dp": dp["peak_bytes"] / cp["peak_bytes"],
            "cp_memory_cut_vs_even_pp": even["peak_bytes"] / cp["peak_bytes"],
            "cp_memory_cut_vs_dp_weak": weak["peak_bytes"] / cp["peak_bytes"],
            "cp_time_over_dp": cp["median_s"] / dp["median_s"],
            "cp_time_over_even_pp": cp["median_s"] / even["median_s"],
            "hetero_pp_fastest": fastest == "hetero_pp",
            "even_pp_dominated_by_cp": (cp["median_s"] <= even["median_s"]
                                        and cp["peak_bytes"] <= even["peak_bytes"]),
            "dp_off_frontier": "dp" not in front}}


def prep(work: Path, split: Path, datasets: Path) -> tuple[Path, str]:
    """Amazon Computers as the recipes prepare it (symmetrized, row-normalised features,
    tunedGNN's split where its file is fetched, else prep's own split)."""
    args = ["--input", str(gnn_benchmark("computers", datasets)), "--symmetrize",
            "--normalize-features", "row"]
    note = f"split file {split.name}"
    if split.exists():
        args += ["--split-file", str(split)]
    else:
        note = f"prep's default split ({split} not fetched: data_prep/tunedgnn-splits.sh)"
    return prepared(work / "computers", args), note


def prepared_from(data: Path) -> Any:
    """The prepared graph's source (input, split file) as its manifest records it."""
    with PreparedGraph(data) as pg:
        return pg.manifest.get("source")


def table(rows: dict[str, dict]) -> list[str]:
    out = []
    for n, r in rows.items():
        st = "/".join(f"{b / 2**20:.0f}" for b in r["stage_bytes"])
        pst = "/".join(f"{b / 2**20:.0f}" for b in r["predicted_stage_bytes"])
        out.append(f"  {n:<10} {r['label']:<28} {r['median_s']:7.3f} s ({r['time_vs_cp']:.2f}x"
                   f" cp; pred {r['predicted_s']:.3f}) peak {r['peak_bytes'] / 2**20:6.1f} MiB "
                   f"({r['memory_vs_cp']:.2f}x cp; pred {r['predicted_peak_bytes'] / 2**20:.1f})"
                   f" stages {st} (pred {pst}); resident {r['rss_peak_bytes'] / 2**20:.1f} MiB"
                   f" ({r['rss_vs_cp']:.2f}x cp)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--prepared", type=Path, help="a prepared Amazon Computers (else prepped "
                    "into --work from the datasets folder)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/plexgt-bench-hgt-ablation"))
    ap.add_argument("--profile", type=Path, default=PROFILE,
                    help="the system profile the planner prices with")
    ap.add_argument("--datasets", type=Path, default=DATASETS_DIR,
                    help="where gnn-benchmark/ is (from a worktree under /work/wt: "
                    "/work/shared/datasets)")
    ap.add_argument("--split-file", type=Path, default=SPLIT)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per pass (2 passes)")
    ap.add_argument("--worlds", type=int, nargs="+", default=list(WORLDS))
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 layers, hidden 32, "
                    "sequences of 64, W = 2, 1 step a pass; writes hgt_ablation_quick.json")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    t0 = time.perf_counter()
    model = QUICK if args.quick else MODEL
    worlds, steps = ([2], 1) if args.quick else (args.worlds, args.steps)
    if args.prepared:
        data, split = args.prepared, "as prepared (--prepared)"
    else:
        data, split = prep(args.work, args.split_file, args.datasets)
    out: dict[str, Any] = {"benchmark": "hgt_ablation", "date": today(),
                           "hardware": hardware(), "omp_threads_per_rank": 1,
                           "model": model, "data": str(data), "split": split,
                           "prepared_from": prepared_from(data),
                           "profile": str(args.profile), "steps_per_pass": steps,
                           "worlds": {}}
    for w in worlds:
        plan = layouts(data, model, args.profile, w)
        runs = []
        for n in LAYOUTS:
            same = next((m for m in runs if same_layout(m, plan[n])), None)
            if same is not None:
                plan[n]["same_as"] = same["name"]
            else:
                runs.append({"name": n, **plan[n]})
        before = loadavg()
        names = ", ".join(f"{r['name']} {r['label']}" for r in runs)
        print(f"W={w}: {names} "
              f"(load {before})", flush=True)
        got = {r["name"]: r for r in measure(data, model, args.profile, w, runs, steps)}
        rows = {n: {**got[plan[n].get("same_as", n)], **plan[n], "name": n} for n in LAYOUTS}
        s = summarize(rows)
        out["worlds"][str(w)] = {"loadavg_before": before, "loadavg_after": loadavg(),
                                 "oversubscribed": w > (os.cpu_count() or 1),
                                 "rows": rows, "summary": s}
        print("\n".join(table(rows)), flush=True)
        print(f"  W={w} claims: {s['claims']}; first stage excess {s['first_stage_excess']}",
              flush=True)
    out["seconds"] = time.perf_counter() - t0
    write_json("hgt_ablation_quick.json" if args.quick else "hgt_ablation.json", out)
    fields: dict[str, Any] = {}
    for w, res in out["worlds"].items():
        s, rows = res["summary"], res["rows"]
        c = s["claims"]
        fields.update({
            f"w{w}_cp_mem_cut_dp": c["cp_memory_cut_vs_dp"],
            f"w{w}_cp_mem_cut_pp": c["cp_memory_cut_vs_even_pp"],
            f"w{w}_cp_time_over_dp": c["cp_time_over_dp"],
            f"w{w}_fastest": s["fastest_measured"],
            f"w{w}_even_excess": s["first_stage_excess"]["even_pp"]["measured"],
            f"w{w}_hetero_excess": s["first_stage_excess"]["hetero_pp"]["measured"],
            f"w{w}_choice": rows["choice"]["label"].replace(" ", "_"),
            f"w{w}_choice_vs_fastest": s["choice_vs_fastest"],
            f"w{w}_dp_off_frontier": c["dp_off_frontier"]})
    result_line(**fields, seconds=out["seconds"])


if __name__ == "__main__":
    main()
