"""Rerun the published recipes of configs/ with ``plexgt prep`` and ``plexgt train --seeds``,
and write mean ± std beside the published numbers (``perf.train_reference --recipes``).

    OMP_NUM_THREADS=2 .venv/bin/python -m perf.train_reference --recipes            # all four
    .venv/bin/python -m perf.train_reference --recipes photo --seeds 0 --epochs 30 \\
        --out reference_accuracy_smoke                                             # a smoke run

Each recipe (configs/tunedgnn-gcn-<name>.toml) names its gnn-benchmark file, split file and
prep options in its ``[recipe]`` table; the graph is prepared into a temporary directory
(from ../shared/datasets/gnn-benchmark, never copied into the repository) exactly as the
recipe's prep command says, then trained single-process over the recipe's seeds (its published
number of runs) with the recipe's every hyperparameter. The test accuracy at each run's best
validation epoch is summarised as mean ± std (ddof 1, as tunedGNN's ``torch.std``) beside the
published mean ± std, with the difference and whether it is within 0.5 points (issue 36's
bar). ``--epochs`` caps every recipe's epochs (a smoke run, marked as such: not comparable).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from perf import harness
from perf.harness import (
    DATASETS_DIR,
    ROOT,
    hardware,
    launch,
    plexgt,
    result_line,
    today,
    write_json,
    write_text,
)
from plexgt.config import read_recipe
from plexgt.plan.knobs import load_config
from plexgt.training.repeats import mean_std

CONFIGS = ROOT / "configs"
RECIPES = ("computers", "photo", "cs", "physics")
"""configs/tunedgnn-gcn-<name>.toml, in the order of tunedGNN's table."""
SPLITS_ROOT = ROOT
"""Where a recipe's ``split_file`` path starts (data_prep/tunedgnn-splits.sh fetches the files
into this checkout's configs/splits/)."""
WITHIN = 0.5
"""Points of accuracy the issue asks the mean to be within of the published mean."""


def recipe_path(name: str) -> Path:
    return CONFIGS / f"tunedgnn-gcn-{name}.toml"


def prep_args(recipe: dict[str, Any], out: Path, datasets: Path) -> list[str]:
    """``plexgt prep``'s arguments of a recipe: what its ``prep`` line says, the input from
    ``datasets``/gnn-benchmark and the split file from the repository."""
    args = ["prep", "--input", str(datasets / "gnn-benchmark" / recipe["gnn_benchmark_file"]),
            "--split-file", str(SPLITS_ROOT / recipe["split_file"]), "--out", str(out), "--quiet",
            "--normalize-features", recipe.get("normalize_features", "none")]
    if recipe.get("symmetrize"):
        args.append("--symmetrize")
    if "sparse_features" in recipe:
        args += ["--sparse-features", recipe["sparse_features"]]
    return args


def run_recipe(name: str, seeds: list[int] | None, epochs: int | None, work: Path,
               datasets: Path) -> dict[str, Any]:
    """Prep and train one recipe; its record for the results (per run and summarised)."""
    path = recipe_path(name)
    recipe = read_recipe(path)
    cfg = load_config(path)
    seeds = list(recipe["seeds"]) if seeds is None else seeds
    data = work / name
    t0 = time.perf_counter()
    launch(plexgt(*prep_args(recipe, data, datasets)))
    t1 = time.perf_counter()
    metrics, summary = work / f"{name}.jsonl", work / f"{name}.summary.json"
    train = ["train", "--config", str(path), "--data", str(data), "--metrics", str(metrics),
             "--summary", str(summary), "--seeds", *map(str, seeds), "--progress=false"]
    if epochs:
        train += ["--epochs", str(epochs)]
    r = launch(plexgt(*train))
    t2 = time.perf_counter()
    s = json.loads(summary.read_text())
    manifest = json.loads((data / "manifest.json").read_text())
    mean, std = 100 * s["test_mean"], 100 * s["test_std"]
    pub_mean, pub_std = recipe["published_mean"], recipe["published_std"]
    steps = [row["time_epoch"] for run in s["runs"]
             for row in map(json.loads, Path(run["metrics"]).read_text().splitlines())]
    trained = sum(run["last_epoch"] for run in s["runs"])
    return {
        "recipe": str(path.relative_to(ROOT)), "dataset": recipe["dataset"],
        "model": cfg.model.name, "seeds": seeds, "runs_published": recipe["runs"],
        "epochs": epochs or cfg.epochs, "epochs_recipe": cfg.epochs,
        "smoke": bool(epochs and epochs < cfg.epochs),
        "test_acc_mean": mean, "test_acc_std": std, "valid_acc_mean": 100 * s["valid_mean"],
        "published_mean": pub_mean, "published_std": pub_std,
        "difference": mean - pub_mean, "within": abs(mean - pub_mean) <= WITHIN,
        "per_run": s["runs"], "split": manifest["split"],
        "feature_normalization": manifest.get("feature_normalization"),
        "nodes": manifest["N"], "stored_edges": manifest["E"],
        "prep_seconds": t1 - t0, "train_seconds": t2 - t1,
        "mean_step_seconds": sum(steps) / max(1, len(steps)),
        "wall_seconds_per_epoch": (t2 - t1) / max(1, trained),
        "final_line": r.stdout.strip().splitlines()[-1],
        "source": {k: v for k, v in recipe.items() if k.startswith("source_")},
    }


def with_stored_runs(rec: dict[str, Any], stored: dict[str, Any] | None) -> dict[str, Any]:
    """``rec`` with the runs of other seeds that ``stored`` (the results file's earlier
    payload) holds for the same recipe at the same epochs, summarised again over all of them:
    a recipe's seeds are independent runs (each its own initialisation, the same prepared
    split), so three seeds measured on three occasions are the same three runs as one
    invocation's. Smoke runs are never combined. Each run keeps the date it was measured."""
    date = rec.setdefault("measured", today())
    for run in rec["per_run"]:
        run.setdefault("measured", date)
    if stored is None or rec["smoke"]:
        return rec
    old = next((r for r in stored.get("recipes", []) if r["recipe"] == rec["recipe"]
                and r["epochs"] == rec["epochs"] and not r["smoke"]), None)
    if old is None:
        return rec
    have = {run["seed"] for run in rec["per_run"]}
    extra = [{**run, "measured": run.get("measured", stored.get("date", ""))}
             for run in old["per_run"] if run["seed"] not in have]
    runs = sorted(extra + rec["per_run"], key=lambda run: run["seed"])
    mean, std = mean_std([100 * run["test"] for run in runs])
    return {**rec, "seeds": [run["seed"] for run in runs], "per_run": runs,
            "test_acc_mean": mean, "test_acc_std": std,
            "valid_acc_mean": sum(100 * run["valid"] for run in runs) / len(runs),
            "difference": mean - rec["published_mean"],
            "within": abs(mean - rec["published_mean"]) <= WITHIN,
            "train_seconds": rec["train_seconds"] + old["train_seconds"] * len(extra)
            / max(1, len(old["per_run"]))}


def estimate_line(rec: dict[str, Any]) -> str:
    """The full run's wall time on this machine, estimated from this run's: the train
    command's wall time per epoch trained (training step, evaluation, start-up spread over
    the epochs: an over-estimate for short runs)."""
    full = rec["wall_seconds_per_epoch"] * rec["epochs_recipe"] * rec["runs_published"]
    return (f"{rec['dataset']}: {rec['wall_seconds_per_epoch']:.3f} s wall an epoch (step "
            f"{rec['mean_step_seconds']:.3f} s, evaluation, start-up) -> "
            f"{rec['epochs_recipe']} epochs x {rec['runs_published']} runs ~ {full / 60:.0f} "
            "min")


def main(names: list[str], seeds: list[int] | None, epochs: int | None, out: str,
         datasets: Path = DATASETS_DIR, keep: bool = False) -> int:
    """Run the recipes ``names`` (empty: all) and write ``out``.json/.md in perf/results;
    ``keep``: add the runs of other seeds stored in ``out``.json (:func:`with_stored_runs`)."""
    names = names or list(RECIPES)
    stored_path = harness.RESULTS_DIR / f"{out}.json"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="plexgt-recipes-") as tmp:
        runs = [run_recipe(n, seeds, epochs, Path(tmp), datasets) for n in names]
    # read when the runs end, not when they start: a seed run beside this one (another
    # invocation, the cores shared) that finished meanwhile is kept, not overwritten
    stored = json.loads(stored_path.read_text()) if keep and stored_path.is_file() else None
    recs = [with_stored_runs(rec, stored) for rec in runs]
    total = time.perf_counter() - t0
    payload = {"what": "configs/ recipes: plexgt prep + plexgt train --seeds, single process, "
               "test accuracy at each run's best validation epoch, mean ± std (ddof 1)",
               "date": today(), "hardware": hardware(), "total_seconds": total,
               "within_points": WITHIN, "recipes": recs}
    write_json(f"{out}.json", payload)
    hw = payload["hardware"]
    md = [f"# Reference accuracy: the published recipes ({payload['date']})", "",
          f"Hardware: {hw['cpu']}, {hw['usable_cores']} cores, torch {hw['torch']}; "
          f"{total / 60:.1f} min wall in all. Each recipe (configs/) prepared from the "
          "gnn-benchmark npz with its split file and row-normalised features, trained "
          "single-process over its seeds; test accuracy (%) at each run's best validation "
          "epoch, mean ± std (ddof 1) beside the published mean ± std.", "",
          "| dataset | recipe | plexgt | published | difference | within 0.5 | seeds | "
          "epochs | train (s) | runs measured |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        ep = f"{r['epochs']}" + (f" of {r['epochs_recipe']} (smoke: not comparable)"
                                 if r["smoke"] else "")
        md.append(f"| {r['dataset']} | `{r['recipe']}` | {r['test_acc_mean']:.2f} ± "
                  f"{r['test_acc_std']:.2f} | {r['published_mean']:.2f} ± "
                  f"{r['published_std']:.2f} | {r['difference']:+.2f} | "
                  f"{'yes' if r['within'] else 'no'} | {len(r['seeds'])} of "
                  f"{r['runs_published']} | {ep} | {r['train_seconds']:.0f} | "
                  + ", ".join(f"seed {run['seed']} {run['measured']}" for run in r["per_run"])
                  + " |")
    md += ["", "Estimated wall time of the full recipes here, from this run's epochs:", ""]
    md += [f"- {estimate_line(r)}" for r in recs]
    write_text(f"{out}.md", "\n".join(md) + "\n")
    for r in recs:
        print(estimate_line(r), flush=True)
        result_line(recipe=r["recipe"], test_acc_mean=r["test_acc_mean"],
                    test_acc_std=r["test_acc_std"], published=r["published_mean"],
                    epochs=r["epochs"], seeds=len(r["seeds"]))
    return 0
