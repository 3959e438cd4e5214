"""How long gcn's search over every configuration takes, and whether its shortcut loses anything.

    .venv/bin/python perf/plan_search.py                 # ~1 min on 2 cores

For ogbn-papers100M's sizes (N = 111,059,956, E = 1,726,745,828 + N self loops; gcn 3 layers,
hidden 128, as Plexus runs it; bfloat16 activations) on the Perlmutter and Frontier machine
descriptions (a model projection, not a measurement): :func:`plexgt.plan.search.search_gcn`
over every factorisation of every scale 1..2048 with the GPUs' memory as the limit — its wall
time (the issue's target: under 10 s), grids and configurations priced, the chosen
configuration and the frontier. Then, at P = 96, the two-stage search against full
enumeration (every grid in every order, blocked and whole) on four graph shapes: whether both
choose the same configuration and how much slower the two-stage choice is predicted to be.
Writes perf/results/plan_search.json and ends with one RESULT line.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "perf"))

from common import hardware, result_line, today, write_json  # noqa: E402

from plexgt.plan.machine import load_machine  # noqa: E402
from plexgt.plan.plexus_cost import Coefficients  # noqa: E402
from plexgt.plan.search import search_gcn  # noqa: E402

N, E = 111_059_956, 1_726_745_828
DIMS = [128, 128, 128, 172]
SHAPES = {  # name: (N, nnz, dims) for the shortcut check
    "papers100M": (N, E + N, DIMS),
    "products": (2_449_029, 123_718_280 + 2_449_029, [100, 128, 128, 47]),
    "physics-wide": (34_493, 530_417, [8415, 64, 5]),
    "reddit-deep": (232_965, 114_615_892, [602, 256, 256, 256, 41]),
}


def main() -> None:
    rows = {}
    for machine in ("perlmutter", "frontier"):
        mach = load_machine(machine)
        coef = Coefficients.from_profile(mach.profile(2048))
        r = search_gcn(N, E + N, DIMS, 2, coef, 2048, mach.memory_per_gpu_bytes)
        c = r.chosen
        rows[machine] = {
            "seconds": r.seconds, "grids": r.grids, "priced": r.priced,
            "chosen": None if c is None else {"label": c.label, "scale": c.scale,
                                              "time_s": c.est.time_s,
                                              "memory_gib": c.est.memory_bytes / 2**30},
            "frontier": [{"label": f.label, "scale": f.scale, "time_s": f.est.time_s,
                          "memory_gib": f.est.memory_bytes / 2**30} for f in r.frontier]}
        print(f"{machine}: {r.grids} grids, {r.priced} configurations in {r.seconds:.2f} s; "
              f"chosen {c.label if c else None} on {c.scale if c else 0}", flush=True)
    check = {}
    coef = Coefficients.from_profile(load_machine("perlmutter").profile(96))
    for name, (n, nnz, dims) in SHAPES.items():
        fast = search_gcn(n, nnz, dims, 2, coef, 96)
        full = search_gcn(n, nnz, dims, 2, coef, 96, refine=None)
        check[name] = {"same_choice": (fast.chosen.label, fast.chosen.scale) ==
                       (full.chosen.label, full.chosen.scale),
                       "fast": f"{fast.chosen.label} on {fast.chosen.scale}",
                       "full": f"{full.chosen.label} on {full.chosen.scale}",
                       "slower": fast.chosen.est.time_s / full.chosen.est.time_s - 1,
                       "priced_fast": fast.priced, "priced_full": full.priced,
                       "seconds_fast": fast.seconds, "seconds_full": full.seconds}
        print(f"{name}: same={check[name]['same_choice']} slower "
              f"{100 * check[name]['slower']:.2f}% ({fast.priced} vs {full.priced} priced)",
              flush=True)
    write_json("plan_search.json", {
        "benchmark": "plan_search", "date": today(), "hardware": hardware(),
        "workload": "ogbn-papers100M sizes, gcn 3 layers hidden 128, bfloat16 activations, "
                    "scales 1..2048, memory limit = the machine's GPU memory",
        "note": "predictions of the cost model on machine descriptions (a projection); the "
                "seconds are the search's own wall time on this machine",
        "machines": rows, "shortcut_vs_full_enumeration_p96": check})
    result_line(perlmutter_s=rows["perlmutter"]["seconds"],
                frontier_s=rows["frontier"]["seconds"],
                same_choice=sum(v["same_choice"] for v in check.values()),
                of=len(check), worst_slower=max(v["slower"] for v in check.values()))


if __name__ == "__main__":
    main()
