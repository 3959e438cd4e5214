"""Inference against training: ``plexgt predict``'s memory and time beside one training
epoch of the same model, on the same graph, ranks and layout.

    python -m perf.bench_predict [--models gcn gt gps] [--ranks 2] [--datasets DIR]

For each model a checkpoint is trained (``plexgt train``, 2 epochs); then two fresh jobs of
``--ranks`` ranks (a worker of this module under mpiexec) build the model from it exactly as
``plexgt predict`` does (:mod:`plexgt.training.inference`) and measure, each rank:

* train: one training step (forward, loss, backward, AdamW; the second step, so AdamW's
  moments exist as in every epoch after the first), :func:`plexgt.training.loop.step`;
* predict: loading the checkpoint's model, the inference forward, and the whole predict
  (forward, the exchange into node-id blocks, writing the file: Parquet unless
  ``--format``).

Memory is the peak of the window (on a CPU the resident set's high-water mark after
``clear_refs``; on a GPU the caching allocator's peak), reported whole and above the
resident set both jobs share once the model and data are built (the *base*: torch, the
graph, the parameters), max over ranks. On this CPU the base is mostly torch itself, so the
part above it is where training and inference differ. So that the resident set follows the
tensors alive, the workers run with glibc's mmap threshold fixed at 64 KiB (every larger
buffer is returned to the system when freed, instead of staying in the heap after the
warm-up step) and trim the heap before each window.

Graph: Amazon Computers (gnn-benchmark, symmetrised) from ``--datasets``, else an SBM
graph of ``--nodes`` / ``--edges``. No PyG comparison: PyG is not installed here.
Writes perf/results/bench_predict.json and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from perf.harness import (
    DATASETS_DIR,
    GNN_BENCHMARK,
    JobFailed,
    hardware,
    launch,
    module,
    mpiexec,
    plexgt,
    prep_sbm,
    prepared,
    result_line,
    today,
    write_json,
)
from plexgt.data.loader import PreparedGraph
from plexgt.data.predictions import PredictionsWriter, node_id_base
from plexgt.distributed.bootstrap import init_distributed, shutdown
from plexgt.distributed.collectives import CommLedger
from plexgt.tasks import build_task
from plexgt.training.inference import (
    checkpoint_config,
    find_checkpoint,
    infer,
    load_weights,
    node_block,
    predictions_schema,
    write_block,
)
from plexgt.training.loop import peak_memory_bytes, reset_peak_memory, step
from plexgt.training.numerics import apply_numerics

SETTINGS = {
    "gcn": ["--model.hidden=128", "--model.layers=2"],
    "gt": ["--model.hidden=128", "--model.heads=4", "--model.layers=2"],
    "gps": ["--model.hidden=128", "--model.heads=4", "--model.layers=2"],
}


def current_memory(device: torch.device) -> int:
    """Bytes held now: the resident set on a CPU, allocated tensors on a GPU."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def trim_heap() -> None:
    """Return the heap's free memory to the system (glibc), so the next window's resident
    peak counts what it allocates, not what an earlier step left cached."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _max_over_ranks(values: dict[str, float], device: torch.device) -> dict[str, float]:
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(values, t.cpu().tolist()))


def worker(args: argparse.Namespace) -> None:
    """One job (under mpiexec): build the checkpoint's model as predict does, measure
    ``args.worker`` ('train' or 'predict'), print rank 0's JSON line (max over ranks)."""
    cp = find_checkpoint(args.checkpoint)
    cfg = checkpoint_config(cp, args.data, None, args.strategy)
    apply_numerics(cfg)
    torch.manual_seed(cfg.seed)
    ctx = init_distributed(cfg.parallel.backend, cfg.parallel.timeout_s)
    task = build_task(cfg, ctx, CommLedger(device=ctx.device))
    dist.barrier()
    trim_heap()
    out: dict[str, float] = {}
    if args.worker == "train":
        opt = torch.optim.AdamW(task.model.parameters(), lr=cfg.optim.lr,
                                weight_decay=cfg.optim.weight_decay)
        out["base"] = current_memory(ctx.device)
        step(cfg, task, opt, 0, ctx.device)  # AdamW's moments come into being here
        trim_heap()
        out["before_step"] = current_memory(ctx.device)
        _, step_s, wait_s = step(cfg, task, opt, 1, ctx.device)  # resets the peak itself
        out.update(peak=peak_memory_bytes(ctx.device), seconds=step_s + wait_s)
    else:
        pg = PreparedGraph(cfg.data)
        trim_heap()
        out["base"] = current_memory(ctx.device)
        reset_peak_memory(ctx.device)
        t0 = time.perf_counter()
        load_weights(cp, cfg, ctx, task)
        out["load_seconds"] = time.perf_counter() - t0
        with torch.inference_mode():
            inf = infer(task, ctx)
            out.update(forward_peak=peak_memory_bytes(ctx.device), forward_seconds=inf.seconds)
            t1 = time.perf_counter()
            block = node_block(task, pg, inf, None, node_id_base(pg))
        del inf
        writer = PredictionsWriter(Path(args.out), ctx.rank, ctx.world_size, True,
                                   predictions_schema(task, pg, cfg, cp, None, None))
        if ctx.rank == 0:
            writer.check()
        write_block(writer, block, ctx)
        out.update(peak=peak_memory_bytes(ctx.device),
                   export_seconds=time.perf_counter() - t1,
                   seconds=time.perf_counter() - t0)
    out = _max_over_ranks(out, ctx.device)
    if ctx.rank == 0:
        print("BENCH " + json.dumps({**out, "grid": task.grid, "strategy": task.strategy,
                                     "device": str(ctx.device)}), flush=True)
    shutdown(ctx)


def _job(args: argparse.Namespace, mode: str, ck: Path, data: Path, work: Path) -> dict:
    spec = ["--worker", mode, "--checkpoint", str(ck), "--data", str(data), "--out",
            str(work / f"pred.{args.format}")]
    if args.strategy:
        spec += ["--strategy", args.strategy]
    r = launch(mpiexec(args.ranks, module("perf.bench_predict", *spec)),
               env=dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536"))
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("BENCH "))
    return json.loads(line.removeprefix("BENCH "))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gcn", "gt", "gps"],
                    choices=["gcn", "gt", "gps"])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--strategy", help="gt, gps: the attention strategy (default: the plan's)")
    ap.add_argument("--format", default="parquet", choices=["parquet", "h5", "npy"],
                    help="predict's output format")
    ap.add_argument("--datasets", type=Path, default=DATASETS_DIR)
    ap.add_argument("--nodes", type=int, default=20000, help="SBM fallback")
    ap.add_argument("--edges", type=int, default=400000, help="SBM fallback")
    ap.add_argument("--worker", choices=["train", "predict"], help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    src = args.datasets / "gnn-benchmark" / GNN_BENCHMARK["computers"]
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        if src.exists():
            name = "Amazon Computers (symmetrised, self loops, 60/20/20 random split)"
            data = prepared(work / "computers", ["--format", "gnn-benchmark", "--input",
                                                 str(src), "--symmetrize"])
        else:
            name = f"SBM {args.nodes} nodes, {args.edges} edges"
            data = prep_sbm(work / "sbm", args.nodes, args.edges, 8, 64)
        for model in args.models:
            ck = work / f"{model}-ck"
            cmd = plexgt("train", "--data", str(data), "--model", model, "--epochs", "2",
                         "--checkpoint-dir", str(ck), "--progress=false", *SETTINGS[model],
                         *(["--strategy", args.strategy] if args.strategy and model != "gcn"
                           else []))
            try:
                launch(mpiexec(args.ranks, cmd), env=dict(os.environ, OMP_NUM_THREADS="1"))
                train = _job(args, "train", ck, data, work)
                pred = _job(args, "predict", ck, data, work)
            except JobFailed as e:
                raise SystemExit(f"bench_predict: {model}: {e}") from e
            mib = 2**20
            runs[model] = {
                "layout": f"{train['grid']} {train['strategy']}", "train": train,
                "predict": pred,
                "peak_ratio": pred["peak"] / train["peak"],
                "above_base_mib": {"train": (train["peak"] - train["base"]) / mib,
                                   "predict_forward": (pred["forward_peak"] - pred["base"])
                                   / mib,
                                   "predict": (pred["peak"] - pred["base"]) / mib},
                "above_base_ratio": (pred["peak"] - pred["base"])
                / max(1.0, train["peak"] - train["base"]),
                "forward_over_step": pred["forward_seconds"] / train["seconds"],
                "predict_over_step": pred["seconds"] / train["seconds"],
            }
            print(f"bench_predict: {model}: {json.dumps(runs[model])}", file=sys.stderr,
                  flush=True)
    write_json("bench_predict.json", {"bench": "predict", "date": today(),
                                      "hardware": hardware(), "dataset": name,
                                      "ranks": args.ranks, "format": args.format,
                                      "settings": SETTINGS,
                                      "runs": runs})
    fields = {}
    for model, r in runs.items():
        fields[f"{model}_mem_ratio"] = r["above_base_ratio"]
        fields[f"{model}_time_ratio"] = r["predict_over_step"]
    result_line(bench="predict", ranks=args.ranks, **fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
