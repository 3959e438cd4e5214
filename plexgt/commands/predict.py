"""``plexgt predict``: every node's prediction from a checkpoint, on any layout (MPI job:
``mpiexec -n P plexgt predict --checkpoint DIR --data PREPARED --out FILE``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from plexgt.data.loader import PreparedGraph
from plexgt.data.predictions import FORMATS, PredictionsWriter, node_id_base, output_format
from plexgt.distributed.agree import agreed
from plexgt.distributed.bootstrap import shutdown
from plexgt.distributed.collectives import CommLedger
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.plan.knobs import strategy_choices
from plexgt.tasks import build_task
from plexgt.training.inference import (
    infer,
    load_weights,
    node_block,
    predictions_schema,
    resolve_embeddings,
    start_checkpoint_job,
    write_block,
)

HELP = "Predict every node from a checkpoint: classes, logits, embeddings (MPI job)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint directory (its newest complete epoch) or one epoch_* in it")
    p.add_argument("--data", required=True, help="the prepared directory it was trained on")
    p.add_argument("--out", required=True, type=Path,
                   help=f"output file; its suffix picks the format ({', '.join(FORMATS)})")
    p.add_argument("--embeddings", metavar="LAYER",
                   help="also write this layer's output per node ('hidden': the last layer's "
                        "input; a wrong name lists the model's layers)")
    p.add_argument("--grid", help="auto or GxxGyxGz (this job's layout, not training's)")
    p.add_argument("--strategy", choices=strategy_choices())
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"])
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.set_defaults(accepts_overrides=True)
    p.allow_abbrev = False
    p.epilog = ("The model, its dtype and seed come from the checkpoint; --parallel.KEY=VALUE "
                "sets this job's layout keys (docs/inference.md).")


def run(args: argparse.Namespace, registry: StrategyRegistry | None = None) -> int:
    t0 = time.perf_counter()
    output_format(args.out)  # an unknown suffix is refused before anything starts
    cp, cfg, ctx = start_checkpoint_job(args.checkpoint, args.data, args.grid, args.strategy,
                                        args.backend, list(args.overrides), registry)
    rank0 = ctx.rank == 0
    writer = PredictionsWriter(args.out, ctx.rank, ctx.world_size, args.overwrite)
    agreed(lambda: writer.check() if rank0 else None, ctx.device)
    task = agreed(lambda: build_task(cfg, ctx, CommLedger(device=ctx.device), registry,
                                     inference=True), ctx.device)
    pg = PreparedGraph(cfg.data, split=cfg.split_index)  # the split column: the run's split
    layer = agreed(lambda: resolve_embeddings(task, args.embeddings), ctx.device)
    writer.schema = predictions_schema(task, pg, cfg, cp, layer, args.embeddings)
    load_weights(cp, cfg, ctx, task)
    with torch.inference_mode():
        inf = infer(task, ctx, layer)
        block = node_block(task, pg, inf, layer, node_id_base(pg))
    forward_s = inf.seconds
    del inf
    write_block(writer, block, ctx)
    if rank0:
        emb = f", embeddings of {layer}" if layer else ""
        print(f"plexgt predict: {pg.N} nodes of {cfg.data} by {cp.dir} (epoch {cp.epoch}, "
              f"{cfg.model.name}{emb}) -> {args.out}; {ctx.world_size} ranks, grid "
              f"{task.grid}, strategy {task.strategy}; forward {forward_s:.3g} s, total "
              f"{time.perf_counter() - t0:.3g} s", file=sys.stderr, flush=True)
    shutdown(ctx)
    return 0
