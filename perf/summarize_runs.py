"""Best-validation summaries of finished ``plexgt train --metrics`` runs, into one result file.

    .venv/bin/python -m perf.summarize_runs --name general_same_splits \\
        --what "general-gt/gps recipes on tunedGNN's split files, seed 0" \\
        gt-computers=RUN/gt-computers.jsonl gps-computers=RUN/gps-computers.jsonl ...

For runs too long to start from a benchmark (tens of minutes each on these cores), made by
hand with the configs the result file names: each LABEL=FILE's best validation row, as the
loop picks it (the first epoch of the highest ``valid_acc``), its test accuracy and epoch,
and how many epochs ran. Writes perf/results/<name>.json and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from perf.harness import hardware, result_line, today, write_json


def best_row(path: Path) -> dict[str, Any]:
    """The run's best validation evaluation (ties: the earliest) and its length."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "valid_acc" in r]
    if not evals:
        raise SystemExit(f"{path}: no evaluated epoch")
    best = max(evals, key=lambda r: r["valid_acc"])  # max keeps the first of equals
    return {"test_acc": best["test_acc"], "valid_acc": best["valid_acc"],
            "best_epoch": best["epoch"], "epochs_run": rows[-1]["epoch"], "file": str(path)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", required=True, help="result file stem under perf/results/")
    ap.add_argument("--what", required=True, help="how the runs were made (configs, data)")
    ap.add_argument("runs", nargs="+", help="LABEL=metrics.jsonl")
    args = ap.parse_args()
    runs = {}
    for item in args.runs:
        label, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"{item!r}: expected LABEL=metrics.jsonl")
        runs[label] = best_row(Path(path))
    write_json(f"{args.name}.json", {"benchmark": args.name, "date": today(),
                                     "hardware": hardware(), "what": args.what, "runs": runs})
    result_line(bench=args.name, **{k: round(100 * v["test_acc"], 2) for k, v in runs.items()})


if __name__ == "__main__":
    main()
