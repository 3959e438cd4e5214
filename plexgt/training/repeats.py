"""``plexgt train --seeds``: one recipe over several seeds, reported as mean ± std.

Published node-classification numbers are a mean ± std over runs (tunedGNN: 3 runs on one
split, each from its own initialisation, ``torch.std``, i.e. ddof 1); one run's test accuracy
differs from the next by about that std, so a reproduction compares like with like only over
the same number of runs. Each seed is a complete run of its own (its own model, dropout and
optimizer state, its own metrics file, TensorBoard directory and checkpoint directory, so
``plexgt report`` and ``--resume`` read one run each); the summary is the best-validation
epoch's test value of the selection metric per seed, and its mean and std.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from plexgt.config import TrainConfig


def seed_path(path: str, seed: int, directory: bool = False) -> str:
    """``path`` for the run of ``seed``: a file gains ``.seed<k>`` before its suffix
    (``m.jsonl`` -> ``m.seed3.jsonl``), a directory a ``seed<k>`` subdirectory; '' stays ''."""
    if not path:
        return path
    p = Path(path)
    if directory:
        return str(p / f"seed{seed}")
    return str(p.with_name(f"{p.stem}.seed{seed}{p.suffix}"))


def seed_config(cfg: TrainConfig, seed: int) -> TrainConfig:
    """``cfg`` for the run of ``seed``: that seed, and its own output paths."""
    return dataclasses.replace(
        cfg, seed=seed, metrics=seed_path(cfg.metrics, seed),
        tensorboard=seed_path(cfg.tensorboard, seed, directory=True),
        checkpoint_dir=seed_path(cfg.checkpoint_dir, seed, directory=True))


def run_record(seed: int, summary: dict[str, Any], cfg: TrainConfig) -> dict[str, Any]:
    """One seed's line of the summary JSON (from :func:`plexgt.training.loop.train`'s
    summary)."""
    return {"seed": seed, "best_epoch": summary["best_epoch"],
            "valid": summary["best_valid"], "test": summary["test_at_best"],
            "last_epoch": summary["last_epoch"], "stopped": summary["stopped"],
            "metrics": cfg.metrics}


def mean_std(values: list[float]) -> tuple[float, float]:
    """(mean, sample std with ddof 1: torch.std's, which the published tables use); the std
    of one value is 0."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def summarize(metric: str, runs: list[dict[str, Any]], cfg: TrainConfig) -> dict[str, Any]:
    """The summary JSON: each run, the mean ± std of the test and validation value at each
    run's best validation epoch, and the configuration (its ``seed`` the first run's)."""
    test_mean, test_std = mean_std([r["test"] for r in runs])
    valid_mean, valid_std = mean_std([r["valid"] for r in runs])
    return {"metric": metric, "seeds": [r["seed"] for r in runs], "runs": runs,
            "test_mean": test_mean, "test_std": test_std, "valid_mean": valid_mean,
            "valid_std": valid_std, "std_ddof": 1, "config": cfg.to_dict(),
            "selection": "each run's epoch of best validation value; its test value"}


def summary_line(s: dict[str, Any]) -> str:
    """The last line of a several-seed run (stdout)."""
    m, seeds = s["metric"], ", ".join(str(k) for k in s["seeds"])
    return (f"plexgt train: {len(s['seeds'])} seeds ({seeds}): test_{m} at the best "
            f"validation epoch {s['test_mean']:.4f} ± {s['test_std']:.4f} (mean ± std, ddof "
            f"1); valid_{m} {s['valid_mean']:.4f} ± {s['valid_std']:.4f}")


def write_summary(path: str | Path, s: dict[str, Any]) -> None:
    """Write the summary JSON (whole, then renamed: never half-written)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(s, indent=1) + "\n")
    tmp.replace(p)
