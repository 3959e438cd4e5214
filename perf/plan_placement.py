"""papers100M gcn on Perlmutter and Frontier: the planner's choice with its time split, beside
the best grid of the Plexus authors' published performance model.

    .venv/bin/python -m perf.plan_placement                  # ~1 min on 2 cores

A model projection, not a measurement: nothing here ran on either machine. For ogbn-papers100M
(N = 111,059,956, 1,615,685,872 directed edges + one self loop a node) and Plexus's own GCN
(3 layers, hidden 128, 172 classes, float32, as their performance model counts it), at
P = 64, 256, 1024 and 2048 GPUs:

* plexgt's :func:`plexgt.plan.choose.choose` on exactly P ranks with the machine description
  (``plexgt/plan/machines/``), the GPU's memory as the limit: every factorisation, layer
  order, blocking and axis order; its grid, order, predicted step, and the split of that step
  (compute, each axis's collectives with their placement);
* the Plexus authors' model (hpcgroup/plexus, ``performance/comm_model.py`` 'v3' and
  ``mem_model.py``), re-derived here from its formulas: power-of-two grids only, Y innermost,
  each layer's all-gathers and all-reduces as fractions of the layer's blocks over the
  bandwidth its group's size and stride get, and its memory count; its best grid is the one
  of least communication among those its memory model fits in the GPU;
* plexgt's own prediction for the Plexus pick, on the same Y-innermost order, so the two
  models' rankings can be compared on one grid.

Writes perf/results/plan_placement.json and .md and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from perf.harness import hardware, result_line, today, write_json, write_text
from plexgt.distributed.grid import Grid3D
from plexgt.plan.agp import SystemModel
from plexgt.plan.choose import GraphSizes, ModelShape, NothingFits, choose, gcn_split
from plexgt.plan.machine import load_machine
from plexgt.plan.plexus_cost import Coefficients, estimate

N, E_DIRECTED, F, C = 111_059_956, 1_615_685_872, 128, 172
E = E_DIRECTED + N
DIMS = [F, 128, 128, C]
SCALES = (64, 256, 1024, 2048)
MACHINES = ("perlmutter", "frontier")

# -- the Plexus authors' model, from its formulas --------------------------------------------
# bandwidth (GB/s) by (stride, size) as their 'v3' empirical table gives it; the same
# numbers plexgt's machine descriptions carry, repeated here so that this script prices their
# model as they wrote it (their lookup falls through to None for sizes it has no row for)
PLEXUS_BW = {
    "perlmutter": lambda ip, my: 1 if my == 1 else (
        {2: 76, 4: 225}.get(my, 66.59) if ip == 1 else
        (76 if my == 2 else 66.59 / 2) if ip == 2 else 66.59 / 4),
    "frontier": lambda ip, my: (
        {2: 129, 4: 52, 8: 135}.get(my, 40) if ip == 1 else
        {2: 50, 4: 72}.get(my, 20) if ip == 2 else
        (36 if my == 2 else 10) if ip == 4 else 5),
}


def pow2_grids(p: int) -> list[tuple[int, int, int]]:
    k = int(math.log2(p))
    return [(2 ** a, 2 ** b, 2 ** (k - a - b)) for a in range(k + 1) for b in range(k + 1 - a)]


def plexus_comm_s(machine: str, x: int, y: int, z: int) -> float:
    """Their communication seconds of one step: per layer i, the axes' roles rotate (all-reduce
    of the aggregate over X, Z, Y; of the output over Y, X, Z; all-gather over Z, Y, X), each
    collective's volume a fraction of the layer's blocks in 4-byte elements over the bandwidth
    of its axis (Y innermost, then X, then Z)."""
    bw_of = PLEXUS_BW[machine]
    size = {"X": x, "Y": y, "Z": z}
    bw = {"Y": bw_of(1, y), "X": bw_of(y, x), "Z": bw_of(y * x, z)}
    gib = 4 / 2**30
    total = 0.0
    for i in range(len(DIMS) - 1):
        d, d_next = DIMS[i], DIMS[i + 1]
        agg, out, ag = ("X", "Z", "Y")[i % 3], ("Y", "X", "Z")[i % 3], ("Z", "Y", "X")[i % 3]
        a_agg, a_out, a_ag = size[agg], size[out], size[ag]

        def gather(vol: float, n_ranks: int = a_ag, axis: str = ag) -> float:
            return (n_ranks - 1) / n_ranks * vol * gib / bw[axis]

        def reduce(n_ranks: int, vol: float, axis: str) -> float:
            return 2 * (n_ranks - 1) / n_ranks * vol * gib / bw[axis]

        feats = N * d / (a_agg * a_out)
        weights = d * d_next / (a_agg * a_out)
        fwd = ((gather(feats) if i == 0 else 0.0)
               + reduce(a_agg, N * d / (a_ag * a_out), agg)
               + gather(weights)
               + reduce(a_out, N * d_next / (a_ag * a_agg), out))
        bwd = (2 * gather(weights) + reduce(a_agg, N * d / (a_ag * a_out), agg)
               + (gather(feats) if i == 0 else 2 * gather(feats)))
        total += fwd + bwd
    return total


def plexus_memory_gib(x: int, y: int, z: int) -> float:
    """Their memory count (``mem_model.py`` ``compute_config_mem``): adjacency blocks and
    transposes in CSR (3 elements a nonzero: two index halves and a value; 2 a row pointer),
    weights with gradient and Adam, aggregates and activations with gradients, the input with
    its optimizer-like copies, the first layer's one-time gathers, int64 labels; in 4-byte
    elements. (Before 2026-12-05 this script counted 2 elements a nonzero and no row
    pointers, a third of their adjacency term.)"""
    g = x * y * z
    adj = sum(2 * (E / (a * b) * 3 + N / a * 2)
              for a, b in [(z, x), (y, z), (x, y)][:min(3, len(DIMS))])
    weights = sum(4 * DIMS[i] * DIMS[i + 1] / g for i in range(len(DIMS) - 1))
    agg_div, act_div = [z * y, y * x, x * z], [x * y, z * x, y * z]
    agg = sum(2 * N * DIMS[i] / agg_div[i % 3] for i in range(len(DIMS) - 1))
    act = sum(2 * N * DIMS[i] / act_div[i % 3] for i in range(1, len(DIMS))) + 4 * N * F / g
    once = N * F / (x * y) + F * DIMS[1] / (y * x)
    labels = N * 2 / {2: z, 0: y}.get(len(DIMS) % 3, x)
    return (adj + weights + agg + act + once + labels) * 4 / 2**30


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}x" if values else "none"


def plexus_best(machine: str, p: int, limit_gib: float) -> dict:
    rows = [(plexus_comm_s(machine, *g), plexus_memory_gib(*g), g) for g in pow2_grids(p)]
    fitting = [r for r in rows if r[1] <= limit_gib] or rows
    comm, mem, (x, y, z) = min(fitting, key=lambda r: r[0])
    return {"grid": f"{x}x{y}x{z}", "comm_s": comm, "memory_gib": mem,
            "fits": mem <= limit_gib}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    rows, fields = [], {}
    lines = ["# papers100M gcn: plexgt's plan beside the Plexus authors' model", "",
             f"{today()}. A model projection from each machine description, not a "
             "measurement. gcn 3 layers, hidden 128, float32.", "",
             "| machine | P | plexgt choice | step s | of it collectives s | GiB/rank | "
             "Plexus model's grid (Y innermost) | its comm s | plexgt on that grid s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in MACHINES:
        mach = load_machine(name)
        limit = mach.memory_per_gpu_bytes
        for p in SCALES:
            prof = mach.profile(p)
            coef, sysm = Coefficients.from_profile(prof), SystemModel.from_profile(prof)
            shape = ModelShape("gcn", 128, 3, esize=4)
            theirs = plexus_best(name, p, limit / 2**30)
            x, y, z = (int(v) for v in theirs["grid"].split("x"))
            on_theirs = estimate(Grid3D(x, y, z), N, E, DIMS, 4, coef)
            try:
                rp = choose(GraphSizes(N, E, F, C), shape, p, sysm, coef, limit).plan
            except NothingFits as e:
                # nothing fits plexgt's memory model: the fastest it prices, unconstrained
                rp = choose(GraphSizes(N, E, F, C), shape, p, sysm, coef).plan
                need = e.least_memory[0] / 2**30 if e.least_memory else float("nan")
                rp = replace(rp, label=f"{rp.label} (nothing fits: {need:.3g} GiB at least)")
            comm = sum(t for what, t in rp.split if not what.startswith("compute"))
            row = {"machine": name, "p": p, "choice": rp.label, "grid": str(rp.grid),
                   "fits": rp.memory_bytes <= limit,
                   "time_s": rp.time_s, "memory_gib": rp.memory_bytes / 2**30,
                   "split": [{"what": w, "seconds": t} for w, t in rp.split],
                   "plexus_model": theirs,
                   "plexus_memory_on_choice_gib": plexus_memory_gib(
                       rp.grid.gx, rp.grid.gy, rp.grid.gz),
                   "plexgt_on_plexus_grid": {"time_s": on_theirs.time_s,
                                             "comm_s": on_theirs.comm_s,
                                             "memory_gib": on_theirs.memory_bytes / 2**30,
                                             "split": [{"what": w, "seconds": t} for w, t in
                                                       gcn_split(on_theirs, coef)]}}
            rows.append(row)
            print(f"{name:<10} P={p:<5} plexgt {rp.label:<36} {rp.time_s:8.4g} s "
                  f"{rp.memory_bytes / 2**30:6.3g} GiB | Plexus model {theirs['grid']:<9} "
                  f"comm {theirs['comm_s']:.4g} s {theirs['memory_gib']:.3g} GiB | plexgt on "
                  f"it {on_theirs.time_s:.4g} s")
            lines.append(f"| {name} | {p} | {rp.label} | {rp.time_s:.4g} | {comm:.4g} | "
                         f"{rp.memory_bytes / 2**30:.3g} | {theirs['grid']} "
                         f"({theirs['memory_gib']:.3g} GiB) | {theirs['comm_s']:.4g} | "
                         f"{on_theirs.time_s:.4g} |")
            fields[f"{name}_p{p}"] = str(rp.grid)
    ratios = [(r["plexgt_on_plexus_grid"]["memory_gib"] / r["plexus_model"]["memory_gib"],
               r["plexus_model"]["grid"]) for r in rows]
    ratios += [(r["memory_gib"] / r["plexus_memory_on_choice_gib"], r["grid"]) for r in rows]
    long_y = {g for q, g in ratios if q > 1}
    short = [q for q, g in ratios if g not in long_y]
    longr = [q for q, g in ratios if g in long_y]
    lines += ["", "Memory per GPU, GiB, the two models side by side on the same grids (model "
              "projections): plexgt's count (blocks padded to equal shapes, the busiest "
              "rank's, its process base included) and the Plexus authors' "
              "(``performance/mem_model.py``, 4-byte elements, no process or library "
              "memory), on the Plexus model's pick and on plexgt's choice. plexgt counts a "
              "step's peak moment: what every layer keeps for its backward plus the largest "
              "layer's working set (checked on the 2-core VM against the measured peak, "
              "validate_plan.md); the Plexus count adds every layer's aggregate and "
              "activation with a gradient of each, as if all were alive at once. So plexgt's "
              f"count is the lower one ({_span(short)} of theirs) but on "
              f"{', '.join(sorted(long_y)) or 'no grid here'} ({_span(longr)}), grids with a "
              "long Y, where plexgt "
              "pads every width to a multiple of the previous layer's Ga·Gb (hidden 128 -> "
              "256 on 4x64x4) and holds the padded blocks, which the Plexus count does not "
              "pad.", "",
              "| machine | P | Plexus pick | plexgt GiB | Plexus model GiB | plexgt / Plexus "
              "| plexgt choice | plexgt GiB | Plexus model GiB | plexgt / Plexus |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, b = r["plexgt_on_plexus_grid"]["memory_gib"], r["plexus_model"]["memory_gib"]
        c, d = r["memory_gib"], r["plexus_memory_on_choice_gib"]
        lines.append(f"| {r['machine']} | {r['p']} | {r['plexus_model']['grid']} | {a:.3g} | "
                     f"{b:.3g} | {a / b:.2f} | {r['grid']} | {c:.3g} | {d:.3g} | "
                     f"{c / d:.2f} |")
    lines += ["", "Time split of each plexgt choice (seconds of one step):", ""]
    for r in rows:
        lines.append(f"- {r['machine']} P={r['p']} {r['choice']}: " + "; ".join(
            f"{s['what']} {s['seconds']:.3g}" for s in r["split"]))
    write_json("plan_placement.json", {"date": today(), "hardware": hardware(),
                                       "kind": "model projection (machine descriptions)",
                                       "graph": {"n": N, "e": E, "dims": DIMS},
                                       "rows": rows})
    write_text("plan_placement.md", "\n".join(lines) + "\n")
    result_line(bench="plan_placement", **fields)


if __name__ == "__main__":
    main()
