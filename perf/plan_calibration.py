"""How well the planner without a profile prices this CPU host: default coefficients, the quick
built-in calibration (plexgt.plan.calibrate) and a full ``plexgt profile``, against measured
epoch times at 1, 2 and 4 ranks.

Graphs: the demo's (``make demo``: an SBM of 50K nodes and 1M edges, GPS from
jobscripts/configs/demo.toml) and Amazon Computers (gnn-benchmark npz, gcn with train's
defaults). For each predictor: predicted step seconds at each rank count (the fastest
configuration of that many ranks, ``plexgt plan --json``'s rows), the ratio predicted/measured
and the rank count it ranks fastest. Measured: ``plexgt train --grid auto --strategy auto`` at
each rank count (planned with the calibration, whose cache it shares), the median epoch after
the first, a few epochs. Writes perf/results/plan_calibration.{json,md}.

    python -m perf.plan_calibration [--work DIR] [--epochs 4] [--profile-ranks 4] [--datasets DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from perf.harness import (
    DATASETS_DIR,
    ROOT,
    gnn_benchmark,
    hardware,
    launch,
    mpiexec,
    passive_omp_wait,
    plexgt,
    prep_sbm,
    prepared,
    read_jsonl,
    result_line,
    today,
    write_json,
    write_text,
)

RANKS = (1, 2, 4)
DEMO = ROOT / "jobscripts" / "configs" / "demo.toml"


def _env(xdg: Path, calibrate: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PLEXGT_NO_CALIBRATE",
                                                             "OMP_NUM_THREADS")}
    env["XDG_CACHE_HOME"] = str(xdg)
    if not calibrate:
        env["PLEXGT_NO_CALIBRATE"] = "1"
    return env


def predict(data: Path, model_args: list[str], extra: list[str], env: dict[str, str],
            out: Path) -> dict[int, float]:
    """{ranks: predicted step seconds of the fastest configuration of that many ranks}."""
    launch(plexgt("plan", "--data", str(data), "--world-size", str(max(RANKS)), *model_args,
                  *extra, "--json", str(out)), env=env)
    rows = json.loads(out.read_text())["rows"]
    return {r["scale"]: r["time_s"] for r in rows if r["scale"] in RANKS}


def measure(data: Path, model_args: list[str], ranks: int, epochs: int, env: dict[str, str],
            work: Path) -> dict[str, object]:
    """Median epoch seconds after the first of ``plexgt train`` on ``ranks`` ranks."""
    m = work / f"metrics-{data.name}-{ranks}.jsonl"
    m.unlink(missing_ok=True)
    launch(mpiexec(ranks, plexgt("train", "--data", str(data), *model_args, "--grid", "auto",
                                 "--strategy", "auto", "--epochs", str(epochs),
                                 "--metrics", str(m))), env=env)
    rows = [r for r in read_jsonl(m) if "time_epoch" in r]
    times = [r["time_epoch"] for r in rows[1:]] or [rows[0]["time_epoch"]]
    return {"epoch_s": statistics.median(times), "epochs_s": [r["time_epoch"] for r in rows],
            "grid": rows[-1].get("grid"), "strategy": rows[-1].get("strategy")}


def main() -> None:
    passive_omp_wait("perf.plan_calibration")
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "plan_calibration")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--profile-ranks", type=int, default=4)
    ap.add_argument("--datasets", type=Path, default=DATASETS_DIR)
    args = ap.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    xdg = work / "xdg"
    graphs = {
        "demo-sbm": (prep_sbm(work / "demo-sbm", 50000, 1000000, 8, 64),
                     ["--config", str(DEMO)]),
        "computers": (prepared(work / "computers", ["--input", str(gnn_benchmark("computers",
                                                                                args.datasets))]),
                      ["--model", "gcn"]),
    }
    t0 = time.perf_counter()
    # the calibration first, alone (its own time is part of the result)
    for cache in xdg.glob("plexgt/calibration-*.json"):
        cache.unlink()
    t = time.perf_counter()
    first = next(iter(graphs.values()))
    launch(plexgt("plan", "--data", str(first[0]), "--world-size", "1", *first[1]),
           env=_env(xdg, True))
    calib_s = time.perf_counter() - t
    prof = work / "system.json"
    t = time.perf_counter()
    launch(mpiexec(args.profile_ranks, plexgt("profile", "--out", str(prof))),
           env=_env(xdg, False), timeout=600)
    profile_s = time.perf_counter() - t
    runs: dict[str, dict[str, object]] = {}
    for name, (data, margs) in graphs.items():
        pred = {
            "defaults": predict(data, margs, [], _env(xdg, False), work / "p-def.json"),
            "quick calibration": predict(data, margs, [], _env(xdg, True), work / "p-cal.json"),
            "full profile": predict(data, margs, ["--profile", str(prof)], _env(xdg, False),
                                    work / "p-prof.json"),
        }
        meas = {p: measure(data, margs, p, args.epochs, _env(xdg, True), work) for p in RANKS}
        fastest = min(RANKS, key=lambda p: meas[p]["epoch_s"])
        runs[name] = {
            "measured": {str(p): v for p, v in meas.items()}, "measured_fastest": fastest,
            "predictors": {k: {"predicted_s": {str(p): v[p] for p in RANKS},
                               "ratio": {str(p): v[p] / meas[p]["epoch_s"] for p in RANKS},
                               "fastest": min(RANKS, key=v.__getitem__)}
                           for k, v in pred.items()},
        }
    out = {"date": today(), "hardware": hardware(), "load_average": os.getloadavg(),
           "epochs": args.epochs, "calibration_s": calib_s, "profile_ranks": args.profile_ranks,
           "profile_s": profile_s, "seconds": time.perf_counter() - t0, "runs": runs}
    write_json("plan_calibration.json", out)
    write_text("plan_calibration.md", markdown(out))
    right = {k: sum(r["predictors"][k]["fastest"] == r["measured_fastest"] for r in runs.values())
             for k in ("defaults", "quick calibration", "full profile")}
    one = {k: statistics.median(r["predictors"][k]["ratio"]["1"] for r in runs.values())
           for k in right}
    result_line(graphs=len(runs), calibration_s=calib_s, profile_s=profile_s,
                ratio1_defaults=one["defaults"], ratio1_calibration=one["quick calibration"],
                ratio1_profile=one["full profile"],
                fastest_right_defaults=f"{right['defaults']}/{len(runs)}",
                fastest_right_calibration=f"{right['quick calibration']}/{len(runs)}",
                fastest_right_profile=f"{right['full profile']}/{len(runs)}")


def markdown(out: dict) -> str:
    lines = [f"# Planner coefficients on this CPU host: defaults, quick calibration, profile "
             f"({out['date']})", "",
             f"Hardware: {out['hardware']['cpu']}, {out['hardware']['usable_cores']} usable "
             f"cores, torch {out['hardware']['torch']}; load average at the end "
             f"{', '.join(f'{x:.1f}' for x in out['load_average'])} (a VM shared with other "
             f"jobs). Quick calibration: {out['calibration_s']:.1f} s (the plan command "
             f"included); full `plexgt profile` on {out['profile_ranks']} ranks: "
             f"{out['profile_s']:.0f} s. Measured: median epoch of {out['epochs']} after the "
             "first, `train --grid auto --strategy auto` (planned with the calibration).", ""]
    for name, r in out["runs"].items():
        lines += [f"## {name}", "",
                  "| ranks | measured s | layout | " + " | ".join(
                      f"{k} s (pred/meas)" for k in r["predictors"]) + " |",
                  "|---|---|---|" + "---|" * len(r["predictors"])]
        for p, m in r["measured"].items():
            lines.append(f"| {p} | {m['epoch_s']:.4g} | {m['grid']} {m['strategy']} | "
                         + " | ".join(f"{v['predicted_s'][p]:.4g} ({v['ratio'][p]:.2f}x)"
                                      for v in r["predictors"].values()) + " |")
        lines += ["", f"Fastest: measured {r['measured_fastest']} ranks; "
                  + ", ".join(f"{k} {v['fastest']}" for k, v in r["predictors"].items())
                  + ".", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
