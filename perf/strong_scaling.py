"""Strong scaling of ``plexgt train``: run (or read) a sweep over rank counts, tabulate, plot.

Modes:
  python -m perf.strong_scaling --data DIR [--ranks 1 2 4 8] [--epochs 10]
      runs ``mpiexec -n p plexgt train`` for each p on this machine, then reports;
  python -m perf.strong_scaling --runs SWEEP_DIR
      reads a cluster sweep (``jobscripts/sweep.sh``: SWEEP_DIR/p<P>/metrics.jsonl);
  python -m perf.strong_scaling --simulate [--profile system.json]
      projects ogbn-papers100M epoch time at 8 ... 2048 GPUs from the cost model;
  python -m perf.strong_scaling --simulate --machine perlmutter|frontier|FILE.toml
      the same from a machine description (plexgt/plan/machines), for gcn (3 layers, hidden
      128, as Plexus runs it: every Gx x Gy x Gz) and gt (hidden 128, 8 heads, 3 layers: every
      attention strategy and head axis), each p's fastest configuration that fits the
      machine's GPU memory; labelled a model projection.

Writes perf/results/strong_scaling_<label>.{json,md,png} (dated, hardware named) and ends with a
``RESULT`` line. Epoch time is the median over epochs after the first (which pays one-off
costs such as GEMM tuning).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from perf.agp_algorithm3 import plan
from perf.harness import (
    RESULTS_DIR,
    JobFailed,
    hardware,
    launch,
    mpiexec,
    plexgt,
    read_jsonl,
    result_line,
    today,
    write_json,
    write_text,
)
from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.agp import SystemModel
from plexgt.plan.choose import GraphSizes, ModelShape, workload
from plexgt.plan.machine import load_machine
from plexgt.plan.plexus_cost import Coefficients, rank_grids
from plexgt.plan.profile import read_profile

KEYS = ("time_epoch", "time_compute", "time_comm", "time_wait")


def summarize(metrics: Path) -> dict:
    rows = read_jsonl(metrics)
    if not rows:
        raise SystemExit(f"strong_scaling: {metrics} holds no epochs")
    body = rows[1:] or rows
    out = {k: float(np.median([r[k] for r in body])) for k in KEYS}
    out.update(ranks=rows[-1]["ranks"], grid=rows[-1]["grid"], strategy=rows[-1]["strategy"],
               bytes_comm=int(np.median([r["bytes_comm"] for r in body])),
               peak_mem_bytes=max(r["peak_mem_bytes"] for r in rows),
               test_acc=rows[-1].get("test_acc"))
    return out


def run_local(args: argparse.Namespace, workdir: Path) -> list[dict]:
    res = []
    for p in args.ranks:
        m = workdir / f"p{p}.jsonl"
        cmd = plexgt("train", "--data", args.data, "--model", args.model, "--epochs",
                     str(args.epochs), "--metrics", str(m),
                     *(["--config", args.config] if args.config else []), *args.extra)
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        try:
            launch(mpiexec(p, cmd), env=env)
        except JobFailed as e:
            raise SystemExit(f"strong_scaling: p={p} failed:\n{e.stderr[-2000:]}") from e
        res.append(summarize(m))
    return res


def read_sweep(root: Path) -> list[dict]:
    runs = sorted(root.glob("p*/metrics.jsonl"), key=lambda p: int(p.parent.name[1:]))
    if not runs:
        raise SystemExit(f"strong_scaling: no p*/metrics.jsonl under {root}")
    return [summarize(m) for m in runs]


def simulate(args: argparse.Namespace) -> list[dict]:
    """papers100M (N=111M, 3.34B stored nonzeros with both directions and self loops,
    F=128 float16 input, hidden 256, 172 classes, 3 layers) at 8 ... 2048 ranks."""
    coef = Coefficients.from_profile(read_profile(args.profile) if args.profile else None)
    n, nnz, dims = 111_059_956, 3_339_000_000, [128, 256, 256, 172]
    res = []
    for p in (8, 16, 32, 64, 128, 256, 512, 1024, 2048):
        best = rank_grids(p, n, nnz, dims, 2, coef, memory_limit=int(args.gpu_mem_gb * 2**30))[0]
        res.append({"ranks": p, "grid": str(best.grid), "strategy": "plexus3d",
                    "time_epoch": best.time_s, "time_compute": best.compute_s,
                    "time_comm": best.comm_s, "time_wait": 0.0,
                    "bytes_comm": best.bytes_per_rank * p, "peak_mem_bytes": best.memory_bytes,
                    "fits": best.memory_bytes <= args.gpu_mem_gb * 2**30})
    return res


def simulate_machine(args: argparse.Namespace) -> list[dict]:
    """papers100M on a machine description at 8 ... 2048 GPUs: gcn through the 3D model,
    gt through AGP; each p's fastest configuration on exactly p ranks that fits a GPU."""
    m = load_machine(args.machine)
    n, e, f, c = 111_059_956, 3_339_000_000, 128, 172
    res = []
    for p in (8, 16, 32, 64, 128, 256, 512, 1024, 2048):
        prof = m.profile(p)
        limit = m.memory_per_gpu_bytes
        if args.model == "gcn":
            coef = Coefficients.from_profile(prof)
            ranked = rank_grids(p, n, e, [f, 128, 128, c], 2, coef, memory_limit=limit)
            best = next((g for g in ranked if g.memory_bytes <= limit),
                        min(ranked, key=lambda g: g.memory_bytes))
            res.append({"ranks": p, "grid": str(best.grid), "strategy": "plexus3d",
                        "time_epoch": best.time_s, "time_compute": best.compute_s,
                        "time_comm": best.comm_s, "time_wait": 0.0,
                        "bytes_comm": best.bytes_per_rank * p,
                        "peak_mem_bytes": best.memory_bytes, "fits": best.memory_bytes <= limit})
            continue
        w = workload(GraphSizes(n, e, f, c), ModelShape("gt", 128, 3, 8, 2, 2))
        pl = plan(w, list(default_registry()), [p], SystemModel.from_profile(prof), limit)
        rows = [r for r in pl.rows if r.est.scale == p]
        fit = [r for r in rows if r.fits]
        best = (min(fit, key=lambda r: r.est.time_s) if fit else
                min(rows, key=lambda r: r.est.memory["total"])).est
        res.append({"ranks": p, "grid": best.label, "strategy": best.strategy,
                    "time_epoch": best.time_s, "time_compute": best.compute_s,
                    "time_comm": best.comm_s, "time_wait": 0.0,
                    "bytes_comm": best.comm_bytes * p,
                    "peak_mem_bytes": best.memory["total"], "fits": bool(fit)})
    return res


def report(res: list[dict], label: str, hw: dict) -> None:
    # speedups over the fewest ranks whose run fits (a projection's rows may not)
    base = next((r for r in res if r.get("fits", True)), res[0])
    for r in res:
        r["speedup"] = base["time_epoch"] / r["time_epoch"] * 1.0
        r["ideal"] = r["ranks"] / base["ranks"]
        r["efficiency"] = r["speedup"] / r["ideal"]
    lines = [f"# Strong scaling: {label}", "", f"{today()} on {hw.get('cpu')} "
             f"({hw.get('usable_cores')} cores{', ' + hw['gpu'] if 'gpu' in hw else ''})", "",
             "| ranks | grid | epoch s | compute s | comm s | wait s | speedup | efficiency |"
             " MiB/rank | fits |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res:
        fits = {True: "yes", False: "no (the least memory shown)"}.get(r.get("fits"), "")
        lines.append(f"| {r['ranks']} | {r['grid']} | {r['time_epoch']:.4f} | "
                     f"{r['time_compute']:.4f} | {r['time_comm']:.4f} | {r['time_wait']:.4f} | "
                     f"{r['speedup']:.2f} | {r['efficiency']:.2f} | "
                     f"{r['peak_mem_bytes'] / 2**20:.0f} | {fits} |")
    stem = f"strong_scaling_{label}"
    write_text(stem + ".md", "\n".join(lines) + "\n")
    write_json(stem + ".json", {"date": today(), "hardware": hw, "label": label, "runs": res})
    try:  # matplotlib is an optional dependency (the perf extra): without it, no plot
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        p = [r["ranks"] for r in res]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        for k in KEYS:
            a1.plot(p, [r[k] for r in res], marker="o", label=k.replace("time_", ""))
        a1.set(xscale="log", yscale="log", xlabel="ranks", ylabel="seconds per epoch",
               title=label)
        a1.legend()
        a2.plot(p, [r["speedup"] for r in res], marker="o", label="measured")
        a2.plot(p, [r["ideal"] for r in res], "--", label="ideal")
        a2.set(xscale="log", yscale="log", xlabel="ranks", ylabel="speedup")
        a2.legend()
        fig.tight_layout()
        fig.savefig(RESULTS_DIR / (stem + ".png"), dpi=90)
    except ImportError:
        print("strong_scaling: matplotlib not installed; no plot", file=sys.stderr)
    print("\n".join(lines))
    result_line(label=label, ranks="/".join(str(r["ranks"]) for r in res),
                epoch_s="/".join(f"{r['time_epoch']:.4f}" for r in res),
                speedup_max=res[-1]["speedup"], efficiency_max=res[-1]["efficiency"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data")
    ap.add_argument("--model", default="gcn")
    ap.add_argument("--config")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--runs", help="a sweep directory (jobscripts/sweep.sh)")
    ap.add_argument("--simulate", action="store_true")
    ap.add_argument("--profile", help="system profile JSON (plexgt profile) for --simulate")
    ap.add_argument("--machine", help="machine description for --simulate (perlmutter, "
                    "frontier, dgx-a100 or a TOML file)")
    ap.add_argument("--gpu-mem-gb", type=float, default=40.0)
    ap.add_argument("--label")
    ap.add_argument("extra", nargs="*", help="passed to plexgt train (--key=value)")
    args = ap.parse_args()
    if args.simulate and args.machine:
        mach = load_machine(args.machine)
        hw = {"cpu": f"model projection for {mach.description} ({mach.path}), not a "
                     "measurement", "usable_cores": 0}
        report(simulate_machine(args), args.label or
               f"papers100M-{args.model}-{mach.name}-projection", hw)
    elif args.simulate:
        report(simulate(args), args.label or "papers100M-simulated", hardware())
    elif args.runs:
        report(read_sweep(Path(args.runs)), args.label or Path(args.runs).name, hardware())
    elif args.data:
        with tempfile.TemporaryDirectory() as d:
            report(run_local(args, Path(d)), args.label or Path(args.data).name, hardware())
    else:
        ap.error("give --data, --runs or --simulate")


if __name__ == "__main__":
    main()
