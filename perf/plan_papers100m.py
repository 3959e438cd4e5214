"""Which attention strategies fit a graph transformer on ogbn-papers100M, and which AGP picks.

    .venv/bin/python -m perf.plan_papers100m [--profile system.json]

gt with hidden 128, 8 heads, 3 layers, float32, on the sizes of papers100M (111,059,956 nodes,
1,615,685,872 directed edges + one self loop per node, 128 features, 172 classes), planned from
sizes alone (:func:`plexgt.plan.agp.plan`, as ``plexgt plan --nodes ...`` does) at P = 64,
256, 1024 and 2048 ranks with 40 GB and 80 GB per rank: for each strategy (GP-2D at its
fastest fitting head axis, or its smallest when none fits; the rings also with K/V sent in 8
pieces) its per-rank memory, whether it fits, its predicted step, and the choice. The memory
figures come from each strategy's memory model and do not depend on the machine; the times
do (default coefficients unless ``--profile``: no machine description yet), so they rank
options and are not a prediction of papers100M's epoch on any real system. Writes
perf/results/plan_papers100m.json and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from perf.agp_algorithm3 import plan
from perf.harness import hardware, result_line, today, write_json
from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.choose import GraphSizes, ModelShape, workload
from plexgt.plan.profile import read_profile
from plexgt.tasks.task import system_model_for

N, E_DIRECTED, F, C = 111_059_956, 1_615_685_872, 128, 172
E = E_DIRECTED + N
MODEL = {"hidden": 128, "heads": 8, "layers": 3}
SCALES = (64, 256, 1024, 2048)
LIMITS_GB = (40, 80)
RING_CHUNKS = 8
"""The rings are also planned with K/V blocks sent in this many pieces (less in flight)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path)
    args = ap.parse_args()
    prof = read_profile(args.profile) if args.profile else None
    sysm = system_model_for(prof)
    w = workload(GraphSizes(N, E, F, C), ModelShape("gt", MODEL["hidden"], MODEL["layers"],
                                                    MODEL["heads"]))
    strategies = list(default_registry())
    rings = [s for s in strategies if s.name in ("gp_ring", "gp_2d")]
    out = []
    fields = {}
    for p in SCALES:
        for gb in LIMITS_GB:
            t0 = time.perf_counter()
            pls = {c: plan(replace(w, ring_chunks=c), strategies if c == 1 else rings, [p],
                           sysm, gb * 2**30) for c in (1, RING_CHUNKS)}
            secs = time.perf_counter() - t0
            per = {}
            rows = [(r, "") for r in pls[1].rows] + [(r, f" c{RING_CHUNKS}")
                                                     for r in pls[RING_CHUNKS].rows]
            for r, tag in rows:
                name = r.est.strategy + tag
                cur = per.get(name)
                # the fastest layout that fits, else the one needing least memory
                key = (r.fits, -r.est.time_s if r.fits else -r.est.memory["total"])
                if cur is None or key > cur["key"]:
                    per[name] = {"label": r.est.label + tag, "fits": r.fits,
                                 "memory_gib": r.est.memory["total"] / 2**30,
                                 "time_s": r.est.time_s, "key": key}
            for v in per.values():
                v.pop("key")
            best = min(((r, tag) for r, tag in rows if r.chosen),
                       key=lambda x: x[0].est.time_s, default=None)
            choice = best[0].est.label + best[1] if best else None
            out.append({"p": p, "memory_per_rank_gb": gb, "strategies": per,
                        "choice": choice, "plan_seconds": secs})
            fits = ",".join(k for k, v in per.items() if v["fits"]) or "none"
            print(f"P={p:<5} {gb} GB: fit {fits:<28} choice {choice}  "
                  + "  ".join(f"{k} {v['memory_gib']:.1f} GiB" for k, v in per.items()))
            fields[f"p{p}_{gb}gb"] = (choice or "none").replace(" ", "_")
    payload = {"date": today(), "hardware": hardware(), "model": MODEL,
               "graph": {"n": N, "e": E, "features": F, "classes": C},
               "coefficients": str(args.profile) if args.profile else "defaults (no profile)",
               "rows": out}
    write_json("plan_papers100m.json", payload)
    result_line(bench="plan_papers100m", **fields)


if __name__ == "__main__":
    main()
