"""What the edge bias and global super nodes cost, and whether the bias learns what it is given.

    .venv/bin/python -m perf.bench_extras                 # ~10 min on 2 cores
    .venv/bin/python -m perf.bench_extras --epochs 4 --accuracy-epochs 0

One SBM graph (50,000 nodes, 1,000,000 edges, 64 node features, 8 communities) prepared once
with 4 edge features per edge: column 0 is 1 on edges inside a community and 0 across, the rest
noise. ``plexgt train`` (gt, hidden 64, 4 heads, 2 blocks, float32) runs, on each layout
(1 rank; 2 ranks with GP-AG; 2 ranks with GP-Ring), four models side by side:

* plain: the edge features ignored (``model.edge_bias=false``), no super nodes (the baseline);
* bias: each block adds W_b·x_e per head to its edges' scores;
* super: 4 global super nodes;
* both.

Per run: the median epoch time over the epochs after the first two, and the largest peak
resident memory of any rank (the metrics JSONL's), each as a ratio to the plain model's on the
same layout. Then, on one rank, plain and bias train ``--accuracy-epochs`` epochs on a harder
SBM (20,000 nodes, 400,000 edges, only 25% of them inside a community, weak node features:
the neighbourhood misleads unless the attention tells the edges apart) with the same 4 edge
features: the best validation accuracy and its test accuracy (does the bias use the signal?).
Writes perf/results/bench_extras.json and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial
from pathlib import Path

from perf.harness import (
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
from plexgt.data.synthetic import sbm

MODELS = {"plain": (False, 0), "bias": (True, 0), "super": (False, 4), "both": (True, 4)}
"""name -> (model.edge_bias, model.super_nodes)."""
LAYOUTS = [(1, "gp_ag"), (2, "gp_ag"), (2, "gp_ring")]
TRAIN = ["--model.name=gt", "--model.hidden=64", "--model.heads=4", "--model.layers=2",
         "--optim.warmup_epochs=2"]


def train(data: Path, out: Path, p: int, strategy: str, edge_bias: bool, super_nodes: int,
          epochs: int) -> list[dict]:
    """One ``plexgt train`` under mpiexec; its metrics, one dict an epoch."""
    metrics = out / f"p{p}-{strategy}-{int(edge_bias)}-{super_nodes}-{epochs}.jsonl"
    metrics.unlink(missing_ok=True)
    launch(mpiexec(p, plexgt("train", "--data", str(data), "--metrics", str(metrics),
                             f"--epochs={epochs}", f"--parallel.strategy={strategy}",
                             f"--model.edge_bias={str(edge_bias).lower()}",
                             f"--model.super_nodes={super_nodes}", *TRAIN)), timeout=1800)
    return read_jsonl(metrics)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--accuracy-epochs", type=int, default=150)
    ap.add_argument("--work", type=Path, default=Path("/tmp/plexgt-bench-extras"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    data = prepared(args.work / "sbm", ["--format", "sbm", "--nodes", "50000", "--edges",
                                        "1000000", "--edge-features", "4"])
    rows = []
    for p, strategy in LAYOUTS:
        base = None
        for name, (bias, sn) in MODELS.items():
            m = train(data, args.work, p, strategy, bias, sn, args.epochs)
            t = statistics.median(e["time_epoch"] for e in m[2:] or m)
            mem = max(e["peak_mem_bytes"] for e in m)
            row = {"ranks": p, "strategy": strategy, "model": name, "edge_bias": bias,
                   "super_nodes": sn, "epoch_s_median": t, "peak_mem_bytes": mem}
            base = base or row
            row["time_vs_plain"] = t / base["epoch_s_median"]
            row["mem_vs_plain"] = mem / base["peak_mem_bytes"]
            rows.append(row)
            print(f"p={p} {strategy:8s} {name:6s} epoch {t:.3f}s ({row['time_vs_plain']:.2f}x)"
                  f"  peak {mem / 2**20:.0f} MiB ({row['mem_vs_plain']:.2f}x)", flush=True)
    acc = {}
    if args.accuracy_epochs:
        hard = prepared(args.work / "sbm-hard", partial(
            sbm, num_nodes=20_000, num_edges=400_000, num_classes=8, num_features=64, seed=3,
            p_intra=0.25, centroid_scale=0.15, edge_features=4))
        for name in ("plain", "bias"):
            bias, sn = MODELS[name]
            m = train(hard, args.work, 1, "gp_ag", bias, sn, args.accuracy_epochs)
            best = max(m, key=lambda e: e["valid_acc"])
            acc[name] = {"best_valid_acc": best["valid_acc"], "test_acc": best["test_acc"],
                         "epoch": best["epoch"]}
            print(f"accuracy {name}: valid {best['valid_acc']:.4f} test {best['test_acc']:.4f}"
                  f" (epoch {best['epoch']})", flush=True)

    def ratio(model: str, key: str, p: int, strategy: str) -> float:
        return next(r[key] for r in rows if r["model"] == model and r["ranks"] == p
                    and r["strategy"] == strategy)

    payload = {
        "benchmark": "bench_extras", "date": today(), "hardware": hardware(),
        "graph": "sbm(nodes=50000, edges=1000000, classes=8, features=64, edge_features=4), "
                 "symmetrised by the generator, prep defaults",
        "model": "gt hidden 64, 4 heads, 2 blocks, float32, AdamW (plexgt train defaults)",
        "epochs": args.epochs, "rows": rows, "accuracy": acc,
        "accuracy_graph": "sbm(nodes=20000, edges=400000, classes=8, features=64, seed=3, "
                          "p_intra=0.25, centroid_scale=0.15, edge_features=4), 1 rank, "
                          f"{args.accuracy_epochs} epochs",
        "note": "ratios are against the plain model on the same layout in the same run; the "
                "edge bias runs on torch's sparse kernels (the compiled CPU kernels fuse the "
                "softmax into the scores and take no bias), which is most of its time cost "
                "here",
    }
    write_json("bench_extras.json", payload)
    fields = {f"{m}_time_ring2": ratio(m, "time_vs_plain", 2, "gp_ring")
              for m in ("bias", "super", "both")}
    fields.update({f"{m}_mem_ring2": ratio(m, "mem_vs_plain", 2, "gp_ring")
                   for m in ("bias", "super", "both")})
    if acc:
        fields["acc_plain"] = acc["plain"]["test_acc"]
        fields["acc_bias"] = acc["bias"]["test_acc"]
    result_line(**fields)


if __name__ == "__main__":
    main()
