"""Does the planner price deep models' memory? Predicted against measured peak per rank.

    .venv/bin/python -m perf.bench_depth_memory          # ~5-8 min on 2 cores

gcn (residual 'identity', LayerNorm, input Linear and classifier) and gt (its residual
post-LayerNorm blocks) at 2, 6 and 12 layers, each with and without activation checkpointing
(``model.checkpoint = 'block'``), on a synthetic SBM graph (20,000 nodes, 200,000 edges, 64
features, 8 classes, hidden 64, 4 heads), at p = 1 and 2 ranks (one mpiexec per p, the
configurations one after the other in it). Each is built by the task builder ``plexgt
train`` uses and stepped by its training step (AdamW, dropout 0); memory is measured as
perf/validate_plan.py measures it: the peak resident set of each rank during the third step
above its level before the configuration was built, glibc made to map every block over 128
KiB on its own and to return freed memory (so the resident set counts live memory), after
one unrecorded configuration (what a process allocates once is not any model's). The
prediction is the plan ``train`` makes of the same configuration (``RunPlan.memory_bytes``,
less the 3D model's fixed process base, which the measurement above the pre-build level
does not see), from perf/results/validate_plan_system.json.

Writes perf/results/bench_depth_memory.{json,md} and ends with one RESULT line: how many
configurations are predicted within 15 % of measured, the median and range of predicted
over measured, and checkpointing's saving at 12 layers, measured and predicted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from perf.harness import (
    RESULTS_DIR,
    PeakRSS,
    hardware,
    launch,
    malloc_mode,
    module,
    mpiexec,
    prep_sbm,
    result_line,
    rss,
    today,
    trim_heap,
    write_json,
    write_text,
)
from plexgt.data.loader import PreparedGraph
from plexgt.distributed.bootstrap import init_distributed, shutdown
from plexgt.distributed.collectives import CommLedger
from plexgt.plan.knobs import load_config
from plexgt.plan.plexus_cost import PROCESS_BASE_BYTES
from plexgt.tasks import build_task
from plexgt.training import loop

MODELS = {"gcn": {"model.name": "gcn", "model.residual": "identity", "model.norm": "layer",
                  "model.input_proj": True, "model.head": True},
          "gt": {"model.name": "gt", "model.heads": 4, "model.norm": "layer"}}
COMMON = {"progress": False, "model.dropout": 0.0, "model.input_dropout": 0.0,
          "model.hidden": 64, "optim.warmup_epochs": 0}
DEPTHS = (2, 6, 12)
SCALES = (1, 2)
PROFILE = RESULTS_DIR / "validate_plan_system.json"
GRAPH = dict(nodes=20_000, edges=200_000, classes=8, features=64)


def configs() -> list[dict]:
    return [{"model": m, "layers": n, "checkpoint": c}
            for m in MODELS for n in DEPTHS for c in ("none", "block")]


def _cfg(data: Path, c: dict):  # noqa: ANN202 - TrainConfig
    return load_config(None, {"data": str(data), **COMMON, **MODELS[c["model"]],
                              "model.layers": c["layers"], "model.checkpoint": c["checkpoint"],
                              "parallel.profile": str(PROFILE)})


def _one(data: Path, c: dict, ctx) -> dict:  # noqa: ANN001 - DistContext
    """This configuration's peak above the pre-build level on every rank, and the plan's
    prediction."""
    cfg = _cfg(data, c)
    malloc_mode(memory=True)
    trim_heap()
    base = rss()
    task = build_task(cfg, ctx, CommLedger())
    opt = torch.optim.AdamW(task.model.parameters(), lr=1e-3)
    for e in range(2):  # warm-up (the optimizer's state appears in the first)
        loop.step(cfg, task, opt, e)
    t0 = time.perf_counter()
    with PeakRSS() as mem:
        loop.step(cfg, task, opt, 2)
    step_s = time.perf_counter() - t0
    peaks: list = [None] * ctx.world_size
    dist.all_gather_object(peaks, mem.peak - base)
    plan = task.plan
    pred = plan.memory_bytes - (PROCESS_BASE_BYTES if c["model"] == "gcn" else 0)
    del task, opt
    return {**c, "p": ctx.world_size, "label": plan.label, "step_s": step_s,
            "measured_bytes": [int(x) for x in peaks], "predicted_bytes": int(pred)}


def worker(args: argparse.Namespace) -> None:
    job = json.loads(Path(args.worker).read_text())
    ctx = init_distributed("gloo", timeout_s=900)
    # the process's first configuration also pays what a process allocates once and keeps
    # (thread pools, the kernels' workspaces: ~50 MB here, validate_plan's ~45): measured
    # once unrecorded, so that every row sees the same process
    _one(Path(job["data"]), job["configs"][0], ctx)
    rows = [_one(Path(job["data"]), c, ctx) for c in job["configs"]]
    if ctx.rank == 0:
        Path(job["out"]).write_text(json.dumps(rows) + "\n")
    shutdown(ctx)


def measure(data: Path, p: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "rows.json"
        job.write_text(json.dumps({"data": str(data), "configs": configs(), "out": str(out)}))
        launch(mpiexec(p, module("perf.bench_depth_memory", "--worker", str(job))),
               env={**os.environ, "OMP_NUM_THREADS": str(max(1, 2 // p)),
                    "OMP_WAIT_POLICY": "PASSIVE"}, capture=False)
        return json.loads(out.read_text())


def summary(rows: list[dict]) -> dict:
    for r in rows:
        r["measured_max"] = max(r["measured_bytes"])
        r["ratio"] = r["predicted_bytes"] / r["measured_max"]
    ratios = [r["ratio"] for r in rows]
    within = [r for r in rows if abs(r["ratio"] - 1) <= 0.15]

    def at(m: str, n: int, ck: str, p: int, key: str) -> float:
        return next(r[key] for r in rows if (r["model"], r["layers"], r["checkpoint"],
                                             r["p"]) == (m, n, ck, p))

    saving = {f"{m}-p{p}": {k: 1 - at(m, 12, "block", p, k) / at(m, 12, "none", p, k)
                            for k in ("measured_max", "predicted_bytes")}
              for m in MODELS for p in SCALES}
    return {"within_15pct": len(within), "configurations": len(rows),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "checkpoint_saving_12_layers": saving,
            "misses": [f"{r['model']} L={r['layers']} {r['checkpoint']} p={r['p']}: "
                       f"{r['ratio']:.2f}" for r in rows if r not in within]}


def table(rows: list[dict]) -> str:
    out = ["| model | layers | checkpoint | p | plan | measured MiB (max rank) | "
           "predicted MiB | predicted / measured |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['layers']} | {r['checkpoint']} | {r['p']} | "
                   f"{r['label']} | {r['measured_max'] / 2**20:.1f} | "
                   f"{r['predicted_bytes'] / 2**20:.1f} | {r['ratio']:.2f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, default=Path("/tmp/plexgt-bench-depth"))
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    t0 = time.perf_counter()
    data = prep_sbm(args.work / "sbm", GRAPH["nodes"], GRAPH["edges"], GRAPH["classes"],
                    GRAPH["features"])
    rows = [r for p in SCALES for r in measure(data, p)]
    s = summary(rows)
    pg = PreparedGraph(data)
    write_json("bench_depth_memory.json", {
        "benchmark": "bench_depth_memory", "date": today(), "hardware": hardware(),
        "graph": {**GRAPH, "N": pg.N, "E": pg.E}, "profile": str(PROFILE.name),
        "notes": "2-core VM shared with other jobs; memory = peak resident set during the "
                 "third step above the level before the configuration was built (glibc "
                 "returning freed memory); predicted = the plan's memory_bytes (gcn: less "
                 "the fixed process base)",
        "seconds": time.perf_counter() - t0, "summary": s, "rows": rows})
    pg.close()
    write_text("bench_depth_memory.md", f"# bench_depth_memory ({today()})\n\n"
               "Generated by perf/bench_depth_memory.py (module docstring: the method).\n\n"
               + table(rows) + f"\n{s['within_15pct']} of {s['configurations']} within 15 %; "
               f"predicted / measured median {s['ratio_median']:.2f} "
               f"(range {s['ratio_min']:.2f}-{s['ratio_max']:.2f}).\n")
    sv = s["checkpoint_saving_12_layers"]
    result_line(within_15pct=s["within_15pct"], configurations=s["configurations"],
                ratio_median=s["ratio_median"], ratio_min=s["ratio_min"],
                ratio_max=s["ratio_max"],
                gcn_p1_saving_measured=sv["gcn-p1"]["measured_max"],
                gcn_p1_saving_predicted=sv["gcn-p1"]["predicted_bytes"],
                gt_p1_saving_measured=sv["gt-p1"]["measured_max"],
                gt_p1_saving_predicted=sv["gt-p1"]["predicted_bytes"])


if __name__ == "__main__":
    main()
