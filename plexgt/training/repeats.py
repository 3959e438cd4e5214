"""``plexgt train --seeds`` / ``--split-index all``: one recipe over several seeds or stored
splits (or both), reported as mean ± std.

Published node-classification numbers are a mean ± std over runs: tunedGNN's 3 runs on one
split, each from its own initialisation; the heterophilous benchmarks' (Platonov et al.) one
run on each of their 10 stored splits; both ``torch.std``, i.e. ddof 1. One run's test value
differs from the next by about that std, so a reproduction compares like with like only over
the same runs. Each run is complete on its own (its own model, dropout and optimizer state,
its own metrics file, TensorBoard directory and checkpoint directory, so ``plexgt report`` and
``--resume`` read one run each); the summary is the best-validation epoch's test value of the
selection metric per run, and their mean and std. Seeds and splits together run their product
(every seed on every split, splits outermost), the mean ± std over all those runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from plexgt.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class Repeat:
    """One run of several: its stored split and its seed (None: the configuration's, not
    varied, so its paths carry no tag of it)."""

    split: int | None = None
    seed: int | None = None

    def tags(self) -> list[str]:
        """What the run's paths gain: ``split<k>``, then ``seed<k>``, of those varied."""
        return ([f"split{self.split}"] if self.split is not None else []) + (
            [f"seed{self.seed}"] if self.seed is not None else [])

    def label(self) -> str:
        """'split 3, seed 1' (its stderr / stdout lines)."""
        return ", ".join(t[:5] + " " + t[5:] if t.startswith("split") else
                         t[:4] + " " + t[4:] for t in self.tags())


def repeats(splits: list[int] | None, seeds: list[int] | None) -> list[Repeat]:
    """The runs of ``splits`` x ``seeds`` (either None: not varied), splits outermost."""
    return [Repeat(sp, sd) for sp in (splits if splits is not None else [None])
            for sd in (seeds if seeds is not None else [None])]


def run_path(path: str, tags: list[str], directory: bool = False) -> str:
    """``path`` for a run tagged ``tags``: a file gains ``.<tag>`` each before its suffix
    (``m.jsonl`` -> ``m.split3.seed1.jsonl``), a directory a subdirectory each
    (``ck/split3/seed1``); '' stays ''."""
    if not path or not tags:
        return path
    p = Path(path)
    if directory:
        return str(p.joinpath(*tags))
    return str(p.with_name(f"{p.stem}.{'.'.join(tags)}{p.suffix}"))


def seed_path(path: str, seed: int, directory: bool = False) -> str:
    """``path`` for the run of ``seed`` (:func:`run_path` with ``seed<k>``)."""
    return run_path(path, [f"seed{seed}"], directory)


def repeat_config(cfg: TrainConfig, rep: Repeat) -> TrainConfig:
    """``cfg`` for the run ``rep``: its split and seed, and its own output paths."""
    tags = rep.tags()
    return dataclasses.replace(
        cfg, seed=cfg.seed if rep.seed is None else rep.seed,
        split_index=cfg.split_index if rep.split is None else rep.split,
        metrics=run_path(cfg.metrics, tags),
        tensorboard=run_path(cfg.tensorboard, tags, directory=True),
        checkpoint_dir=run_path(cfg.checkpoint_dir, tags, directory=True))


def seed_config(cfg: TrainConfig, seed: int) -> TrainConfig:
    """``cfg`` for the run of ``seed``: that seed, and its own output paths."""
    return repeat_config(cfg, Repeat(seed=seed))


def run_record(seed: int, summary: dict[str, Any], cfg: TrainConfig,
               split: int | None = None) -> dict[str, Any]:
    """One run's line of the summary JSON (from :func:`plexgt.training.loop.train`'s
    summary); ``split``: the stored split it trained on, where splits vary."""
    return {**({"split": split} if split is not None else {}), "seed": seed,
            "best_epoch": summary["best_epoch"],
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
    run's best validation epoch over every run, and the configuration (its ``seed`` and
    ``split_index`` the first run's). ``seeds`` and, where splits vary, ``splits``: each run's,
    in run order."""
    test_mean, test_std = mean_std([r["test"] for r in runs])
    valid_mean, valid_std = mean_std([r["valid"] for r in runs])
    splits = {"splits": [r["split"] for r in runs]} if runs and "split" in runs[0] else {}
    return {"metric": metric, "seeds": [r["seed"] for r in runs], **splits, "runs": runs,
            "test_mean": test_mean, "test_std": test_std, "valid_mean": valid_mean,
            "valid_std": valid_std, "std_ddof": 1, "config": cfg.to_dict(),
            "selection": "each run's epoch of best validation value; its test value"}


def _listed(values: list[int]) -> str:
    return ", ".join(str(k) for k in dict.fromkeys(values))


def summary_line(s: dict[str, Any]) -> str:
    """The last line of a several-run train (stdout): '2 seeds (3, 5)', '10 splits (0, ...,
    9)' or '6 runs (splits 0, 1, 2 x seeds 0, 1)', then the mean ± std."""
    m, n = s["metric"], len(s["runs"])
    seeds, splits = _listed(s["seeds"]), _listed(s.get("splits", []))
    if not splits:
        what = f"{n} seeds ({seeds})"
    elif len(set(s["seeds"])) == 1 and n == len(set(s["splits"])):
        what = f"{n} splits ({splits})"
    else:
        what = f"{n} runs (splits {splits} x seeds {seeds})"
    return (f"plexgt train: {what}: test_{m} at the best "
            f"validation epoch {s['test_mean']:.4f} ± {s['test_std']:.4f} (mean ± std, ddof "
            f"1); valid_{m} {s['valid_mean']:.4f} ± {s['valid_std']:.4f}")


def write_summary(path: str | Path, s: dict[str, Any]) -> None:
    """Write the summary JSON (whole, then renamed: never half-written)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(s, indent=1) + "\n")
    tmp.replace(p)
