"""Signals delivered at a chosen point of a training run (the stop flag's real path)."""

from __future__ import annotations

import os
import signal
from typing import Any


def signal_during_step(task: Any, at: tuple[int, int], signum: int = signal.SIGUSR1) -> None:
    """Wrap ``task.train_step`` so that this process receives ``signum`` during optimizer
    step ``at`` = (epoch, step), as Slurm's pre-timeout signal would arrive."""
    inner = task.train_step

    def train_step(epoch: int, i: int) -> Any:
        if (epoch, i) == at:
            os.kill(os.getpid(), signum)
        return inner(epoch, i)

    task.train_step = train_step
