"""Resume on another layout: the loss curve a run continues after its checkpoint is resumed
by another world size, grid or strategy, against the uninterrupted single-rank curve.

An SBM graph is prepared; for each case a run trains ``--epochs`` epochs on 1 rank (the
reference), and another trains half of them on the first layout, checkpoints, and is resumed
on the second layout to the end. float64, dropout on (grid-invariant masks). Reported: both
curves, the largest relative difference, and the checkpoint's size and write time.

Writes perf/results/bench_resume.json and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from perf.harness import (
    BIN,
    JobFailed,
    hardware,
    launch,
    mpiexec,
    plexgt,
    prep_sbm,
    result_line,
    today,
    write_json,
)

CASES = {
    "gcn 8 ranks 2x2x2 -> 4 ranks 4x1x1": ("gcn", 8, ["--grid", "2x2x2"], 4, ["--grid", "4x1x1"]),
    "gt 4 ranks gp_a2a -> 2 ranks gp_ag": ("gt", 4, ["--strategy", "gp_a2a"], 2,
                                           ["--strategy", "gp_ag"]),
    "gps 2 ranks gp_ag -> 3 ranks gp_a2a": ("gps", 2, ["--strategy", "gp_ag"], 3,
                                            ["--strategy", "gp_a2a"]),
}


def train(data: Path, n: int, args: list[str]) -> str:
    try:
        r = launch(mpiexec(n, plexgt("train", "--data", str(data), *args)),
                   env={"OMP_NUM_THREADS": "1", "PATH": f"{BIN}:/usr/bin:/bin"})
    except JobFailed as e:
        raise SystemExit(f"bench_resume: {e}") from e
    return r.stderr


def losses(path: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4000)
    ap.add_argument("--edges", type=int, default=60000)
    ap.add_argument("--epochs", type=int, default=20)
    args = ap.parse_args()
    half = args.epochs // 2
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data = prep_sbm(tmp / "sbm", args.nodes, args.edges, 6, 32)
        for name, (model, n1, lay1, n2, lay2) in CASES.items():
            common = ["--model", model, "--model.heads=2", "--epochs", str(args.epochs),
                      "--dtype=float64"]
            ref, m, ck = tmp / f"{model}-ref.jsonl", tmp / f"{model}.jsonl", tmp / f"{model}-ck"
            train(data, 1, [*common, "--metrics", str(ref)])
            train(data, n1, [*common, *lay1, "--metrics", str(m), "--checkpoint-dir", str(ck),
                             "--stop-after", str(half)])
            log = train(data, n2, [*common, *lay2, "--metrics", str(m), "--checkpoint-dir",
                                   str(ck), "--resume"])
            a, b = losses(ref), losses(m)
            size = sum(f.stat().st_size for f in (ck / f"epoch_{half:06d}").iterdir())
            out[name] = {
                "reference_1_rank": a, "resumed": b, "resumed_after_epoch": half,
                "max_rel_diff": max(abs(x - y) / abs(x) for x, y in zip(a, b)),
                "checkpoint_bytes": size,
                "resume_line": next(ln for ln in log.splitlines() if "resumed from" in ln),
            }
    worst = max(v["max_rel_diff"] for v in out.values())
    write_json("bench_resume.json", {"bench": "resume", "date": today(),
                                     "hardware": hardware(), "args": vars(args),
                                     "cases": out})
    result_line(bench="resume", cases=len(out), epochs=args.epochs, resumed_after=half,
                max_rel_diff=f"{worst:.2e}")


if __name__ == "__main__":
    main()
