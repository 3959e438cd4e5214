"""The optimiser of a run and its gradient clipping, the same on every layout.

Each rank holds some of the model's parameters whole (replicated: a row-parallel model's),
some as blocks (a 3D GCN's weights, a node embedding's table) and some as copies of a block
(a 3D GCN's biases and norm parameters over c). A distributed model says which of its local
parameters this rank *counts* (``counted(name)``): exactly one rank counts each element of
the canonical model. So the global gradient norm is one all-reduce of the counted squared
norms over the world, and equals the single-process model's; every rank then scales its own
gradients by the same factor, as :func:`torch.nn.utils.clip_grad_norm_` does.

Weight decay on 'weights' only leaves out the parameters that are vectors in the
single-process model (biases, norm scales and shifts), which are vectors in every layout too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from plexgt.config import TrainConfig


def param_groups(model: nn.Module, weight_decay: float, decay: str = "all"
                 ) -> list[dict[str, Any]]:
    """One group decayed by ``weight_decay``; with ``decay='weights'`` the vectors (biases,
    norm parameters: 1-dimensional here as in the single-process model) in a second group
    without decay."""
    params = list(model.parameters())
    if decay == "all":
        return [{"params": params, "weight_decay": weight_decay}]
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def make_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """``optim.name``'s optimiser over ``model``'s parameters at ``optim.lr``, weight decay on
    ``optim.decay``'s parameters (AdamW's decoupled decay, Adam's L2 term)."""
    o = cfg.optim
    cls = torch.optim.AdamW if o.name == "adamw" else torch.optim.Adam
    return cls(param_groups(model, o.weight_decay, o.decay), lr=o.lr)


@torch.no_grad()
def grad_norm(model: nn.Module, device: torch.device | None = None) -> torch.Tensor:
    """The 2-norm of the whole model's gradient (float64, the same on every rank): this
    rank's counted gradients' squares, summed over the world (one all-reduce of a scalar
    when the world has more than one rank)."""
    counted = getattr(model, "counted", None)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for name, p in model.named_parameters():
        if p.grad is not None and (counted is None or counted(name)):
            total += p.grad.detach().double().pow(2).sum().to(total.device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        if counted is None:
            raise ValueError("a distributed model must say which parameters it counts "
                             "(counted(name)) for the gradient's norm")
        dist.all_reduce(total)
    return total.sqrt()


@torch.no_grad()
def clip_gradients(model: nn.Module, max_norm: float, device: torch.device | None = None
                   ) -> torch.Tensor:
    """Scale every gradient by min(1, max_norm / (norm + 1e-6)) (torch's clip_grad_norm_
    factor) with the global norm (:func:`grad_norm`); returns the norm before clipping."""
    norm = grad_norm(model, device)
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(scale.to(p.grad.device, p.grad.dtype))
    return norm


class EarlyStop:
    """Early stopping on the validation metric (``patience`` epochs without a better one; 0:
    never), and the best validation epoch's model state, kept in memory (this rank's
    parameters and buffers) and put back when the run ends, so what runs after training
    sees the best model. The checkpoints stay the last epoch's: the resumable state."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.best_state: dict[str, torch.Tensor] | None = None
        self.why = f"early stopping (patience {patience})"

    def due(self, epoch: int, best: dict[str, Any]) -> bool:
        """Whether ``epoch`` epochs done, ``patience`` have passed since the best one."""
        return self.patience > 0 and best["epoch"] > 0 and epoch - best["epoch"] >= \
            self.patience

    def keep(self, model: torch.nn.Module) -> None:
        """Remember ``model``'s state (a new best epoch)."""
        if self.patience > 0:
            self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def restore(self, model: torch.nn.Module) -> None:
        """Put the best epoch's state back (if this run saw it: a resumed run's earlier best
        is not in memory)."""
        if self.best_state is not None:
            model.load_state_dict(self.best_state)
