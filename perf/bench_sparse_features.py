"""Sparse input features against dense: epoch time and peak memory on bag-of-words graphs.

    .venv/bin/python -m perf.bench_sparse_features            # ~15 min on 2 cores
    .venv/bin/python -m perf.bench_sparse_features --epochs 4 --datasets physics

Coauthor Physics (34,493 nodes, 8,415 features, 0.39% nonzero) and Amazon Computers (13,752
nodes, 767 features, 35% nonzero) from ../shared/datasets/gnn-benchmark are prepared twice,
``--sparse-features yes`` (CSR feature tiles, trained sparse: X·W as an SpMM) and ``no``
(dense tiles, the baseline). ``plexgt train`` then runs each model (gcn: 2 layers, hidden 64;
gt: hidden 64, 4 heads, 2 blocks; float32) on each layout (1 rank; 2 ranks: gcn on 1x1x2,
gt with GP-AG) on both preps, one after the other in this run. Per run: the median epoch time
over the epochs after the first two and the largest peak resident memory of any rank (the
metrics JSONL's); sparse is reported as ratios to dense on the same model and layout, with the
final losses of both (they train the same model: equal to float32 rounding). Prep's auto
layout picks CSR below 10% density (Physics), dense above (Computers).
Writes perf/results/bench_sparse_features.json and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from perf.harness import (
    gnn_benchmark,
    hardware,
    launch,
    mpiexec,
    plexgt,
    prepared,
    read_jsonl,
    result_line,
    today,
    write_json,
)

MODELS = {
    "gcn": ["--model.name=gcn", "--model.hidden=64", "--model.layers=2"],
    "gt": ["--model.name=gt", "--model.hidden=64", "--model.heads=4", "--model.layers=2"],
}
LAYOUTS = {"gcn": [(1, "1x1x1"), (2, "1x1x2")], "gt": [(1, "gp_ag"), (2, "gp_ag")]}


def prep(src: Path, out: Path, sparse: str) -> dict:
    prepared(out, ["--input", str(src), "--sparse-features", sparse])
    return json.loads((out / "manifest.json").read_text())


def train(data: Path, out: Path, model: str, p: int, layout: str, epochs: int) -> list[dict]:
    """One ``plexgt train`` under mpiexec; its metrics, one dict an epoch."""
    metrics = out / f"{data.name}-{model}-p{p}-{layout}.jsonl"
    metrics.unlink(missing_ok=True)
    where = f"--parallel.grid={layout}" if model == "gcn" else f"--parallel.strategy={layout}"
    launch(mpiexec(p, plexgt("train", "--data", str(data), "--metrics", str(metrics),
                             f"--epochs={epochs}", where, "--optim.warmup_epochs=2",
                             *MODELS[model])), timeout=3600)
    return read_jsonl(metrics)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--datasets", default="physics,computers")
    ap.add_argument("--work", type=Path, default=Path("/tmp/plexgt-bench-sparse"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    rows, graphs = [], {}
    for name in args.datasets.split(","):
        src = gnn_benchmark(name)
        if not src.exists():
            sys.exit(f"bench_sparse_features: {src} is missing (../shared/datasets)")
        mans = {s: prep(src, args.work / f"{name}-{s}", s) for s in ("yes", "no")}
        m = mans["yes"]
        graphs[name] = {"N": m["N"], "E": m["E"], "F": m["F"],
                        "density": m["feature_nnz"] / (m["N"] * m["F"]),
                        "feature_bytes_on_disk": {
                            s: sum(v["bytes"] for k, v in mans[s]["files"].items()
                                   if k.startswith("features/")) for s in ("yes", "no")}}
        for model, layouts in LAYOUTS.items():
            for p, layout in layouts:
                got = {}
                for s in ("no", "yes"):
                    ms = train(args.work / f"{name}-{s}", args.work, model, p, layout,
                               args.epochs)
                    got[s] = (statistics.median(e["time_epoch"] for e in ms[2:] or ms),
                              max(e["peak_mem_bytes"] for e in ms), ms[-1]["loss"])
                (td, md, ld), (ts, msp, ls) = got["no"], got["yes"]
                row = {"dataset": name, "model": model, "ranks": p, "layout": layout,
                       "dense_epoch_s": td, "sparse_epoch_s": ts, "time_sparse_vs_dense": ts / td,
                       "dense_peak_mem_bytes": md, "sparse_peak_mem_bytes": msp,
                       "mem_sparse_vs_dense": msp / md, "dense_final_loss": ld,
                       "sparse_final_loss": ls}
                rows.append(row)
                print(f"{name:9s} {model} p={p} {layout:6s} epoch dense {td:.3f}s sparse "
                      f"{ts:.3f}s ({ts / td:.2f}x)  peak {md / 2**20:.0f} -> "
                      f"{msp / 2**20:.0f} MiB ({msp / md:.2f}x)  loss {ld:.5f} / {ls:.5f}",
                      flush=True)
    write_json("bench_sparse_features.json", {
        "benchmark": "bench_sparse_features", "date": today(), "hardware": hardware(),
        "graphs": graphs, "epochs": args.epochs, "rows": rows,
        "models": {k: " ".join(v) for k, v in MODELS.items()},
        "note": "ratios are sparse over dense on the same model and layout in the same run; "
                "peak memory is the largest resident set of any rank (process and data "
                "included)",
    })

    def pick(ds: str, model: str, p: int, key: str) -> float:
        return next(r[key] for r in rows if (r["dataset"], r["model"], r["ranks"]) ==
                    (ds, model, p))

    fields = {}
    for ds in graphs:
        for model in MODELS:
            fields[f"{ds}_{model}_time"] = pick(ds, model, 1, "time_sparse_vs_dense")
            fields[f"{ds}_{model}_mem"] = pick(ds, model, 1, "mem_sparse_vs_dense")
    result_line(**fields)


if __name__ == "__main__":
    main()
