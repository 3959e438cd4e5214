"""``plexgt evaluate``: the metric per split of a checkpoint (an MPI job on any layout, the
numbers ``train`` logged for its epoch) or of a predictions file (one process)."""

from __future__ import annotations

import argparse
import json

import torch

from plexgt.distributed.agree import agreed
from plexgt.distributed.bootstrap import shutdown
from plexgt.distributed.collectives import CommLedger
from plexgt.distributed.launch import launch_rank
from plexgt.errors import UsageError
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.plan.knobs import strategy_choices
from plexgt.tasks import build_task
from plexgt.tasks.metrics import METRICS
from plexgt.training.inference import (
    evaluate_file,
    infer,
    load_weights,
    split_metrics,
    start_checkpoint_job,
)

HELP = "Metrics per split of a checkpoint (MPI job) or of a predictions file."


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="checkpoint directory (its newest complete epoch) or "
                                          "one epoch_* in it")
    src.add_argument("--predictions", help="a file of plexgt predict (.parquet, .h5, .npy)")
    p.add_argument("--data", required=True, help="the prepared directory (labels and splits)")
    p.add_argument("--metric", choices=METRICS,
                   help="--predictions: the metric (default: the one its run reported)")
    p.add_argument("--grid", help="--checkpoint: auto or GxxGyxGz (this job's layout)")
    p.add_argument("--strategy", choices=strategy_choices())
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"])
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.set_defaults(accepts_overrides=True)
    p.allow_abbrev = False


def _line(what: str, metrics: dict[str, float], as_json: bool, extra: dict) -> str:
    if as_json:
        return json.dumps({**extra, **metrics})
    return f"plexgt evaluate: {what}: " + " ".join(f"{k}={v:.4f}" for k, v in metrics.items())


def run(args: argparse.Namespace, registry: StrategyRegistry | None = None) -> int:
    if args.predictions is not None:
        if args.overrides or args.grid or args.strategy or args.backend:
            raise UsageError("--grid, --strategy, --backend and --key=value are for "
                             "--checkpoint; a predictions file is read by one process")
        if launch_rank()[0] != 0:
            return 0  # one process reads the file; the job's other ranks have nothing to do
        metrics = evaluate_file(args.predictions, args.data, args.metric)
        print(_line(f"{args.predictions} against {args.data}", metrics, args.json,
                    {"predictions": args.predictions}), flush=True)
        return 0
    if args.metric is not None:
        raise UsageError("--metric is for --predictions; a checkpoint's metric is its run's")
    cp, cfg, ctx = start_checkpoint_job(args.checkpoint, args.data, args.grid, args.strategy,
                                        args.backend, list(args.overrides), registry)
    task = agreed(lambda: build_task(cfg, ctx, CommLedger(device=ctx.device), registry,
                                     inference=True), ctx.device)
    load_weights(cp, cfg, ctx, task)
    with torch.inference_mode():
        metrics = split_metrics(task, infer(task, ctx).out)
    if ctx.rank == 0:
        print(_line(f"{cp.dir} (epoch {cp.epoch}) on {cfg.data}, {ctx.world_size} ranks, grid "
                    f"{task.grid}, strategy {task.strategy}", metrics, args.json,
                    {"checkpoint": str(cp.dir), "epoch": cp.epoch}), flush=True)
    shutdown(ctx)
    return 0
