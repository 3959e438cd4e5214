"""The checkpoint side of ``plexgt train``'s loop: what a checkpoint records of a run and
where a resumed run starts.

A full-graph model checkpoints at epoch ends only. A batch-trained one (hgt) may also
checkpoint between two optimizer steps of an epoch (:class:`EpochPart`: the steps done and
their loss sum); its resume continues at that step, and gives the uninterrupted run's epoch
rows and parameters exactly, because nothing a step computes depends on where the run
started: the sequences are a pure function of (seed, epoch, index), dropout of the model's
step counter (recorded in COMPLETE's ``step``), the learning rate of the epoch, and the
optimizer's moments and step count are in the canonical state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from plexgt.config import TrainConfig
from plexgt.distributed.agree import agreed
from plexgt.distributed.bootstrap import DistContext
from plexgt.errors import CheckpointError
from plexgt.tasks.task import Task
from plexgt.training import checkpoint as ckpt
from plexgt.training.state import canonical_state, fit_rng, load_canonical_state


@dataclass(frozen=True)
class EpochPart:
    """The first ``done`` optimizer steps of a batch-trained epoch (0 < done < its steps) and
    the float64 sum of their losses: what a mid-epoch checkpoint records, so that the resumed
    epoch continues at step ``done`` and its loss (the mean over all its steps, summed in the
    same order) is the uninterrupted run's to the bit."""

    done: int
    loss_sum: float


@dataclass
class RunState:
    """Where a run stands: the epoch to start from and the best validation epoch so far."""

    start: int = 0
    best: dict[str, Any] = field(
        default_factory=lambda: {"epoch": -1, "valid": -1.0, "test": 0.0})
    """Epoch, validation and test metric (the task's: accuracy or ROC-AUC) of the best
    validation epoch."""
    run: str = ""
    """The run's identity (:func:`plexgt.training.loop._new_run_id`): a resumed run keeps the
    one its checkpoint records; '' until one is given."""
    part: EpochPart | None = None
    """Where epoch ``start`` stands (resumed from a mid-epoch checkpoint); None: at its
    start."""


def run_meta(ctx: DistContext, task: Task, cfg: TrainConfig) -> dict[str, Any]:
    """What a checkpoint records of the run that wrote it. The configuration hash and the
    dataset's identity must match on resume, and with a node embedding the data's node order
    (the table's rows follow it); the layout is informational (the state is canonical)."""
    meta = {"world_size": ctx.world_size, "grid": task.grid, "strategy": task.strategy,
            "config_hash": cfg.hash(), "config": cfg.computation(),
            "dataset": task.dataset, "dataset_name": task.dataset_name}
    if task.node_order:
        meta["node_order"] = task.node_order
    return meta


def resume(cfg: TrainConfig, ctx: DistContext, task: Task, opt: torch.optim.Optimizer,
           log: Any) -> RunState:
    """Load the newest complete checkpoint into the model, optimiser and RNG, on whatever
    world size, grid or strategy this run has."""
    root = Path(cfg.checkpoint_dir)

    def find() -> tuple[int, dict[str, Any], EpochPart | None]:
        found = ckpt.latest_complete(root)
        if found is None:
            raise CheckpointError(f"{root}: no complete checkpoint to resume from")
        epoch, cmeta = found
        ckpt.check_meta(root, epoch, cmeta, run_meta(ctx, task, cfg))
        ckpt.verify_files(root, epoch, cmeta)  # this rank's share of the files
        return epoch, cmeta, _part_of(root, epoch, cmeta, task)

    epoch, meta, part = agreed(find, ctx.device)  # one rank's bad file stops every rank
    at = part.done if part is not None else 0
    where = ckpt.epoch_dir(root, epoch, at)
    saved = agreed(lambda: ckpt.saved_keys(root, epoch, at), ctx.device)
    # across device types: a CPU checkpoint has no rng/cuda for a GPU run to read
    template, _ = fit_rng(canonical_state(task.model, opt), saved)
    state = agreed(lambda: ckpt.read_state(root, epoch, template, at), ctx.device)
    seeded = load_canonical_state(task.model, opt, state, cfg.seed, epoch)
    if seeded and ctx.rank == 0:
        log(f"plexgt train: {where} holds no CUDA RNG state (written "
            f"on a CPU); the CUDA RNG is seeded from seed {cfg.seed} and epoch {epoch}")
    if hasattr(task.model, "step"):
        task.model.step = int(meta["step"])
    if ctx.rank == 0:
        how = "" if (meta.get("world_size"), meta.get("grid"), meta.get("strategy")) == (
            ctx.world_size, task.grid, task.strategy) else (
            f", written by {meta.get('world_size')} ranks on {meta.get('grid')} "
            f"{meta.get('strategy')}")
        at_txt = f", step {at} of epoch {epoch + 1}" if at else ""
        log(f"plexgt train: resumed from {where} (epoch {epoch}{at_txt}{how})")
    return RunState(epoch, dict(meta["best"]), str(meta.get("run") or ""), part)


def _part_of(root: Path, epoch: int, meta: dict[str, Any], task: Task) -> EpochPart | None:
    """The mid-epoch position a COMPLETE records (None: an epoch's end); one-line errors for
    a record that does not fit this run (a step past the epoch's, a loss sum not a number)."""
    done = ckpt.step_of(meta)
    if not done:
        return None
    d = ckpt.epoch_dir(root, epoch, done)
    if task.steps is None or task.train_step is None:
        raise CheckpointError(f"{d}: a mid-epoch checkpoint; this model trains whole epochs")
    n = task.steps(epoch)
    if not 0 < done < n:
        raise CheckpointError(f"{d}: records step {done} of an epoch of {n} steps")
    try:
        return EpochPart(done, float(meta["epoch_loss_sum"]))
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{d / ckpt.COMPLETE}: no epoch_loss_sum for its step "
                              f"{done}") from None


def save(cfg: TrainConfig, ctx: DistContext, task: Task, opt: torch.optim.Optimizer,
         epoch: int, best: dict[str, Any], run: str = "", part: EpochPart | None = None
         ) -> None:
    """Every rank writes its part of the canonical state (collective); rank 0 marks the
    checkpoint complete once all have written and hashed their files, as run ``run``'s.
    ``part``: a mid-epoch checkpoint, ``part.done`` steps into the epoch after ``epoch``
    (:func:`~plexgt.training.checkpoint.epoch_dir`), recording the steps' loss sum."""
    if not cfg.checkpoint_dir:
        return
    root = Path(cfg.checkpoint_dir)
    at = part.done if part is not None else 0
    state = canonical_state(task.model, opt)
    agreed(lambda: ckpt.clear_epoch(root, epoch, run, at) if ctx.rank == 0 else None,
           ctx.device)
    sums = agreed(lambda: ckpt.write_state(root, epoch, state, at), ctx.device)
    parts: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(parts, sums)
    meta = {**run_meta(ctx, task, cfg), "step": int(getattr(task.model, "step", 0)),
            "best": best, "run": run,
            "sha256": {k: v for p in parts for k, v in p.items()}}
    if part is not None:  # float's repr round-trips: the sum comes back to the bit
        meta.update({"epoch_step": part.done, "epoch_loss_sum": part.loss_sum})
    agreed(lambda: ckpt.mark_complete(root, epoch, meta) if ctx.rank == 0 else None,
           ctx.device)
