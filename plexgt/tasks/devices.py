"""What a rank's device cannot run, refused before anything is built (one line naming the key).

Apart from :mod:`plexgt.tasks.limits` (sizes a rank cannot hold) because it is a rule of the
device, not of sizes: a ROCm build of torch has no GPU ``torch.sparse.sampled_addmm``, and
every attention path the fused Triton kernel cannot serve (d' over its width, no Triton)
computes its scores with it. Without this
check a gt / gps run on a ROCm GPU dies at its first attention layer with torch's
"requires compiling PyTorch with CUDA 11.2.1+", after the data is read and the groups made.
"""

from __future__ import annotations

import torch

from plexgt.config import TrainConfig
from plexgt.errors import ConfigError
from plexgt.ops.attention import NO_SAMPLED_ADDMM, sampled_addmm_available, torch_kernels_reason
from plexgt.ops.attention_triton import MAX_HEAD_DIM
from plexgt.parallel.attention.registry import default_registry


def check_attention_kernels(cfg: TrainConfig, device: torch.device | None) -> None:
    """ConfigError when gt / gps on ``device`` would reach torch's SDDMM and the device has
    none (:func:`~plexgt.ops.attention.sampled_addmm_available`): a strategy whose kernels are
    it (:attr:`~plexgt.parallel.attention.strategy.AttentionStrategy.needs_sampled_addmm`;
    none of the registered ones since the rings' column blocks run on the fused kernel),
    d' wider than the fused kernel holds, or no Triton. An edge bias is the fused kernel's
    too. With strategy 'auto' the plan leaves such strategies out by itself
    (:func:`plexgt.tasks.task.run_plan`)."""
    if device is None or cfg.model.name == "gcn" or sampled_addmm_available(device):
        return
    m, name = cfg.model, cfg.parallel.strategy
    reg = default_registry()
    if name != "auto" and reg.get(name).needs_sampled_addmm:
        ok = ", ".join(["auto"] + [s.name for s in reg if not s.needs_sampled_addmm])
        raise ConfigError(f"config key 'parallel.strategy': {name} computes its scores with "
                          f"torch.sparse.sampled_addmm, and on {device} {NO_SAMPLED_ADDMM}; "
                          f"use {ok}")
    head_dim = m.hidden // m.heads
    why = torch_kernels_reason(head_dim)
    if not why:
        return
    key = "model.heads" if head_dim > MAX_HEAD_DIM else "model.name"
    fix = (f"use more heads (d' = hidden/heads <= {MAX_HEAD_DIM})" if key == "model.heads"
           else "install Triton (pytorch-triton-rocm)")
    raise ConfigError(f"config key '{key}': {why}, and on {device} {NO_SAMPLED_ADDMM}; {fix}")
