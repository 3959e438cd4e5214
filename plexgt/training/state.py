"""A run's resumable state in the single-process model's form, whatever the layout.

Keys: ``model/<name>`` (the single-process model's parameter and persistent buffer names
and shapes: BatchNorm's running statistics),
``optim/exp_avg/<name>``, ``optim/exp_avg_sq/<name>`` (AdamW's moments, shaped like their
parameters), ``optim/step`` (AdamW's step count) and ``rng/cpu`` (and ``rng/cuda`` on a GPU).
A checkpoint resumes across device types: written on a CPU it has no ``rng/cuda``, which a
GPU run then seeds from the run's seed and epoch (:func:`cuda_seed`); written on a GPU, its
``rng/cuda`` is ignored by a CPU run (:func:`fit_rng`). Neither RNG draws anything a step
computes (dropout is counter-based, :mod:`plexgt.ops.rng`): they are restored so that code
drawing from torch's streams after a resume sees what it would have seen.
A distributed model maps its local tensors to and from this form with ``to_canonical`` and
``from_canonical`` (:class:`~plexgt.parallel.plexus3d.Plexus3DGCN` reassembles its blocks,
:class:`~plexgt.parallel.rows1d.RowParallel` is replicated), so a checkpoint written on one
grid, world size or strategy loads on any other.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

Tensor = torch.Tensor
MOMENTS = ("exp_avg", "exp_avg_sq")


def _names(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters()]


def _opt_index(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Parameter name -> its index in the optimiser's state (the parameters numbered group
    by group, as ``state_dict`` numbers them: weight decay on weights only puts the vectors
    in a group of their own)."""
    ids = {id(p): n for n, p in model.named_parameters()}
    order = [ids[id(p)] for g in opt.param_groups for p in g["params"]]
    return {n: i for i, n in enumerate(order)}


def _buffers(model: nn.Module) -> dict[str, Tensor]:
    """The model's persistent buffers (BatchNorm's running statistics): state beside the
    parameters, canonical like them."""
    params = set(_names(model))
    return {k: v for k, v in model.state_dict().items() if k not in params}


def canonical_state(model: Any, opt: torch.optim.Optimizer) -> dict[str, Tensor]:
    """The state of ``model`` (a distributed model with ``to_canonical``) and its Adam(W)
    ``opt`` (parameter groups over ``model.parameters()``), identical on every rank;
    collective where the model's parameters are sharded. Before the first step the moments
    are zeros: the same keys and shapes, so this is also the template a resume loads into."""
    params = {n: p.detach() for n, p in model.named_parameters()}
    out = {f"model/{k}": v for k, v in model.to_canonical({**params, **_buffers(model)}
                                                           ).items()}
    st = opt.state_dict()["state"]
    index = _opt_index(model, opt)
    for key in MOMENTS:
        local = {n: st[index[n]][key].detach() if index[n] in st
                 else torch.zeros_like(params[n]) for n in params}
        out.update({f"optim/{key}/{k}": v for k, v in model.to_canonical(local).items()})
    steps = [float(s["step"]) for s in st.values()]
    out["optim/step"] = torch.tensor(max(steps, default=0.0))
    out["rng/cpu"] = torch.get_rng_state()
    if cuda_rng_in_use():
        out["rng/cuda"] = torch.cuda.get_rng_state()
    return out


RNG_KEYS = ("rng/cpu", "rng/cuda")
"""The RNG states of :func:`canonical_state`: what a checkpoint of another device type may
lack (the model and optimizer keys never may)."""


def cuda_rng_in_use() -> bool:
    """Whether this process's CUDA RNG exists (a GPU run): what decides ``rng/cuda``."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def fit_rng(template: dict[str, Tensor], saved: set[str]) -> tuple[dict[str, Tensor],
                                                                   list[str]]:
    """The load template without the RNG states the checkpoint does not hold (a CPU-written
    checkpoint read by a GPU run has no ``rng/cuda``), and the keys left out. Keys the
    checkpoint has but the template does not (its ``rng/cuda`` read by a CPU run) are
    never read: a load reads the template's keys."""
    missing = [k for k in RNG_KEYS if k in template and k not in saved]
    return {k: v for k, v in template.items() if k not in missing}, missing


def cuda_seed(seed: int, epoch: int) -> int:
    """The CUDA RNG's seed for a GPU run resumed at ``epoch`` from a checkpoint without its
    state: a function of the run's seed and the epoch only, so two such resumes agree."""
    return (seed * 1_000_003 + epoch) % 2**63


def load_canonical_state(model: Any, opt: torch.optim.Optimizer, state: dict[str, Tensor],
                         seed: int = 0, epoch: int = 0) -> bool:
    """Put a canonical ``state`` into this rank's parameters, AdamW moments and RNG. Returns
    True when this GPU run's CUDA RNG was seeded (:func:`cuda_seed` of ``seed`` and
    ``epoch``) because ``state`` holds no CUDA RNG state (written on a CPU)."""
    def part(prefix: str) -> dict[str, Tensor]:
        return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

    local = model.from_canonical(part("model/"))
    index = _opt_index(model, opt)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(local[n])
        for n, b in _buffers(model).items():
            b.copy_(local[n])
    step = float(state["optim/step"])
    if step > 0:
        moments = {key: model.from_canonical(part(f"optim/{key}/")) for key in MOMENTS}
        sd = opt.state_dict()
        sd["state"] = {index[n]: {"step": torch.tensor(step),
                                  **{key: moments[key][n].clone() for key in MOMENTS}}
                       for n in index}
        opt.load_state_dict(sd)
    torch.set_rng_state(state["rng/cpu"])
    if not cuda_rng_in_use():
        return False  # a CPU run: a GPU checkpoint's rng/cuda was not read
    if "rng/cuda" in state:
        torch.cuda.set_rng_state(state["rng/cuda"])
        return False
    torch.cuda.manual_seed(cuda_seed(seed, epoch))
    return True
