"""``plexgt train``: the main job (``srun plexgt train ...``, ``mpiexec -n P plexgt train ...``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from plexgt.config import TrainConfig, notes, to_toml
from plexgt.config.keys import describe_keys
from plexgt.data.loader import PreparedGraph
from plexgt.distributed.agree import agreed
from plexgt.distributed.bootstrap import DistContext, init_distributed, shutdown
from plexgt.distributed.collectives import CommLedger
from plexgt.errors import UsageError
from plexgt.models.registry import default_registry
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.plan.knobs import load_config, strategy_choices
from plexgt.tasks import build_task
from plexgt.training.loop import train
from plexgt.training.numerics import apply_numerics
from plexgt.training.repeats import (
    Repeat,
    repeat_config,
    repeats,
    run_record,
    summarize,
    summary_line,
    write_summary,
)

HELP = "Train a GNN or graph transformer full-graph on a prepared directory (MPI job)."
STARTS_MPI = True
"""It runs in MPI's world: the CLI starts MPI (mpi4py) before importing this module, whose
imports load torch (Cray MPICH fails to start after torch: plexgt.cli.main)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", help="prepared directory (plexgt prep)")
    models = default_registry()
    p.add_argument("--model", choices=models.names(), metavar="MODEL",
                   help="; ".join(f"{m.name}: {m.help}" for m in models))
    p.add_argument("--config", help="TOML file of the run (its keys: below)")
    p.add_argument("--grid", help="auto or GxxGyxGz")
    p.add_argument("--strategy", choices=strategy_choices())
    p.add_argument("--epochs", type=int)
    p.add_argument("--metrics", help="JSONL file of per-epoch metrics")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="TensorBoard event files of the same scalars (the tensorboard extra)")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int)
    p.add_argument("--resume", action="store_true", default=None)
    p.add_argument("--stop-after", type=int, help="stop with a checkpoint after this epoch")
    p.add_argument("--deterministic", action="store_true", default=None)
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"])
    p.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                   help="train the run once per seed (each its own run: metrics file "
                   "m.jsonl -> m.seed<k>.jsonl, checkpoint and TensorBoard directories get a "
                   "seed<k> subdirectory) and report the test value of the selection metric "
                   "at each run's best validation epoch as mean ± std (ddof 1)")
    p.add_argument("--split-index", metavar="K|all",
                   help="which stored split of --data trains (config key split_index; "
                   "default: the one prep kept, split 0 of a prep --split-index all "
                   "directory); 'all': one run per stored split, its outputs tagged "
                   "split<k> like --seeds' seed<k> (with --seeds: every seed on every split, "
                   "m.split<k>.seed<j>.jsonl), reported as mean ± std like --seeds")
    p.add_argument("--summary", metavar="JSON",
                   help="--seeds / --split-index all: write the runs and their mean ± std "
                   "here (default: beside --metrics as <stem>.summary.json; none without "
                   "--metrics)")
    p.set_defaults(accepts_overrides=True)
    # no abbreviated flags: an override such as --metric=accuracy would otherwise be taken
    # for --metrics (the metrics file 'accuracy'), and the metric key silently left as it was
    p.allow_abbrev = False
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = config_epilog()


def config_epilog(width: int = 100) -> str:
    """``train --help``'s list of every config key: its default (as TOML writes it) and its
    docstring's first sentence on one line, generated from the dataclasses in
    plexgt/config/__init__.py, which hold the whole docstrings."""
    lines = ["config keys, each with its default and its docstring's first sentence (whole",
             "in plexgt/config/__init__.py); set any as --key=value, dotted for tables",
             "(--model.hidden=256 --optim.lr=0.005), or in the --config TOML file:"]
    for k in describe_keys():
        lines.append(f"  {k.key} = {json.dumps(k.default)}")
        if k.doc:
            lines.append(f"      {k.summary(width - 6)}")
    return "\n".join(lines)


def run(args: argparse.Namespace, registry: StrategyRegistry | None = None) -> int:
    """Train on ``registry``'s attention strategies (default: the built-in ones)."""
    flags = {
        "data": args.data, "model.name": args.model, "parallel.grid": args.grid,
        "parallel.strategy": args.strategy, "epochs": args.epochs, "metrics": args.metrics,
        "tensorboard": args.tensorboard,
        "checkpoint_dir": args.checkpoint_dir, "checkpoint_every": args.checkpoint_every,
        "resume": args.resume, "deterministic": args.deterministic,
        "parallel.backend": args.backend, "stop_after": args.stop_after,
        "split_index": getattr(args, "split_index", None),
    }
    # every rank reads the configuration; one copy of an error (rank 0's), whoever failed
    cfg = agreed(lambda: load_config(args.config, flags, args.overrides, registry))
    if not cfg.data:
        raise UsageError("--data (or data in the config file) is required")
    seeds = getattr(args, "seeds", None)
    summary_path = getattr(args, "summary", None)
    if seeds is not None and len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds {' '.join(map(str, seeds))}: a seed is named twice")
    splits = None
    if cfg.split_index == "all":  # the directory's stored splits, read once (rank 0's error)
        splits = agreed(lambda: stored_splits(cfg.data))
    several = seeds is not None or splits is not None
    if several:
        if cfg.resume or cfg.stop_after:
            what, one = (("--seeds", "seed") if splits is None else
                         ("--split-index all", "split"))
            raise UsageError(f"{what} runs every {one} from epoch 0 to the end: not with "
                             f"--resume or --stop-after (resume one {one}'s run without "
                             f"{what}, with --{one.replace('split', 'split-index')}=<k> and "
                             f"its {one}<k> checkpoint directory)")
        if summary_path is None and cfg.metrics:
            m = Path(cfg.metrics)
            summary_path = str(m.with_name(f"{m.stem}.summary.json"))
    elif summary_path is not None:
        raise UsageError("--summary goes with --seeds or --split-index all")
    apply_numerics(cfg)
    ctx = init_distributed(cfg.parallel.backend, cfg.parallel.timeout_s)
    plan = repeats(splits, seeds) if several else [Repeat()]
    runs = []
    for k, rep in enumerate(plan):
        run_cfg = repeat_config(cfg, rep)
        if several and ctx.rank == 0:
            print(f"plexgt train: {rep.label()} ({k + 1} of {len(plan)})", file=sys.stderr,
                  flush=True)
        summary = _one_run(run_cfg, ctx, registry, header=k == 0)
        runs.append(run_record(run_cfg.seed, summary, run_cfg, rep.split))
        if ctx.rank == 0:
            line = final_line(summary)
            if several:  # each run's own line, then the summary's
                line = line.replace("plexgt train: ", f"plexgt train: {rep.label()}: ", 1)
            print(line, flush=True)
    if several and ctx.rank == 0:
        s = summarize(summary["metric"], runs, repeat_config(cfg, plan[0]))
        if summary_path:
            write_summary(summary_path, s)
        print(summary_line(s), flush=True)
    shutdown(ctx)
    return 0


def stored_splits(data: str) -> list[int]:
    """The split indices the prepared directory ``data`` holds (``split_index = 'all'``)."""
    with PreparedGraph(data) as pg:
        return pg.split_indices


def _one_run(cfg: TrainConfig, ctx: DistContext, registry: StrategyRegistry | None,
             header: bool) -> dict[str, Any]:
    """Build the task of ``cfg`` (its seed: the model's initialisation) and train it; rank 0
    logs the layout and the resolved configuration (``header``: the first run of several)."""
    torch.manual_seed(cfg.seed)
    ledger = CommLedger(device=ctx.device)
    task = agreed(lambda: build_task(cfg, ctx, ledger, registry), ctx.device)
    if ctx.rank == 0 and header:
        rp = task.plan
        planned = (f"; plan {rp.label}: predicted {rp.time_s:.4g} s a step, "
                   f"{rp.memory_bytes / 2**30:.3g} GiB a rank, priced with {rp.coefficients}"
                   if rp is not None else "")
        print(f"plexgt train: {ctx.world_size} ranks ({ctx.backend}), grid {task.grid}, "
              f"strategy {task.strategy}{planned}\n# resolved config\n{to_toml(cfg)}",
              file=sys.stderr, flush=True)
        for line in notes(cfg):
            print(f"plexgt train: note: {line}", file=sys.stderr, flush=True)
    return train(cfg, ctx, task, log=lambda m: print(m, file=sys.stderr, flush=True))


def final_line(summary: dict[str, Any]) -> str:
    """The run's last line (stdout): how it ended, its best validation epoch, and the
    checkpoint its end wrote, only when it wrote one."""
    status = f"stopped by {summary['stopped']}" if summary["stopped"] else "finished"
    last = summary["last_epoch"]
    if summary.get("last_step"):  # a batch-trained run stopped between two steps
        status += f" after step {summary['last_step']} of epoch {last + 1}"
    elif last == summary["start_epoch"]:
        status += f" after epoch {last} (nothing left to train: resumed at the last epoch)"
    else:
        status += f" after epoch {last}"
    m = summary["metric"]
    best = (f"best validation epoch {summary['best_epoch']}: valid_{m}="
            f"{summary['best_valid']:.4f} test_{m}={summary['test_at_best']:.4f}"
            if summary["best_epoch"] > 0 else "no best validation epoch yet")
    wrote = f"; checkpoint {summary['checkpoint']} written" if summary["checkpoint"] else ""
    return f"plexgt train: {status}; {best}{wrote}"
