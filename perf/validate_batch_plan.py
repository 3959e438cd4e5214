"""The node-sequence (hgt) cost model scored on this machine: predicted against measured step
time and peak memory per rank over dp x pp x cp layouts, and the search's choice.

    flock /tmp/plexgt-timing.lock .venv/bin/python -m perf.validate_batch_plan   # ~12 min

Amazon Computers (13,752 nodes, 767 features; /work/prep/computers when prepared there, else
``plexgt prep`` of ../shared/datasets) trains three fixed models (MODELS: layers 4-16,
hidden 32-64, batch.size 128-512) on W = 1, 2, 4 ranks (4 oversubscribe the 2 cores), each in
several layouts per W (LAYOUTS: dp, pp with even and uneven partitions, cp, K = 1, 2, 4) and
in the search's choice. One thread per rank (OMP_NUM_THREADS=1).

Profile first, in the same run: one mpiexec of 4 ranks times neighbour exchanges and
all-reduces (:func:`plexgt.plan.batch_profile.measure_collectives`), per model GA-CP's ring
exchanges on a real group of 2 (:func:`~plexgt.plan.batch_profile.ring_samples`) and node
sharing, κ(2) and κ(4): one block alone against on 2 and 4 ranks at once
(:func:`~plexgt.plan.batch_profile.contention_samples`), then its rank 0 measures each
model's :class:`~plexgt.plan.batch_fits.BatchProfile`
(:func:`~plexgt.plan.batch_profile.measure_batch_profile`: the real block and GA-CP at
several (B, N', P_cp), embed, head, AdamW, the sampler on Computers, the peak memory of a
few single-process stages) while the others wait; the quick calibration of this host only
for what the profile does not measure (κ beyond 4 ranks). Every prediction is
:func:`~plexgt.plan.batch_cost.step_seconds` and :func:`~plexgt.plan.batch_memory.
stage_memory` from that profile; the choice is
:func:`plexgt.plan.choose.choose_batch_layout`'s on the same profile.

Measured (one mpiexec per (model, W), configurations one after the other), as
perf/validate_plan.py does: memory first, in a pass of its own (glibc maps every block over
128 KiB alone and returns freed memory, so the resident set counts live memory): each rank's
peak resident set in the third optimizer step (the high-water mark reset before it) above
its level before the configuration was built, the max over ranks; then two timed passes
(the second in reverse order) of 2 warm-up and ``--steps`` timed optimizer steps each (a
step: the task's train_step, the loop's clipping and AdamW; the slowest rank's), the median
kept. /proc/loadavg before and after each mpiexec.

Scored: MAPE of memory and of time over every configuration; per (model, W) whether the
choice's median step is within 10% of the fastest measured. Writes
perf/results/validate_batch_plan.json and ends with a RESULT line.
"""

from __future__ import annotations

import argparse
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

from perf import plan_score
from perf.harness import (
    RESULTS_DIR,
    gnn_benchmark,
    hardware,
    launch,
    module,
    mpiexec,
    prepared,
    result_line,
    today,
    write_json,
)
from plexgt.data.loader import PreparedGraph
from plexgt.data.node_batches import NodeBatches
from plexgt.distributed.bootstrap import init_distributed, shutdown
from plexgt.distributed.collectives import CommLedger
from plexgt.plan.agp import SystemModel
from plexgt.plan.batch_cost import step_seconds
from plexgt.plan.batch_fits import BatchProfile
from plexgt.plan.batch_memory import stage_memory
from plexgt.plan.batch_profile import (
    contention_samples,
    fit_batch_profile,
    measure_batch_profile,
    measure_collectives,
    memory_mode,
    peak_rss,
    reset_peak,
    ring_samples,
    rss,
    trim,
    with_collectives,
)
from plexgt.plan.batch_shape import BatchMesh, BatchShape
from plexgt.plan.batch_shape import position as stage_position
from plexgt.plan.calibrate import calibration
from plexgt.plan.choose import ModelShape, batch_shape, choose_batch_layout
from plexgt.plan.knobs import load_config
from plexgt.tasks import build_task
from plexgt.tasks.task import graph_sizes
from plexgt.training.optim import clip_gradients

MODELS = {
    "L8-d64-N256": {"model.layers": 8, "model.hidden": 64, "model.heads": 4,
                    "batch.size": 256, "batch.targets": 64, "batch.sequences": 4},
    "L16-d32-N128": {"model.layers": 16, "model.hidden": 32, "model.heads": 4,
                     "batch.size": 128, "batch.targets": 32, "batch.sequences": 8},
    "L4-d64-N512": {"model.layers": 4, "model.hidden": 64, "model.heads": 8,
                    "batch.size": 512, "batch.targets": 128, "batch.sequences": 4},
}
COMMON = {"model.name": "hgt", "progress": False, "model.dropout": 0.1,
          "model.input_dropout": 0.1, "optim.warmup_epochs": 0, "batch.global_nodes": 1}
LAYOUTS = {
    1: [(1, 1, 1, 1, None), (1, 1, 1, 2, None), (1, 1, 1, 4, None)],
    2: [(2, 1, 1, 1, None), (1, 2, 1, 1, None), (1, 2, 1, 2, "uneven"), (1, 1, 2, 1, None),
        (1, 2, 1, 4, None)],
    4: [(4, 1, 1, 1, None), (2, 2, 1, 1, None), (2, 1, 2, 1, None), (1, 2, 2, 2, "uneven"),
        (1, 4, 1, 2, None), (1, 4, 1, 1, "uneven"), (1, 1, 4, 1, None)],
}
"""(dp, pp, cp, K, partition) per W; partition None = even, 'uneven' = one block fewer on the
first stage, the rest spread."""
SCALES = (1, 2, 4)


def partition(layers: int, pp: int, kind: str | None) -> tuple[int, ...]:
    base = [layers // pp + (i < layers % pp) for i in range(pp)]
    if kind == "uneven" and pp > 1 and base[0] > 1:
        base[0] -= 1
        base[-1] += 1
    return tuple(base)


def overrides(data: Path, model: str, layout: dict[str, Any]) -> dict[str, Any]:
    return {"data": str(data), **COMMON, **MODELS[model],
            "parallel.dp": str(layout["dp"]), "parallel.pp": str(layout["pp"]),
            "parallel.cp": str(layout["cp"]),
            "parallel.stages": ",".join(map(str, layout["stages"])),
            "parallel.micro_batches": layout["micro_batches"], "parallel.calibrate": False}


def label(lay: dict[str, Any]) -> str:
    return (f"dp{lay['dp']} pp{lay['pp']} cp{lay['cp']} K{lay['micro_batches']} "
            f"[{','.join(map(str, lay['stages']))}]")


# -- the workers (under mpiexec) ------------------------------------------------------------
def _build(data: Path, model: str, lay: dict[str, Any], ctx: Any) -> tuple[Any, Any, Any]:
    cfg = load_config(None, overrides(data, model, lay))
    task = build_task(cfg, ctx, CommLedger())
    return cfg, task, torch.optim.AdamW(task.model.parameters(), lr=1e-3)


def _step(cfg: Any, task: Any, opt: Any, i: int) -> float:
    """One optimizer step as the loop runs it; seconds of the slowest rank."""
    dist.barrier()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    task.train_step(0, i)
    if cfg.optim.clip_norm > 0:
        clip_gradients(task.model, cfg.optim.clip_norm)
    opt.step()
    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _memory(data: Path, model: str, lay: dict[str, Any], ctx: Any) -> list[int]:
    """Every rank's peak resident bytes in the third step above its level before the build."""
    with memory_mode():
        trim()
        base = rss()
        cfg, task, opt = _build(data, model, lay, ctx)
        for i in range(2):
            _step(cfg, task, opt, i)
        trim()
        reset_peak()
        _step(cfg, task, opt, 2)
        peak = peak_rss() - base
        del task, opt
        trim()
    got: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(got, peak)
    return [int(x) for x in got]


def _time(data: Path, model: str, lay: dict[str, Any], steps: int, ctx: Any) -> list[float]:
    cfg, task, opt = _build(data, model, lay, ctx)
    for i in range(2):
        _step(cfg, task, opt, i)
    return [_step(cfg, task, opt, 2 + i) for i in range(steps)]


def run_worker(job: dict[str, Any]) -> None:
    ctx = init_distributed("gloo", timeout_s=1800)
    data, model, configs = Path(job["data"]), job["model"], job["configs"]
    _memory(data, model, configs[0], ctx)  # warm-up: a process's first steps grow it once
    rows = [{"measured_bytes": _memory(data, model, c, ctx)} for c in configs]
    for rnd in range(2):
        order = range(len(configs)) if rnd == 0 else reversed(range(len(configs)))
        for i in order:
            rows[i].setdefault("step_s", []).extend(_time(data, model, configs[i],
                                                          job["steps"], ctx))
    if ctx.rank == 0:
        Path(job["out"]).write_text(json.dumps(rows) + "\n")
    shutdown(ctx)


def profile_worker(job: dict[str, Any]) -> None:
    """Collectives on every rank; per model, GA-CP's exchanges on a real ring of ranks 0 and
    1 (every rank calls :func:`ring_samples`), then rank 0 measures the model's profile."""
    ctx = init_distributed("gloo", timeout_s=1800)
    coll = measure_collectives()
    out: dict[str, Any] = {"collectives": coll, "models": {}}
    pg = PreparedGraph(Path(job["data"]))
    for name in job["models"]:
        cfg = load_config(None, {"data": job["data"], **COMMON, **MODELS[name]})
        shape = batch_shape(graph_sizes(pg), ModelShape.of(cfg))
        ring = ring_samples(shape, cfg.model.dropout)
        kappa = contention_samples(shape, cfg.model.dropout)
        if ctx.rank == 0:
            sampler = NodeBatches(pg, cfg.batch, cfg.seed)
            warm = NodeBatches(pg, cfg.batch, cfg.seed)
            t0 = time.perf_counter()
            prof, raw = measure_batch_profile(shape, sampler=sampler, warm_sampler=warm,
                                              dropout=cfg.model.dropout, contention=kappa)
            del warm
            out["models"][name] = {"profile": prof.to_dict(), "raw": raw, "ring": ring,
                                   "seconds": time.perf_counter() - t0}
            print(f"profile {name}: {time.perf_counter() - t0:.1f} s; ring exchange "
                  f"{[round(t * 1e3, 2) for _, t in ring]} ms; κ {kappa}", flush=True)
        dist.barrier()
    if ctx.rank == 0:
        Path(job["out"]).write_text(json.dumps(out) + "\n")
    dist.barrier()
    shutdown(ctx)


# -- the driver -----------------------------------------------------------------------------
def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ")[0]
    except OSError:
        return "?"


def mpirun(p: int, job: dict[str, Any], flag: str) -> tuple[Any, list[str]]:
    load = [loadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        jpath, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job = {**job, "out": str(out)}
        jpath.write_text(json.dumps(job))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PLEXGT_NO_CALIBRATE": "1"}
        launch(mpiexec(p, module("perf.validate_batch_plan", flag, str(jpath))), env=env,
               timeout=3600, capture=False)
        got = json.loads(out.read_text())
    load.append(loadavg())
    return got, load


def data_dir() -> Path:
    here = Path("/work/prep/computers")
    if (here / "manifest.json").exists():
        return here
    return prepared(Path(tempfile.gettempdir()) / "plexgt-validate-batch" / "computers",
                    ["--input", str(gnn_benchmark("computers"))])


def host_model() -> SystemModel:
    """The quick calibration's node model with no thread speedup (each rank runs one
    thread here, whatever the rank count)."""
    sysm = SystemModel.from_profile(calibration().profile)
    return replace(sysm, host=replace(sysm.host, thread_speedup={}))


def predict(shape: BatchShape, prof: BatchProfile, lay: dict[str, Any]) -> tuple[float, int]:
    mesh = BatchMesh(lay["dp"], lay["pp"], lay["cp"], lay["micro_batches"])
    t = step_seconds(shape, prof, mesh, lay["stages"]).step_s
    mem = max(stage_memory(shape, prof, mesh, n, stage_position(i, mesh.pp))
              for i, n in enumerate(lay["stages"]))
    return t, mem


def configurations(model: str, w: int, shape: BatchShape, prof: BatchProfile,
                   sysm: SystemModel, sizes: Any, cfg: Any) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for dp, pp, cp, k, kind in LAYOUTS[w]:
        if shape.sequences % (dp * k) or shape.size % cp or pp > shape.layers:
            continue
        lay = {"dp": dp, "pp": pp, "cp": cp, "micro_batches": k,
               "stages": partition(shape.layers, pp, kind)}
        out[label(lay)] = {**lay, "chosen": False}
    rp = choose_batch_layout(sizes, ModelShape.of(cfg), w, sysm, profile=prof).plan
    dp, pp, cp = rp.mesh or (1, 1, 1)
    lay = {"dp": dp, "pp": pp, "cp": cp, "micro_batches": rp.micro_batches,
           "stages": tuple(rp.stages)}
    out.setdefault(label(lay), {**lay, "chosen": False})["chosen"] = True
    rows = []
    for lab, lay in out.items():
        t, mem = predict(shape, prof, lay)
        rows.append({**lay, "stages": list(lay["stages"]), "label": lab, "model": model,
                     "w": w, "predicted_s": t, "predicted_bytes": mem})
    return rows


def score(rows: list[dict[str, Any]]) -> dict[str, Any]:
    mem = [plan_score.ape(r["predicted_bytes"], max(r["measured_bytes"])) for r in rows]
    tim = [plan_score.ape(r["predicted_s"], r["median_s"]) for r in rows]
    scales = sorted({r["w"] for r in rows})
    decisions = []
    for model in MODELS:
        for w in SCALES:
            opts = [r for r in rows if r["model"] == model and r["w"] == w]
            if len(opts) < 2:
                continue
            pick = next((i for i, r in enumerate(opts) if r["chosen"]), None)
            if pick is None:  # repriced: a choice nobody measured
                decisions.append({"model": model, "w": w, "pick": "(not measured)",
                                  "slower": None, "within": None, "options": len(opts)})
                continue
            d = plan_score.decision(pick, {i: r["median_s"] for i, r in enumerate(opts)})
            decisions.append({"model": model, "w": w, "pick": opts[pick]["label"],
                              "best": opts[d["fastest"]]["label"], "slower": d["slower"],
                              "within": d["within"], "options": len(opts)})
    fastest = [plan_score.ape(r["predicted_s"], r["min_s"]) for r in rows]
    return {"memory_mape": plan_score.mape(mem), "time_mape": plan_score.mape(tim),
            "time_mape_fastest_step": plan_score.mape(fastest),
            "time_mape_by_w": {str(w): plan_score.mape(e for e, r in zip(tim, rows)
                                                       if r["w"] == w) for w in scales},
            "memory_mape_by_w": {str(w): plan_score.mape(e for e, r in zip(mem, rows)
                                                         if r["w"] == w) for w in scales},
            "decisions": decisions,
            "choice_within_10pct": sum(bool(d["within"]) for d in decisions),
            "decisions_scored": sum(d["within"] is not None for d in decisions)}


def profiles_for(measured: dict[str, Any], model: str, data: Path, sysm: SystemModel
                 ) -> tuple[Any, BatchShape, BatchProfile, Any]:
    """(config, shape, profile, graph sizes) of ``model`` from a run's measured profiles."""
    pg = PreparedGraph(data)
    sizes = graph_sizes(pg)
    pg.close()
    cfg = load_config(None, {"data": str(data), **COMMON, **MODELS[model]})
    shape = batch_shape(sizes, ModelShape.of(cfg))
    got = measured["models"][model]
    prof = fit_batch_profile(BatchProfile.from_dict(got["profile"], sysm.host), got["raw"],
                             shape)  # refitted: this checkout's fits of the stored samples
    if measured.get("collectives"):  # the ring: GA-CP's exchanges on a real group if measured
        prof = with_collectives(prof, {**measured["collectives"], "ring": got.get("ring")})
    return cfg, shape, prof, sizes


def repredict() -> None:
    """The stored rows priced again (each row's prediction and which row is the choice)."""
    path = RESULTS_DIR / "validate_batch_plan.json"
    stored = json.loads(path.read_text())
    data, sysm = data_dir(), host_model()
    for model in {r["model"] for r in stored["rows"]}:
        cfg, shape, prof, sizes = profiles_for(stored["profiles"], model, data, sysm)
        for w in {r["w"] for r in stored["rows"] if r["model"] == model}:
            mine = [r for r in stored["rows"] if r["model"] == model and r["w"] == w]
            rp = choose_batch_layout(sizes, ModelShape.of(cfg), w, sysm, profile=prof).plan
            dp, pp, cp = rp.mesh or (1, 1, 1)
            pick = label({"dp": dp, "pp": pp, "cp": cp, "micro_batches": rp.micro_batches,
                          "stages": rp.stages})
            for r in mine:
                r["predicted_s"], r["predicted_bytes"] = predict(shape, prof, r)
                r["chosen"] = r["label"] == pick
            if not any(r["chosen"] for r in mine):
                print(f"{model} W={w}: the choice {pick} was not measured")
    s = score(stored["rows"])
    stored.update(summary=s, repredicted=today())
    write_json("validate_batch_plan.json", stored)
    for r in stored["rows"]:
        print(f"{r['model']:<14} W={r['w']} {r['label']:<28} {r['median_s']:.4f} "
              f"(pred {r['predicted_s']:.4f})  {max(r['measured_bytes']) / 2**20:.1f} MiB "
              f"(pred {r['predicted_bytes'] / 2**20:.1f}){'  <- choice' * r['chosen']}")
    _result(s, len(stored["rows"]))


def _result(s: dict[str, Any], n: int) -> None:
    result_line(memory_mape=s["memory_mape"], time_mape=s["time_mape"],
                choice_within_10pct=s["choice_within_10pct"],
                decisions=s["decisions_scored"], configurations=n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--profile-worker", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--scales", default="1,2,4")
    ap.add_argument("--profile", type=Path, default=None,
                    help="reuse a stored run's profiles (its JSON) instead of measuring")
    ap.add_argument("--repredict", action="store_true",
                    help="measure nothing: price the stored run's rows again from its stored "
                         "profiles with this checkout's model, and score them")
    args = ap.parse_args()
    if args.repredict:
        repredict()
        return
    if args.worker:
        run_worker(json.loads(Path(args.worker).read_text()))
        return
    if args.profile_worker:
        profile_worker(json.loads(Path(args.profile_worker).read_text()))
        return
    t0 = time.perf_counter()
    data = data_dir()
    models = args.models.split(",")
    loads: list[dict[str, Any]] = []
    if args.profile:
        measured = json.loads(args.profile.read_text())["profiles"]
    else:
        measured, load = mpirun(4, {"data": str(data), "models": models}, "--profile-worker")
        loads.append({"run": "profile", "loadavg": load})
    sysm = host_model()
    pg = PreparedGraph(data)
    sizes = graph_sizes(pg)
    rows: list[dict[str, Any]] = []
    for model in models:
        cfg, shape, prof, _ = profiles_for(measured, model, data, sysm)
        for w in map(int, args.scales.split(",")):
            configs = configurations(model, w, shape, prof, sysm, sizes, cfg)
            print(f"{model} W={w}: {len(configs)} configurations", flush=True)
            got, load = mpirun(w, {"data": str(data), "model": model, "configs": configs,
                                   "steps": args.steps}, "--worker")
            loads.append({"run": f"{model} W={w}", "loadavg": load})
            for c, r in zip(configs, got):
                row = {**c, **r, "median_s": float(statistics.median(r["step_s"])),
                       "min_s": float(min(r["step_s"]))}
                rows.append(row)
                print(f"  {c['label']:<28} {row['median_s']:.4f} s (pred "
                      f"{c['predicted_s']:.4f})  {max(r['measured_bytes']) / 2**20:.1f} MiB "
                      f"(pred {c['predicted_bytes'] / 2**20:.1f}){'  <- choice' * c['chosen']}",
                      flush=True)
    pg.close()
    s = score(rows)
    write_json("validate_batch_plan.json", {
        "benchmark": "validate_batch_plan", "date": today(), "hardware": hardware(),
        "notes": "2-core VM shared with other jobs; W = 4 oversubscribes the cores; one "
                 "thread per rank; a step is the slowest rank's; median of the timed steps; "
                 "memory = peak resident set in the third step above the level before the "
                 "build, max over ranks",
        "steps": args.steps, "seconds": time.perf_counter() - t0, "loadavg": loads,
        "models": {m: MODELS[m] for m in models}, "profiles": measured, "summary": s,
        "rows": rows})
    _result(s, len(rows))


if __name__ == "__main__":
    main()
