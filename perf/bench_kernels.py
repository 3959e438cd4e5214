"""Compiled CPU attention kernels vs torch's sparse kernels, across head widths d'.

    OMP_NUM_THREADS=2 .venv/bin/python -m perf.bench_kernels [--widths 8,16,32,64] [--rounds 7]

plexgt.ops.sparse_attention forward + backward (q, k, v leaf tensors [N, h, d'], float32) on
two uniform random graphs (50K nodes of degree 10; 4K nodes of degree 200), 4 heads, each
head width with the compiled kernels (:mod:`plexgt.ops.native`) and with torch's per-head
sparse kernels (``PLEXGT_NATIVE=0``), the baseline, in the same process. Each round times one
call of every (graph, width, kernels) in rotating order, so load from other jobs falls on
both alike; reported: the fastest call (headline) and the median, and torch's time over the
compiled kernels' (> 1: the compiled ones are faster) per graph and width.

The compiled kernels keep one output row's accumulator in vector registers; before that, at
d' = 32 and 64 the compiler left it on the stack (their backward was slower than torch's).
Writes perf/results/bench_kernels<tag>.json (dated inside) and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time
from pathlib import Path

import torch

from perf.harness import ROOT, hardware, passive_omp_wait, result_line, today, write_json
from plexgt.ops import native
from plexgt.ops.attention import sparse_attention
from plexgt.plan.kernel_samples import random_graph

GRAPHS = {"sparse_50k_deg10": (50_000, 10), "dense_4k_deg200": (4_000, 200)}
HEADS = 4
KERNELS = {"compiled": "1", "torch": "0"}


def _call(graph, q: torch.Tensor, kernels: str) -> float:  # noqa: ANN001 - CSRGraph
    os.environ["PLEXGT_NATIVE"] = KERNELS[kernels]
    t0 = time.perf_counter()
    sparse_attention(graph, q, q, q).sum().backward()
    dt = time.perf_counter() - t0
    q.grad = None
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="8,16,32,64")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--kernel-source", type=Path,
                    help="time this version of attention_cpu.cpp as the compiled kernels "
                         "(A/B of a kernel change; e.g. one from `git show REV:path`)")
    ap.add_argument("--tag", default="", help="suffix of the results file")
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    if args.kernel_source is not None:
        digest = hashlib.sha1(args.kernel_source.read_bytes()).hexdigest()[:10]
        native._state["module"] = native.build(f"plexgt_bench_kernels_{digest}",
                                               source=args.kernel_source)
    if native.load() is None:
        raise SystemExit("bench_kernels: the compiled kernels did not build; nothing to compare")
    cases = []
    for gname, (n, deg) in GRAPHS.items():
        graph = random_graph(n, deg, 0, torch.device("cpu"))
        for d in widths:
            q = torch.randn(n, HEADS, d, requires_grad=True)
            for kern in KERNELS:
                _call(graph, q, kern)  # warm-up: caches, index copies, first-touch pages
                cases.append({"graph": gname, "n": n, "e": graph.num_edges, "width": d,
                              "kernels": kern, "_g": graph, "_q": q, "s": []})
    for r in range(args.rounds):
        shift = r % len(cases)
        for c in cases[shift:] + cases[:shift]:
            c["s"].append(_call(c["_g"], c["_q"], c["kernels"]))
    rows, ratios = [], {}
    for c in cases:
        row = {k: v for k, v in c.items() if not k.startswith("_")}
        row["min_s"], row["median_s"] = min(c["s"]), statistics.median(c["s"])
        rows.append(row)
    for gname in GRAPHS:
        for d in widths:
            mine = next(r for r in rows if r["graph"] == gname and r["width"] == d
                        and r["kernels"] == "compiled")
            base = next(r for r in rows if r["graph"] == gname and r["width"] == d
                        and r["kernels"] == "torch")
            rat = {"min": base["min_s"] / mine["min_s"],
                   "median": base["median_s"] / mine["median_s"]}
            ratios[f"{gname}_d{d}"] = rat
            print(f"{gname:>18} d'={d:<3} compiled {1e3 * mine['min_s']:8.1f} ms  torch "
                  f"{1e3 * base['min_s']:8.1f} ms  torch/compiled {rat['min']:.2f}x "
                  f"(median {rat['median']:.2f}x)", flush=True)
    hw = hardware()
    path = write_json(f"bench_kernels{args.tag}.json", {
        "date": today(), "hardware": hw, "heads": HEADS, "rounds": args.rounds,
        "kernel_source": str(args.kernel_source or native.SOURCE.relative_to(ROOT)),
        "dtype": "float32", "what": "sparse_attention forward + backward, q = k = v leaves",
        "rows": rows, "torch_over_compiled": ratios})
    print(f"wrote {path}")
    result_line(bench="kernels" + args.tag, cpu=hw["cpu"].replace(" ", "_"),
                threads=hw["torch_threads"],
                **{f"speedup_{k}": v["min"] for k, v in ratios.items()},
                min_speedup=min(v["min"] for v in ratios.values()))


if __name__ == "__main__":
    passive_omp_wait("perf.bench_kernels")
    main()
