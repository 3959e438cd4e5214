"""Ring attention side by side: GP-AG, GP-A2A, GP-Ring (overlapped and blocking), GP-2D.

    .venv/bin/python -m perf.bench_ring                      # Physics + SBM 200K/4M, p = 1, 2, 4
    .venv/bin/python -m perf.bench_ring --graphs physics --steps 3

For p = 1, 2, 4 (one mpiexec each; p = 4 oversubscribes the 2 cores) and each graph, the
distributed gt (hidden 64, 4 heads, 2 layers, float32, AdamW) is built with each strategy in
turn (GP-2D with a head axis of 2), warmed up one step, then

* one step with this process's resident set sampled (glibc returning freed blocks): the peak
  above the level before the step, per rank (activations, gradients and temporaries);
* ``--steps`` timed steps (a step = the slowest rank): the median and the fastest, and the
  time the rank spent waiting in communication (the ledger's seconds);

GP-Ring runs twice: with its transfers overlapped (as shipped) and with every transfer waited
for at once (``blocking``); the fraction of ring communication hidden behind compute is
1 - (waiting, overlapped) / (waiting, blocking). Next to each measurement: the strategy's memory
model (:func:`plexgt.plan.step_cost.model_memory`) and its K/V terms: what K and V (and their
gradients) occupy per rank, GP-AG's 4·N·d against the ring's own block, its gradient and the
pieces in flight.

Graphs: Coauthor Physics (``../shared/datasets``; features projected to 128 dense dimensions as
bench_agp does) and an SBM graph of 200,000 nodes and 4,000,000 edges (64 features). Writes
perf/results/bench_ring.json and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import plexgt.parallel.attention.ring as ring_mod
from perf.bench_agp import MODEL, PREP, REAL, sources
from perf.harness import (
    DATASETS_DIR,
    PeakRSS,
    hardware,
    launch,
    module,
    mpiexec,
    prepare_all,
    result_line,
    rss,
    today,
    write_json,
)
from plexgt.data.loader import PreparedGraph
from plexgt.distributed.bootstrap import init_distributed, shutdown
from plexgt.distributed.collectives import Comm, CommLedger, wait
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.ring import chunk_bounds
from plexgt.parallel.attention.strategy import head_splits
from plexgt.parallel.gt_dist import DistGraphTransformer
from plexgt.parallel.rows1d import all_reduce_gradients, row_cross_entropy
from plexgt.plan.agp import Workload
from plexgt.plan.choose import ModelShape, RunPlan
from plexgt.plan.step_cost import model_memory
from plexgt.tasks.attention import read_dist_graph, read_row_data

SYNTHETIC = {"sbm200k": (200_000, 10)}
"""Nodes and edges per node before symmetrising: 200,000 nodes, 4,000,000 edges."""
SCALES = (1, 2, 4)
CONFIGS = [("gp_ag", 1, True, 1), ("gp_a2a", 1, True, 1), ("gp_ring", 1, True, 1),
           ("gp_ring", 1, False, 1), ("gp_ring", 1, True, 8), ("gp_2d", 2, True, 1)]
"""(strategy, head axis, overlapped, ring chunks); at p = 1 only GP-AG and GP-Ring run (one
rank: the others are the same computation), at p = 2 GP-2D is 2 x 1. GP-Ring with 8 chunks
holds an eighth of a K/V block in flight, for 8 times the messages."""


def _run_config(pg, name: str, sname: str, a: int, overlap: bool, chunks: int, p: int,
                rank: int, steps: int) -> dict | None:
    shift = ring_mod.shift_async
    if not overlap:
        def blocking(x, out, comm, offset=1):  # noqa: ANN001, ANN202
            wait(shift(x, out, comm, offset), comm)

        ring_mod.shift_async = blocking
    try:
        ledger = CommLedger()
        comm = Comm.from_group(dist.group.WORLD, "rows", ledger)
        shape = ModelShape("gt", MODEL["hidden"], MODEL["layers"], MODEL["heads"],
                           MODEL["ffn_mult"], ring_chunks=chunks)
        graph = read_dist_graph(pg, comm, RunPlan("gt", p, None, sname, a, chunks, shape=shape))
        data = read_row_data(pg, p, rank)
        torch.manual_seed(0)
        model = DistGraphTransformer(pg.F, MODEL["hidden"], pg.C, MODEL["layers"],
                                     MODEL["heads"], dropout=0.0, ffn_mult=MODEL["ffn_mult"])
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss = row_cross_entropy(model(data.x, graph), data.labels, data.masks["train"],
                                     comm)
            loss.backward()
            all_reduce_gradients(model, comm)
            opt.step()

        step()
        gc.collect()
        dist.barrier()
        with PeakRSS() as mem:
            base = rss()
            step()
        peak = mem.peak - base
        times, waits = [], []
        for _ in range(steps):
            ledger.seconds = 0.0
            dist.barrier()
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
            waits.append(ledger.seconds)
        stats = torch.tensor([times, waits], dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        peaks = [None] * p
        dist.all_gather_object(peaks, peak)
    finally:
        ring_mod.shift_async = shift
    if rank:
        return None
    w = Workload("gt", pg.N, pg.E, pg.F, pg.C, MODEL["hidden"], MODEL["heads"],
                 MODEL["layers"], MODEL["ffn_mult"], 4)
    prob = w.problem.__class__(w.n, w.e, w.hidden, w.heads, 4, head_parallel=a,
                               ring_chunks=chunks)
    mem_model = model_memory(default_registry().get(sname), prob, p, w.layers, w.features,
                             w.classes, w.num_params, w.ffn_mult)
    t = stats[0].numpy()
    label = f"gp_2d {a}x{p // a}" if sname == "gp_2d" else sname
    label += f" c{chunks}" if chunks > 1 else ""
    row = {"graph": name, "p": p, "strategy": sname, "label": label, "overlap": overlap,
           "head_parallel": a, "ring_chunks": chunks, "n": pg.N, "e": pg.E, "step_s": t.tolist(),
           "median_s": float(np.median(t)), "fastest_s": float(t.min()),
           "comm_wait_s": float(np.median(stats[1].numpy())),
           "peak_step_bytes": [int(x) for x in peaks],
           "predicted_step_bytes": int(mem_model["attention_activations"]
                                       + mem_model["dense_activations"]),
           "predicted_kv_bytes": kv_bytes(sname, prob, p, w.layers)}
    print(f"  p={p} {name:<8} {label:<10} {'overlap' if overlap else 'blocking':<8} "
          f"median {row['median_s']:.3f} s  wait {row['comm_wait_s']:.3f} s  "
          f"peak {max(row['peak_step_bytes']) / 2**20:.0f} MiB", flush=True)
    return row


def kv_bytes(sname: str, prob, p: int, layers: int) -> int:  # noqa: ANN001
    """Bytes K and V and their gradients take on a rank at the peak of a step: GP-AG's
    gathered [N, h, d'] pair for every layer plus their gradients for one; a ring's own block
    for every layer plus, for one, its gradients and the pieces in flight; GP-A2A's and
    GP-2D's head-partitioned K, V on all (group) rows."""
    n_loc, d, e = prob.rows(p), prob.d, prob.esize
    if sname == "gp_ag":
        return (2 * layers + 2) * p * n_loc * d * e
    if sname == "gp_ring":
        piece = chunk_bounds(n_loc, prob.ring_chunks)[0][1] if p > 1 else 0
        return (2 * layers * n_loc + 2 * n_loc + 8 * piece) * d * e
    a = prob.head_parallel if sname == "gp_2d" else p
    m = (a if sname == "gp_2d" else p) * n_loc
    hk = head_splits(prob.heads, a)[0] * prob.head_dim
    piece = m if (sname == "gp_2d" and p // a > 1) else 0
    return (2 * layers * m + 2 * m + 8 * piece) * hk * e


def worker(args: argparse.Namespace) -> None:
    ctx = init_distributed("gloo", timeout_s=900)
    torch.manual_seed(ctx.rank)
    p = ctx.world_size
    rows = []
    for name, path in json.loads(args.worker).items():
        pg = PreparedGraph(path)
        for sname, a, overlap, chunks in CONFIGS:
            if p == 1 and (sname not in ("gp_ag", "gp_ring") or chunks > 1):
                continue
            if p % a:
                continue
            row = _run_config(pg, name, sname, a, overlap, chunks, p, ctx.rank, args.steps)
            gc.collect()
            if row:
                rows.append(row)
        pg.close()
    if ctx.rank == 0:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    shutdown(ctx)


def summarise(rows: list[dict]) -> dict:
    """Ratios at p = 4 per graph: GP-Ring against GP-AG (step time by median, K/V bytes
    modeled, step peak measured), the hidden fraction of the ring's communication."""
    out = {}
    for g in sorted({r["graph"] for r in rows}):
        at = {(r["label"], r["overlap"]): r for r in rows if r["graph"] == g and r["p"] == 4}
        ag, ring = at.get(("gp_ag", True)), at.get(("gp_ring", True))
        block, chunked = at.get(("gp_ring", False)), at.get(("gp_ring c8", True))
        if not (ag and ring and block):
            continue
        out[g] = {
            "ring_over_ag_step": ring["median_s"] / ag["median_s"],
            "ring_over_ag_kv_model": ring["predicted_kv_bytes"] / ag["predicted_kv_bytes"],
            "ring_over_ag_step_peak": max(ring["peak_step_bytes"]) / max(ag["peak_step_bytes"]),
            "ring_hidden_comm_fraction": (1 - ring["comm_wait_s"] / block["comm_wait_s"]
                                          if block["comm_wait_s"] > 0 else 0.0),
            "ring_blocking_over_overlap_step": block["median_s"] / ring["median_s"],
        }
        if chunked:
            out[g].update({
                "ring_c8_over_ag_step": chunked["median_s"] / ag["median_s"],
                "ring_c8_over_ag_kv_model": (chunked["predicted_kv_bytes"]
                                             / ag["predicted_kv_bytes"]),
                "ring_c8_over_ag_step_peak": (max(chunked["peak_step_bytes"])
                                              / max(ag["peak_step_bytes"]))})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default="physics,sbm200k")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path("/tmp/plexgt-bench-ring"))
    ap.add_argument("--datasets", type=Path, default=DATASETS_DIR)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    names = [g for g in args.graphs.split(",") if g]
    if any(n in REAL for n in names) and not args.datasets.is_dir():
        sys.exit(f"bench_ring: {args.datasets} not found (Coauthor Physics needs it)")
    paths = prepare_all(sources(names, args.datasets, SYNTHETIC), args.work, **PREP)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_TRIM_THRESHOLD_": "0",
           "MALLOC_MMAP_THRESHOLD_": "65536"}
    rows: list[dict] = []
    for p in SCALES:
        out = args.work / f"rows-{p}.json"
        launch(mpiexec(p, module("perf.bench_ring", "--worker",
                                 json.dumps({k: str(v) for k, v in paths.items()}),
                                 "--out", str(out), "--steps", str(args.steps))),
               env=env, timeout=3600, capture=False)
        rows += json.loads(out.read_text())
    summary = summarise(rows)
    payload = {"date": today(), "hardware": hardware(), "model": MODEL, "steps": args.steps,
               "rows": rows, "summary": summary}
    path = write_json("bench_ring.json", payload)
    print(f"wrote {path}")
    fields = {}
    for g, s in summary.items():
        fields[f"{g}_ring_over_ag_step"] = round(s["ring_over_ag_step"], 3)
        fields[f"{g}_ring_over_ag_kv"] = round(s["ring_over_ag_kv_model"], 3)
        fields[f"{g}_ring_over_ag_peak"] = round(s["ring_over_ag_step_peak"], 3)
        fields[f"{g}_hidden"] = round(s["ring_hidden_comm_fraction"], 3)
        if "ring_c8_over_ag_kv_model" in s:
            fields[f"{g}_c8_over_ag_step"] = round(s["ring_c8_over_ag_step"], 3)
            fields[f"{g}_c8_over_ag_kv"] = round(s["ring_c8_over_ag_kv_model"], 3)
    result_line(bench="bench_ring", **fields)


if __name__ == "__main__":
    main()
