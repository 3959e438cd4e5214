"""The training loop of ``plexgt train``: full-graph epochs, metrics, checkpoints, signals.

Each epoch is one exact full-graph step (forward over every node, loss over the training
nodes, backward, AdamW). Its wall time is split per rank into communication (time inside
collectives, from the ledger), waiting (a barrier at the end of the step: load imbalance) and
compute (the rest); rank 0 writes their max and mean over ranks to the metrics JSONL.

SIGTERM and SIGUSR1 (Slurm's pre-timeout signal) only set a flag; at the end of the epoch the
ranks agree on it, write a checkpoint, leave ``STOPPED`` in the checkpoint directory (the job
script requeues on it) and exit cleanly.
"""

from __future__ import annotations

import json
import math
import resource
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from plexgt import checkpoint as ckpt
from plexgt.config import TrainConfig, to_toml
from plexgt.data.runtime import Progress
from plexgt.dist.bootstrap import DistContext
from plexgt.dist.collectives import CommLedger


@dataclass
class Task:
    """A distributed model bound to this rank's data, as the loop sees it."""

    model: nn.Module
    inputs: torch.Tensor
    """This rank's input shard."""
    loss: Any
    """loss(out) -> replicated scalar (mean cross-entropy over training nodes)."""
    correct: Any
    """correct(out) -> {split: (correct, total)} summed over all ranks."""
    ledger: CommLedger
    grid: str
    strategy: str
    bytes_read: int = 0


def lr_at(cfg: TrainConfig, epoch: int) -> float:
    """Linear warm-up from lr/10 over warmup_epochs, then cosine decay to min_lr."""
    o = cfg.optim
    if epoch < o.warmup_epochs:
        return o.lr * (0.1 + 0.9 * epoch / max(1, o.warmup_epochs))
    span = max(1, cfg.epochs - o.warmup_epochs - 1)
    t = min(1.0, (epoch - o.warmup_epochs) / span)
    return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1 + math.cos(math.pi * t))


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class StopFlag:
    """Set by SIGTERM / SIGUSR1; acted on at the end of an epoch, never inside one."""

    def __init__(self) -> None:
        self.signal: int = 0
        for s in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(s, self._set)

    def _set(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        self.signal = signum


def _stats(values: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.tensor(values, dtype=torch.float64)
    mx, sm = t.clone(), t.clone()
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    dist.all_reduce(sm)
    return mx, sm / dist.get_world_size()


def train(cfg: TrainConfig, ctx: DistContext, task: Task, log: Any = print) -> dict[str, Any]:
    """Run the loop; returns the summary (best validation epoch and its test accuracy)."""
    rank0 = ctx.rank == 0
    model = task.model
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr,
                            weight_decay=cfg.optim.weight_decay)
    root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    meta = {"world_size": ctx.world_size, "grid": task.grid, "strategy": task.strategy,
            "config_hash": cfg.hash()}
    start, best = 0, {"epoch": -1, "valid_acc": -1.0, "test_acc": 0.0}
    if cfg.resume:
        assert root is not None
        found = ckpt.latest_complete(root)
        if found is None:
            raise ckpt.CheckpointError(f"{root}: no complete checkpoint to resume from")
        epoch, cmeta = found
        state = ckpt.load_shard(root, epoch, ctx.rank, cmeta, meta)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"])
        model.step = int(state["step"])
        best = dict(state["best"])
        start = epoch
        if rank0:
            log(f"plexgt train: resumed from {ckpt.epoch_dir(root, epoch)} (epoch {epoch})")
    if root is not None and rank0:
        root.mkdir(parents=True, exist_ok=True)
        (root / ckpt.STOPPED).unlink(missing_ok=True)
        (root / "config.toml").write_text(to_toml(cfg))

    def save(epoch: int) -> None:
        if root is None:
            return
        ckpt.write_shard(root, epoch, ctx.rank, {
            "model": model.state_dict(), "optim": opt.state_dict(),
            "rng": torch.get_rng_state(), "step": int(model.step), "best": best,
            "epoch": epoch,
        })
        dist.barrier()
        if rank0:
            ckpt.mark_complete(root, epoch, meta)
        dist.barrier()

    stop = StopFlag()
    # a resumed run appends to its metrics; a fresh run starts them anew
    mode = "a" if cfg.resume else "w"
    metrics = open(cfg.metrics, mode) if (rank0 and cfg.metrics) else None  # noqa: SIM115
    bar_every = max(1, cfg.epochs // 20)
    bar = (Progress("train", cfg.epochs, start=start, every_s=0.0)
           if rank0 and cfg.progress else None)
    epoch = start
    try:
        for epoch in range(start, cfg.epochs):
            for g in opt.param_groups:
                g["lr"] = lr_at(cfg, epoch)
            task.ledger.reset()
            model.train()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = task.loss(model(task.inputs))
            loss.backward()
            opt.step()
            t1 = time.perf_counter()
            dist.barrier()
            t2 = time.perf_counter()
            comm_s = task.ledger.seconds
            sent = task.ledger.total(kind="sent")
            row: dict[str, Any] = {"epoch": epoch + 1, "loss": loss.item(),
                                   "lr": opt.param_groups[0]["lr"]}
            if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
                model.eval()
                with torch.no_grad():
                    acc = task.correct(model(task.inputs))
                for split, (c, n) in acc.items():
                    row[f"{split}_acc"] = c / max(1, n)
                if row.get("valid_acc", -1.0) > best["valid_acc"]:
                    best = {"epoch": epoch + 1, "valid_acc": row["valid_acc"],
                            "test_acc": row.get("test_acc", 0.0)}
            mx, mean = _stats([t1 - t0 - comm_s, comm_s, t2 - t1, float(sent),
                               float(peak_memory_bytes(ctx.device))])
            row.update({
                "time_compute": mx[0].item(), "time_comm": mx[1].item(), "time_wait": mx[2].item(),
                "time_compute_mean": mean[0].item(), "time_comm_mean": mean[1].item(),
                "time_wait_mean": mean[2].item(), "time_epoch": t2 - t0,
                "bytes_comm": int(mean[3].item() * ctx.world_size),
                "bytes_comm_max_rank": int(mx[3].item()),
                "peak_mem_bytes": int(mx[4].item()), "grid": task.grid,
                "strategy": task.strategy, "ranks": ctx.world_size,
            })
            if metrics is not None:
                metrics.write(json.dumps(row) + "\n")
                metrics.flush()
            if bar is not None:
                acc_txt = " ".join(f"{k}={row[k]:.4f}" for k in
                                   ("train_acc", "valid_acc", "test_acc") if k in row)
                line = (f"loss={row['loss']:.4f} {acc_txt} t={row['time_epoch']:.3f}s "
                        f"(compute {row['time_compute']:.3f} comm {row['time_comm']:.3f} "
                        f"wait {row['time_wait']:.3f})")
                if bar.tty:  # a redrawn bar on a terminal; plain lines in batch logs
                    bar.update(1, f"epoch {epoch + 1}/{cfg.epochs} {line}")
                elif (epoch + 1) % bar_every == 0 or epoch == start:
                    print(f"[epoch {epoch + 1:>4}/{cfg.epochs}] {line}", file=sys.stderr,
                          flush=True)
            flags = torch.tensor([stop.signal, int(epoch + 1 == cfg.stop_after)])
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # a signal seen by any rank stops all
            signum, stop_now = int(flags[0]), bool(flags.max())
            due = cfg.checkpoint_every and (epoch + 1) % cfg.checkpoint_every == 0
            if stop_now or due or epoch + 1 == cfg.epochs:
                save(epoch + 1)
            if stop_now:
                if rank0:
                    if root is not None:
                        (root / ckpt.STOPPED).write_text(f"{epoch + 1}\n")
                    why = f"signal {signum}" if signum else "stop_after"
                    log(f"plexgt train: stopped by {why} after epoch {epoch + 1}; "
                        f"checkpoint written; continue with --resume")
                return _summary(True, epoch + 1, best)
    finally:
        if bar is not None:
            bar.close()
        if metrics is not None:
            metrics.close()
    return _summary(False, epoch + 1, best)


def _summary(stopped: bool, last: int, best: dict[str, Any]) -> dict[str, Any]:
    return {"stopped": stopped, "last_epoch": last, "best_epoch": best["epoch"],
            "best_valid_acc": best["valid_acc"], "test_acc_at_best": best["test_acc"]}
