"""Activation checkpointing per block (``model.checkpoint = 'block'``): each block (a grid3d
model's op, a gt / gps block) keeps only its input for backward, and its forward runs again
inside the backward when its gradient is needed.

Why it stays exact: every block is a deterministic function of its inputs. Dropout masks are
counter-based on (seed, step, site, node id, column) (:mod:`plexgt.ops.rng`), and the step is
captured when the block first runs, so the recomputed mask is the original one; the
collectives run again in the same order on every rank (each rank's backward graph is the
same), so communication is recomputed too, exactly one more forward of every block
(``early_stop=False``: never a partial recompute whose collectives would depend on which
saved tensor the backward reaches first). What a block must not do twice is update state:
BatchNorm's running statistics are skipped while :func:`recomputing` (the norms read it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

MODES = ("none", "block")
"""``model.checkpoint``'s values."""

_depth = 0


def recomputing() -> bool:
    """Whether a checkpointed block's forward is running again (inside backward)."""
    return _depth > 0


@contextmanager
def _recompute() -> Iterator[None]:
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1


def _contexts() -> tuple[Any, Any]:
    return nullcontext(), _recompute()


def checkpointed(fn: Callable[..., Any], *args: Any, enabled: bool = True) -> Any:
    """``fn(*args)``, its activations recomputed in backward when ``enabled`` (and grad is
    on: evaluation runs it plainly). torch's non-reentrant checkpoint: saved tensors of any
    autograd Function, collectives included, are dropped and rebuilt."""
    if not enabled or not torch.is_grad_enabled():
        return fn(*args)
    return checkpoint(fn, *args, use_reentrant=False, context_fn=_contexts, early_stop=False)


def module_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A single-process norm module on x [n, d], except that a training BatchNorm being
    recomputed normalises by the batch statistics without touching its running ones (the
    original forward updated them): it updates copies, so the same kernel runs and saves
    what the forward saved (torch's checkpoint compares them)."""
    if recomputing() and isinstance(norm, nn.modules.batchnorm._BatchNorm) and norm.training:
        rm, rv = norm.running_mean, norm.running_var
        return F.batch_norm(x, None if rm is None else rm.clone(),
                            None if rv is None else rv.clone(), norm.weight, norm.bias, True,
                            0.0, norm.eps)
    return norm(x)
