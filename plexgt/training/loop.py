"""The training loop of ``plexgt train``: full-graph epochs, metrics, checkpoints, signals.

Each epoch is one exact full-graph step (forward over every node, loss over the training
nodes, backward, AdamW). Its wall time is split per rank into communication (time inside
collectives, from the ledger), waiting (a barrier at the end of the step: load imbalance) and
compute (the rest); rank 0 writes their max and mean over ranks to the metrics JSONL.

SIGTERM and SIGUSR1 (Slurm's pre-timeout signal) only set a flag; at the end of the epoch the
ranks agree on it, write a checkpoint and leave ``STOPPED`` in the checkpoint directory (the job
script requeues on it) if there is one, say which, and exit cleanly. A batch-trained model
(hgt) takes many optimizer steps an epoch, which can outlast Slurm's grace period: its ranks
also agree on the flag between steps (:class:`MidEpoch`: one all-reduce of one integer in
host memory a step) and stop there with a mid-epoch checkpoint (:class:`EpochPart`), from
which ``--resume`` continues at that step; ``checkpoint_every_steps`` writes such
checkpoints periodically.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import resource
import secrets
import signal
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from plexgt.config import TrainConfig, read_config, to_toml
from plexgt.distributed.agree import agreed
from plexgt.distributed.bootstrap import DistContext
from plexgt.errors import ConfigError, TrainingError, mark_agreed
from plexgt.tasks.metrics import task_roc_auc
from plexgt.tasks.task import Task
from plexgt.training import checkpoint as ckpt
from plexgt.training import ownfiles
from plexgt.training.optim import EarlyStop, clip_gradients, make_optimizer
from plexgt.training.resumable import EpochPart, RunState, resume, save
from plexgt.training.tensorboard import TensorBoardLog
from plexgt.util.progress import Progress


def lr_at(cfg: TrainConfig, epoch: int) -> float:
    """The learning rate of ``epoch`` (0-based), never above optim.lr. 'constant': lr.
    'cosine': linear warm-up from lr/10 over warmup_epochs, then cosine decay to min_lr, or
    to lr where min_lr is above it (a cosine from lr up to min_lr would raise the rate: an
    lr of 3e-5 climbed to the default min_lr 1e-4)."""
    o = cfg.optim
    if o.schedule == "constant":
        return o.lr
    if epoch < o.warmup_epochs:
        return o.lr * (0.1 + 0.9 * epoch / max(1, o.warmup_epochs))
    low = min(o.min_lr, o.lr)
    span = max(1, cfg.epochs - o.warmup_epochs - 1)
    t = min(1.0, (epoch - o.warmup_epochs) / span)
    return low + 0.5 * (o.lr - low) * (1 + math.cos(math.pi * t))


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window (each epoch has its own): the caching allocator's peak
    on a GPU; on Linux the process's resident high-water mark (``/proc/self/clear_refs``)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux, or not permitted: the peak is then the process's lifetime peak


def peak_memory_bytes(device: torch.device) -> int:
    """Peak bytes since :func:`reset_peak_memory`: tensors held by the caching allocator on a
    GPU (``max_memory_allocated``: what the model's tensors need), resident memory on the
    CPU. On a GPU it leaves out the CUDA context, NCCL's buffers and the allocator's cache:
    :func:`peak_device_bytes` counts them."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def peak_device_bytes(device: torch.device) -> int:
    """Peak bytes the GPU holds for this rank since :func:`reset_peak_memory`, what an
    out-of-memory error is about: the caching allocator's peak reservation
    (``max_memory_reserved``: tensors plus its cache and fragmentation) plus what the device
    holds outside the allocator, measured when asked (after the step): used memory by
    ``mem_get_info`` (total - free) less the allocator's current reservation, i.e. the CUDA
    context, NCCL's communicator buffers and the libraries' (cuBLAS, cuSPARSE) workspaces.
    ``mem_get_info`` counts every process on the GPU; plexgt runs one rank per GPU. On the
    CPU: :func:`peak_memory_bytes` (the resident peak already counts everything)."""
    if device.type != "cuda":
        return peak_memory_bytes(device)
    free, total = torch.cuda.mem_get_info(device)
    outside = max(0, total - free - torch.cuda.memory_reserved(device))
    return int(torch.cuda.max_memory_reserved(device) + outside)


def autocast(task: Task, device: torch.device) -> Any:
    """The forward's precision context: autocast to ``task.amp`` (bfloat16 runs: GEMMs in
    bfloat16, softmax, norms and the loss in float32, parameters float32), else nothing."""
    if task.amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=task.amp)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a timing boundary; nothing to do on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StopFlag:
    """Set by SIGTERM / SIGUSR1; acted on at the end of an epoch, or between the optimizer
    steps of a batch-trained one, never inside a step."""

    def __init__(self) -> None:
        self.signal: int = 0
        for s in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(s, self._set)

    def _set(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        self.signal = signum


def _stats(values: list[float], device: torch.device) -> tuple[list[float], list[float]]:
    """(max, mean) over ranks of per-rank numbers; reduced on ``device``, the world group's (an
    NCCL group has no CPU backend), and copied back to the host once."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    mx, sm = t.clone(), t.clone()
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    dist.all_reduce(sm)
    both = torch.stack([mx, sm / dist.get_world_size()]).cpu().tolist()
    return both[0], both[1]


Between = Callable[[int, torch.Tensor], bool]
"""Called by a batch-trained epoch after each of its optimizer steps but the last, with the
steps done and their loss sum (a float64 device tensor): True stops the epoch there (every
rank must answer the same)."""


def step(cfg: TrainConfig, task: Task, opt: torch.optim.Optimizer, epoch: int,
         device: torch.device | None = None, part: EpochPart | None = None,
         between: Between | None = None) -> tuple[torch.Tensor | None, float, float]:
    """One exact full-graph step: (loss, seconds of the step, seconds waiting for the others).

    On a GPU the step's boundaries are device synchronisations, so its time is the work's, not
    the launches'; the wait is the barrier after it, also synchronised. Nothing inside the step
    waits for the device. A batch-trained model's epoch (:func:`_batch_steps`) starts at
    ``part`` (a resumed mid-epoch checkpoint's) and asks ``between`` after each step; the
    loss is None where that stopped it."""
    device = torch.device("cpu") if device is None else device
    for g in opt.param_groups:
        g["lr"] = lr_at(cfg, epoch)
    task.ledger.reset()
    task.model.train()
    reset_peak_memory(device)
    synchronize(device)
    t0 = time.perf_counter()
    loss: torch.Tensor | None
    if getattr(task, "train_step", None) is not None and task.steps is not None:
        loss = _batch_steps(cfg, task, opt, epoch, device, part, between)
    else:
        opt.zero_grad(set_to_none=True)
        try:
            with autocast(task, device):
                out = task.model(task.inputs)
            # the loss in float32 outside autocast (its softmax statistics and the mean
            # over nodes)
            loss = task.loss(out if task.amp is None else out.float())
            loss.backward()
        except RuntimeError as e:
            raise nondeterministic_error(e, device) from None
        if cfg.optim.clip_norm > 0:
            clip_gradients(task.model, cfg.optim.clip_norm, device)
        opt.step()
    synchronize(device)
    t1 = time.perf_counter()
    dist.barrier()
    synchronize(device)
    t2 = time.perf_counter()
    task.ledger.settle()
    return loss, t1 - t0, t2 - t1


def _batch_steps(cfg: TrainConfig, task: Task, opt: torch.optim.Optimizer, epoch: int,
                 device: torch.device, part: EpochPart | None = None,
                 between: Between | None = None) -> torch.Tensor | None:
    """A batch-trained model's epoch: ``task.steps(epoch)`` optimizer steps, each the task's
    forward and backward (its pipeline schedule and gradient sums) then the loop's clipping
    and optimizer step; returns the mean of the steps' losses (replicated), or None where
    ``between`` stopped the epoch after a step. Resumed at ``part``: from step ``part.done``,
    the sum starting from the recorded one. Exact because nothing a step computes depends on
    where the run started: the sequences are a function of (seed, epoch, index), dropout of
    the model's step counter (checkpointed), the learning rate of the epoch."""
    assert task.train_step is not None and task.steps is not None
    # no host sync a step (but ``between``'s)
    total = torch.full((), part.loss_sum if part is not None else 0.0, dtype=torch.float64,
                       device=device)
    n = task.steps(epoch)
    for i in range(part.done if part is not None else 0, n):
        opt.zero_grad(set_to_none=True)
        try:
            with autocast(task, device):
                loss = task.train_step(epoch, i)
        except RuntimeError as e:
            raise nondeterministic_error(e, device) from None
        if cfg.optim.clip_norm > 0:
            clip_gradients(task.model, cfg.optim.clip_norm, device)
        opt.step()
        total += loss.detach().to(device=device, dtype=torch.float64)
        if between is not None and i + 1 < n and between(i + 1, total):
            return None
    return total / max(1, n)


NONDETERMINISTIC = re.compile(r"(\S+) does not have a deterministic implementation")
"""torch's message for an op without a deterministic variant under
``use_deterministic_algorithms(True)`` (:mod:`plexgt.training.numerics`)."""


def nondeterministic_error(e: RuntimeError, device: torch.device) -> Exception:
    """``e`` as a one-line ConfigError naming ``deterministic`` when torch raised it for an op
    with no deterministic implementation on ``device``; ``e`` itself otherwise."""
    m = NONDETERMINISTIC.search(str(e))
    if m is None:
        return e
    return ConfigError(f"config key 'deterministic': {m[1]} has no deterministic "
                       f"implementation on {device.type}, so this run cannot be bit-exact "
                       "there; run without --deterministic")


def epoch_row(cfg: TrainConfig, ctx: DistContext, task: Task, opt: torch.optim.Optimizer,
              epoch: int, loss: torch.Tensor, step_s: float, wait_s: float,
              best: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The metrics row of an epoch (accuracy when due; times and bytes as max and mean over
    ranks) and the updated best-so-far."""
    comm_s = task.ledger.seconds
    sent = task.ledger.total(kind="sent")
    # 'metric': the key suffix the best epoch is chosen on (plexgt report reads it: a binary
    # run's rows hold its accuracy too)
    row: dict[str, Any] = {"epoch": epoch + 1, "loss": loss.item(),
                           "lr": opt.param_groups[0]["lr"], "metric": task.metric}
    if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
        task.model.eval()
        with torch.no_grad(), autocast(task, ctx.device):
            if getattr(task, "evaluate", None) is not None:  # batch-trained: in batches
                acc, scores = task.evaluate(), None
            else:
                out = task.model(task.inputs)
                acc = task.correct(out)
                scores = task.scores(out) if task.scores is not None else None
        for split, (c, n) in acc.items():
            row[f"{split}_acc"] = c / max(1, n)
        for split, (s, y) in (scores or {}).items():  # the same on every rank (gathered)
            row[f"{split}_rocauc"] = task_roc_auc(s.cpu().numpy(), y.cpu().numpy())
        m = task.metric
        valid = row.get(f"valid_{m}", -1.0)
        if valid == valid and valid > best["valid"]:  # NaN (one class only) never wins
            best = {"epoch": epoch + 1, "valid": valid, "test": row.get(f"test_{m}", 0.0)}
    mx, mean = _stats([step_s - comm_s, comm_s, wait_s, float(sent),
                       float(peak_memory_bytes(ctx.device)),
                       float(peak_device_bytes(ctx.device))], ctx.device)
    row.update({
        "time_compute": mx[0], "time_comm": mx[1], "time_wait": mx[2],
        "time_compute_mean": mean[0], "time_comm_mean": mean[1],
        "time_wait_mean": mean[2], "time_epoch": step_s + wait_s,
        "bytes_comm": int(mean[3] * ctx.world_size),
        "bytes_comm_max_rank": int(mx[3]),
        "peak_mem_bytes": int(mx[4]), "peak_mem_bytes_mean": int(mean[4]),
        "peak_device_mem_bytes": int(mx[5]), "peak_device_mem_bytes_mean": int(mean[5]),
        "grid": task.grid, "strategy": task.strategy, "ranks": ctx.world_size,
    })
    return row, best


class EpochLog:
    """Rank 0's outputs of every epoch: the metrics JSONL, TensorBoard scalars and the
    progress line."""

    def __init__(self, cfg: TrainConfig, rank0: bool, start: int) -> None:
        self.cfg = cfg
        self.start = start
        self.metrics = open_metrics(cfg, start) if rank0 and cfg.metrics else None
        self.board = (TensorBoardLog(cfg.tensorboard, start) if rank0 and cfg.tensorboard
                      else None)
        self.every = max(1, cfg.epochs // 20)
        self.bar = (Progress("train", cfg.epochs, start=start, every_s=0.0)
                    if rank0 and cfg.progress else None)

    def write(self, row: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(json.dumps(row) + "\n")
            self.metrics.flush()
        if self.board is not None:
            self.board.write(row)
        if self.bar is None:
            return
        epoch = row["epoch"]
        acc_txt = " ".join(f"{k}={row[k]:.4f}" for k in
                           ("train_acc", "valid_acc", "test_acc", "train_rocauc",
                            "valid_rocauc", "test_rocauc") if k in row)
        line = (f"loss={row['loss']:.4f} {acc_txt} t={row['time_epoch']:.3f}s "
                f"(compute {row['time_compute']:.3f} comm {row['time_comm']:.3f} "
                f"wait {row['time_wait']:.3f})")
        if self.bar.tty:  # a redrawn bar on a terminal; plain lines in batch logs
            self.bar.update(1, f"epoch {epoch}/{self.cfg.epochs} {line}")
        elif epoch % self.every == 0 or epoch - 1 == self.start:
            print(f"[epoch {epoch:>4}/{self.cfg.epochs}] {line}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.board is not None:
            self.board.close()


def open_metrics(cfg: TrainConfig, start: int) -> Any:
    """The metrics JSONL, opened for this run: anew for a fresh run; for a resumed one, cut
    back to the epochs up to the checkpoint (a killed run may have logged epochs past it,
    which the resumed run repeats), then appended to."""
    path = Path(cfg.metrics)
    try:
        if not cfg.resume:
            return open(path, "w")  # noqa: SIM115 - closed by EpochLog.close
        kept = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    if int(json.loads(line)["epoch"]) <= start:
                        kept.append(line + "\n")
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by the kill
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
        return open(path, "a")  # noqa: SIM115 - closed by EpochLog.close
    except OSError as e:
        raise ConfigError(f"config key 'metrics': {path}: {e.strerror or e}") from None


def stop_requested(stop: StopFlag, cfg: TrainConfig, epoch: int, device: torch.device
                   ) -> tuple[int, bool]:
    """(signal number or 0, whether to stop now), agreed by all ranks: a signal seen by any
    rank stops all."""
    flags = torch.tensor([stop.signal, int(epoch + 1 == cfg.stop_after)], device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    signum, at_stop = flags.cpu().tolist()
    return int(signum), bool(signum or at_stop)


def train(cfg: TrainConfig, ctx: DistContext, task: Task, log: Any = print) -> dict[str, Any]:
    """Run the loop; returns the summary (best validation epoch and its test accuracy)."""
    rank0 = ctx.rank == 0
    opt = make_optimizer(cfg, task.model)
    root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    held = agreed(lambda: ckpt.lock(root) if rank0 and root is not None else None, ctx.device)
    try:
        if root is not None and not cfg.resume:  # a fresh run writes into no other's
            agreed(lambda: ckpt.check_fresh(root) if rank0 else None, ctx.device)
        state = resume(cfg, ctx, task, opt, log) if cfg.resume else RunState()
        state.run = state.run or _new_run_id()
        if root is not None:
            agreed(lambda: _prepare_dir(root, cfg) if rank0 else None, ctx.device)
        return _epochs(cfg, ctx, task, opt, state, log)
    finally:
        if held is not None:
            held.close()


def _epochs(cfg: TrainConfig, ctx: DistContext, task: Task, opt: torch.optim.Optimizer,
            state: RunState, log: Any) -> dict[str, Any]:
    """The epochs from ``state.start`` on, with their checkpoints and the stop signals."""
    rank0 = ctx.rank == 0
    root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    best = state.best
    stop = StopFlag()
    last = state.start
    early = EarlyStop(cfg.patience)
    if early.due(state.start, best):  # a resumed run that had already stopped early
        return _summary(early.why, state.start, last, best, task.metric, root)
    out = agreed(lambda: EpochLog(cfg, rank0, state.start), ctx.device)
    try:
        batched = getattr(task, "train_step", None) is not None and task.steps is not None
        flags = host_group(ctx) if batched else None
        for epoch in range(state.start, cfg.epochs):
            part = state.part if epoch == state.start else None
            between = (MidEpoch(cfg, ctx, task, opt, stop, epoch, best, state.run, log, flags)
                       if batched else None)
            loss, step_s, wait_s = step(cfg, task, opt, epoch, ctx.device, part, between)
            if loss is None:  # stopped between two steps, checkpointed there
                assert between is not None
                return _summary(_why(between.signum), state.start, last, best, task.metric,
                                root, between.done)
            row, new_best = epoch_row(cfg, ctx, task, opt, epoch, loss, step_s, wait_s, best)
            if new_best["epoch"] != best["epoch"]:
                early.keep(task.model)
            best = new_best
            if not math.isfinite(row["loss"]):  # replicated: every rank stops here at once
                err = TrainingError(f"epoch {epoch + 1}: the loss is {row['loss']}; lower "
                                    "optim.lr or check the data (plexgt verify)")
                mark_agreed(err, 0)
                raise err
            out.write(row)
            last = epoch + 1
            signum, stop_now = stop_requested(stop, cfg, epoch, ctx.device)
            # a stop asked for at the last epoch ends a finished run: no STOPPED (the job
            # script would requeue it) and no 'continue with --resume' (nothing is left)
            final = epoch + 1 == cfg.epochs
            due = cfg.checkpoint_every and (epoch + 1) % cfg.checkpoint_every == 0
            patience_out = early.due(epoch + 1, best)  # the same on every rank (metrics are)
            if stop_now or due or final or patience_out:
                save(cfg, ctx, task, opt, epoch + 1, best, state.run)
            if patience_out and not stop_now:
                early.restore(task.model)
                return _summary(early.why, state.start, last, best, task.metric, root)
            if stop_now and not final:
                if root is not None:
                    agreed(lambda e=epoch + 1: _mark_stopped(root, e) if rank0 else None,
                           ctx.device)
                if rank0:
                    log(f"plexgt train: stopped by {_why(signum)} after epoch {epoch + 1}; "
                        + (f"checkpoint {ckpt.epoch_dir(root, epoch + 1)} written; continue "
                           "with --resume" if root is not None else
                           "no checkpoint written (no --checkpoint-dir): a new run starts "
                           "from epoch 0"))
                return _summary(_why(signum), state.start, last, best, task.metric, root)
    finally:
        out.close()
    early.restore(task.model)
    return _summary("", state.start, last, best, task.metric, root)


def host_group(ctx: DistContext) -> Any:
    """The world as a group whose collectives take host tensors, for the stop flag a
    batch-trained epoch agrees on between its steps: the world group itself under gloo
    (returned as None, the default group), a gloo group over every rank under NCCL (created
    here, collectively, with the run's timeout). Why not the world group's device tensors:
    reading the agreed flag back would wait for the step's kernels at every step (a host
    sync the loop otherwise never makes inside an epoch)."""
    if ctx.world_size == 1 or ctx.backend == "gloo":
        return None
    return dist.new_group(backend="gloo", timeout=ctx.timeout)


class MidEpoch:
    """The :data:`Between` of epoch ``epoch``'s steps: the ranks agree on a pending stop
    signal after every step, over ``group`` (:func:`host_group`: host memory, no device
    sync; one all-reduce of one integer, measured by perf/bench_stop_flag.py). On a signal,
    or every ``checkpoint_every_steps`` steps, every rank writes the mid-epoch checkpoint
    (:class:`EpochPart`); on a signal the run then stops as at an epoch's end: ``STOPPED``
    left for the job script, one line saying where."""

    def __init__(self, cfg: TrainConfig, ctx: DistContext, task: Task,
                 opt: torch.optim.Optimizer, stop: StopFlag, epoch: int, best: dict[str, Any],
                 run: str, log: Any, group: Any = None) -> None:
        self.cfg, self.ctx, self.task, self.opt, self.stop = cfg, ctx, task, opt, stop
        self.epoch, self.best, self.run, self.log = epoch, best, run, log
        self.group = group
        self.signum = 0
        self.done = 0

    def __call__(self, done: int, total: torch.Tensor) -> bool:
        cfg, ctx = self.cfg, self.ctx
        flag = torch.tensor([self.stop.signal], dtype=torch.int64)  # host memory
        if ctx.world_size > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        signum = int(flag[0])
        every = cfg.checkpoint_every_steps
        if not signum and not (every and done % every == 0):
            return False
        save(cfg, ctx, self.task, self.opt, self.epoch, self.best, self.run,
             EpochPart(done, float(total.item())))
        if not signum:
            return False
        self.signum, self.done = signum, done
        root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        if root is not None:
            agreed(lambda: _mark_stopped(root, self.epoch, done) if ctx.rank == 0 else None,
                   ctx.device)
        if ctx.rank == 0:
            n = self.task.steps(self.epoch) if self.task.steps is not None else done
            self.log(f"plexgt train: stopped by {_why(signum)} after step {done} of {n} of "
                     f"epoch {self.epoch + 1}; "
                     + (f"checkpoint {ckpt.epoch_dir(root, self.epoch, done)} written; "
                        "continue with --resume" if root is not None else
                        "no checkpoint written (no --checkpoint-dir): a new run starts "
                        "from epoch 0"))
        return True


def _new_run_id() -> str:
    """A fresh run's identity: recorded in each COMPLETE it writes (and kept by a run resumed
    from one), it says whose checkpoints pruning may remove. Only rank 0 writes COMPLETE and
    prunes, so only its draw is ever used: nothing to broadcast (and no device sync)."""
    return f"{secrets.randbits(62):016x}"


def _why(signum: int) -> str:
    return f"signal {signum}" if signum else "stop_after"


CONFIG = "config.toml"
CONFIG_MARK = "# plexgt train: the configuration of the run checkpointed here\n"
"""config.toml's first line: what marks the file as plexgt's to replace."""
STOPPED_TEXT = re.compile(r"\d+(?: \d+)?\n")
"""STOPPED's line: the epochs done, then the steps of the next where it stopped mid-epoch."""


def _own_config(text: str) -> bool:
    """A config.toml plexgt wrote: its mark, or (written before the mark) exactly what
    :func:`to_toml` writes for the configuration it holds."""
    if text.startswith(CONFIG_MARK):
        return True
    try:
        return to_toml(read_config(None, dict(_dotted(tomllib.loads(text))))) == text
    except (tomllib.TOMLDecodeError, ConfigError, ValueError, TypeError):
        return False


def _dotted(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in tree.items():
        out.extend(_dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else [(prefix + k, v)])
    return out


def _prepare_dir(root: Path, cfg: TrainConfig) -> None:
    """Rank 0: clear an old STOPPED mark and record the configuration beside the checkpoints
    (each only where plexgt's own file, or none, is)."""
    ownfiles.remove_own(root / ckpt.STOPPED, STOPPED_TEXT.fullmatch)
    ownfiles.replace_own(root / CONFIG, CONFIG_MARK + to_toml(cfg), _own_config)


def _mark_stopped(root: Path, epoch: int, step: int = 0) -> None:
    """Rank 0: leave STOPPED (the epoch, and the step of a mid-epoch stop) for the job
    script, which requeues on it."""
    ownfiles.replace_own(root / ckpt.STOPPED, f"{epoch} {step}\n" if step else f"{epoch}\n",
                         STOPPED_TEXT.fullmatch)


def _summary(stopped: str, start: int, last: int, best: dict[str, Any], metric: str,
             root: Path | None, step: int = 0) -> dict[str, Any]:
    """What the run did, for its last line. ``stopped``: why it stopped early ('signal 10',
    'stop_after'), '' if it ran out; ``start``: the epoch it resumed at (0: a fresh run);
    ``last_step``: the steps into epoch ``last_epoch + 1`` where it stopped (0: at an epoch's
    end); ``checkpoint``: the one its end wrote ('' when none: no directory, or nothing
    trained); ``best_epoch`` -1 while no epoch has been evaluated."""
    wrote = root is not None and (last > start or step > 0)
    return {"stopped": stopped, "start_epoch": start, "last_epoch": last, "last_step": step,
            "best_epoch": best["epoch"], "metric": metric, "best_valid": best["valid"],
            "test_at_best": best["test"],
            "checkpoint": str(ckpt.epoch_dir(root, last, step)) if wrote and root else ""}
