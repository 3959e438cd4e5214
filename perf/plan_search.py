"""How long the search over every configuration takes, and whether its shortcut loses anything.

    .venv/bin/python -m perf.plan_search                 # ~3 min on 2 cores

For ogbn-papers100M's sizes (N = 111,059,956, E = 1,726,745,828 + N self loops; bfloat16
activations) on the Perlmutter and Frontier machine descriptions (a model projection, not a
measurement): :func:`plexgt.plan.choose.choose` over every scale 1..2048 with the GPUs'
memory as the limit, for gcn (3 layers, hidden 128, as Plexus runs it: every factorisation
of every scale, layer order, blocking) and gt and gps (3 blocks, hidden 128, 8 heads: every
strategy, gp_2d head axis, ring pieces, attention row blocks, gps's GCN path 1D or 3D) — its
wall time (the issue's target: under 10 s), configurations priced and dropped on memory
before pricing, the chosen configuration and the frontier. Then the two-stage searches
against full enumeration on four graph shapes (P = 96): whether
both choose the same configuration and how much slower the two-stage choice is predicted to
be. Writes perf/results/plan_search.json and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import time

from perf.harness import hardware, result_line, today, write_json
from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.agp import Workload, gcn_grid_for
from plexgt.plan.choose import GraphSizes, ModelShape, NothingFits, choose
from plexgt.plan.machine import load_machine
from plexgt.plan.plexus_cost import Coefficients
from plexgt.plan.search import search_gcn
from plexgt.plan.search_attention import search_attention
from plexgt.tasks.task import system_model_for

N, E = 111_059_956, 1_726_745_828
DIMS = [128, 128, 128, 172]
SHAPES = {  # name: (N, nnz, dims) for the shortcut check
    "papers100M": (N, E + N, DIMS),
    "products": (2_449_029, 123_718_280 + 2_449_029, [100, 128, 128, 47]),
    "physics-wide": (34_493, 530_417, [8415, 64, 5]),
    "reddit-deep": (232_965, 114_615_892, [602, 256, 256, 256, 41]),
}


ATTENTION_SHAPES = {  # name: (N, E, F, C) for the attention shortcut check
    "papers100M": (N, E + N, 128, 172),
    "products": (2_449_029, 123_718_280 + 2_449_029, 100, 47),
    "physics": (34_493, 530_417, 8415, 5),
    "reddit": (232_965, 114_615_892, 602, 41),
}


def _fields(rp, found) -> dict:
    return {"seconds": found.seconds, "priced": found.priced,
            "pruned": getattr(found, "pruned", 0), "grids": getattr(found, "grids", None),
            "chosen": {"label": rp.label, "scale": rp.scale, "time_s": rp.time_s,
                       "memory_gib": rp.memory_bytes / 2**30},
            "frontier": [{"label": f.label, "scale": f.scale, "time_s": f.est.time_s,
                          "memory_gib": (f.est.memory_bytes if hasattr(f.est, "memory_bytes")
                                         else f.est.memory["total"]) / 2**30}
                         for f in found.frontier]}


def _check(fast, full, seconds: tuple[float, float]) -> dict:
    return {"same_choice": (fast.chosen.label, fast.chosen.scale) ==
            (full.chosen.label, full.chosen.scale),
            "fast": f"{fast.chosen.label} on {fast.chosen.scale}",
            "full": f"{full.chosen.label} on {full.chosen.scale}",
            "slower": fast.chosen.est.time_s / full.chosen.est.time_s - 1,
            "priced_fast": fast.priced, "priced_full": full.priced,
            "seconds_fast": seconds[0], "seconds_full": seconds[1]}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    rows: dict = {}
    sizes = GraphSizes(N, E + N, 128, 172)
    for machine in ("perlmutter", "frontier"):
        mach = load_machine(machine)
        prof = mach.profile(2048)
        sysm, coef = system_model_for(prof), Coefficients.from_profile(prof)
        rows[machine] = {}
        for model in ("gcn", "gt", "gps"):
            shape = ModelShape(model, 128, 3, 8, esize=2)
            t0 = time.perf_counter()
            try:
                rp, found = choose(sizes, shape, 2048, sysm, coef, mach.usable_memory_bytes,
                                   any_scale=True)
            except NothingFits as e:  # e.g. gt on ROCm: the rings are not there yet
                rows[machine][model] = {"chosen": None, "nothing_fits": str(e),
                                        "seconds": time.perf_counter() - t0}
                print(f"{machine} {model}: {e}", flush=True)
                continue
            rows[machine][model] = _fields(rp, found)
            print(f"{machine} {model}: {found.priced} priced, "
                  f"{getattr(found, 'pruned', 0)} pruned in {found.seconds:.2f} s; chosen "
                  f"{rp.label} on {rp.scale}", flush=True)
    check: dict = {"gcn_p96": {}, "gt_p96": {}, "gps_p96": {}}
    prof = load_machine("perlmutter").profile(96)
    sysm, coef = system_model_for(prof), Coefficients.from_profile(prof)
    for name, (n, nnz, dims) in SHAPES.items():
        fast = search_gcn(n, nnz, dims, 2, coef, 96)
        full = search_gcn(n, nnz, dims, 2, coef, 96, refine=None)
        check["gcn_p96"][name] = _check(fast, full, (fast.seconds, full.seconds))
    reg = list(default_registry())
    for name, (n, e, f, c) in ATTENTION_SHAPES.items():
        for model in ("gt", "gps"):
            w = Workload(model, n, e, f, c, 128, 8, 3, esize=2)

            def grid_at(s: int, w: Workload = w) -> object:
                return gcn_grid_for(s, w.n, w.e, 128, 2, coef)

            fast = search_attention(w, reg, 96, sysm, gcn_grid_at=grid_at)
            full = search_attention(w, reg, 96, sysm, gcn_grid_at=grid_at, refine=False)
            check[f"{model}_p96"][name] = _check(fast, full, (fast.seconds, full.seconds))
    for key, block in check.items():
        for name, v in block.items():
            print(f"{key} {name}: same={v['same_choice']} slower {100 * v['slower']:.2f}% "
                  f"({v['priced_fast']} vs {v['priced_full']} priced)", flush=True)
    write_json("plan_search.json", {
        "benchmark": "plan_search", "date": today(), "hardware": hardware(),
        "workload": "ogbn-papers100M sizes; gcn 3 layers hidden 128; gt and gps 3 blocks "
                    "hidden 128 8 heads; bfloat16 activations; scales 1..2048; memory limit "
                    "= what a plan may fill of the machine's GPU (0.9 of it less 1.5 GiB); "
                    "gcn also searches the axis order (placement-aware descriptions)",
        "note": "predictions of the cost models on machine descriptions (a projection); the "
                "seconds are the search's own wall time on this machine",
        "machines": rows, "shortcut_vs_full_enumeration": check})
    allc = [v for block in check.values() for v in block.values()]
    result_line(**{f"{m}_{k}_s": round(rows[m][k]["seconds"], 2) for m in rows
                   for k in rows[m]},
                same_choice=sum(v["same_choice"] for v in allc), of=len(allc),
                worst_slower=max(v["slower"] for v in allc))


if __name__ == "__main__":
    main()
