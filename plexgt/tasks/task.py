"""What the training loop runs, and how a run's configuration becomes the planners' inputs.

A :class:`Task` is a distributed model bound to this rank's data: the loop only calls
``model(inputs)``, ``loss(out)`` and ``correct(out)``, whatever the model family or layout.
The helpers here turn the configuration and a prepared graph into the sizes, model shape and
machine coefficients that :mod:`plexgt.plan.choose` takes, read once per task build.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from plexgt.config import TrainConfig
from plexgt.data.loader import PreparedGraph
from plexgt.distributed.collectives import CommLedger
from plexgt.errors import ConfigError
from plexgt.models.registry import default_registry
from plexgt.models.spec import ModelSpec
from plexgt.ops.attention import sampled_addmm_available
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.plan.agp import SystemModel
from plexgt.plan.balance import Balance
from plexgt.plan.calibrate import applies as calibration_applies
from plexgt.plan.calibrate import calibration
from plexgt.plan.choose import GraphSizes, ModelShape, RunPlan, choose
from plexgt.plan.machine import usable_memory
from plexgt.plan.plexus_cost import Coefficients
from plexgt.plan.profile import read_profile
from plexgt.tasks.metrics import resolve_metric

Tensor = torch.Tensor
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.float32}
"""Storage dtype of parameters, optimizer state and inputs per configured ``dtype``: a
bfloat16 run keeps float32 masters and computes in bfloat16 under autocast (:data:`AMP`)."""
AMP = {"bfloat16": torch.bfloat16}
"""Compute dtype of the mixed-precision ``dtype`` settings."""

LossFn = Callable[[Tensor], Tensor]
"""loss(out) -> replicated scalar (mean cross-entropy over the training nodes; multi-label
tasks: mean per-task binary cross-entropy over their labelled pairs)."""
CorrectFn = Callable[[Tensor], dict[str, tuple[int, int]]]
"""correct(out) -> {split: (correct, total)} summed over all ranks ({} for multi-label
tasks, which have no accuracy)."""
ScoresFn = Callable[[Tensor], dict[str, tuple[Tensor, Tensor]]]
"""scores(out) -> {split: (score [k], label [k])} of every labelled node, on every rank
(binary tasks: what an exact ROC-AUC ranks; multi-label ones: [k, T] each)."""


@dataclass
class Task:
    """A distributed model bound to this rank's data, as the loop sees it."""

    model: nn.Module
    inputs: Tensor
    """This rank's input shard."""
    loss: LossFn
    correct: CorrectFn
    ledger: CommLedger
    grid: str
    """The layout as the metrics name it ('2x2x1', 'rows4')."""
    strategy: str
    """'plexus3d', 'gp_ag', 'gp_a2a', or a strategy '+plexus3d' (gps on a 3D GCN path)."""
    bytes_read: int = 0
    """Payload bytes this rank read from the prepared directory."""
    amp: torch.dtype | None = None
    """Autocast dtype of forward and loss (bfloat16 runs), None for plain precision."""
    metric: str = "acc"
    """'acc' or 'rocauc': the metric reported per split and chosen on (its key suffix)."""
    scores: ScoresFn | None = None
    """Binary tasks' gathered scores (for ROC-AUC); None where the metric is accuracy."""
    node_order: str = ""
    """With a node embedding: :func:`node_order` of the data (checked on resume)."""
    dataset: str = ""
    """:func:`dataset_identity` of the data (checked on resume, whatever the model)."""
    dataset_name: str = ""
    """How a message names the data: the prepared directory and the dataset's name."""
    plan: RunPlan | None = None
    """The layout :func:`run_plan` chose, with its predicted step time and memory."""
    steps: Callable[[int], int] | None = None
    """Batch-trained models (hgt): the optimizer steps of an epoch (epoch -> count); None for
    the full-graph models, whose epoch is one step of ``model(inputs)``."""
    train_step: Callable[[int, int], Tensor] | None = None
    """Batch-trained models: (epoch, step) -> the step's loss (replicated), its forward and
    backward run and every gradient summed over the ranks that hold a copy, the optimizer
    step left to the loop (which clips and steps as for every model)."""
    evaluate: Callable[[], dict[str, tuple[int, int]]] | None = None
    """Batch-trained models: {split: (correct, total)} over every labelled node, summed over
    all ranks (what ``correct(model(inputs))`` is for the full-graph models)."""


def task_metric(cfg: TrainConfig, pg: PreparedGraph) -> str:
    """The run's metric key ('acc' or 'rocauc'); ConfigError when the labels cannot have it."""
    try:
        return resolve_metric(cfg.metric, pg.C, pg.multilabel)
    except ValueError as e:
        raise ConfigError(f"config key 'metric': {pg.path}: {e}") from None


def check_inputs(cfg: TrainConfig, pg: PreparedGraph) -> None:
    """ConfigError when the model would have no input: a featureless graph needs a node
    embedding."""
    if pg.F == 0 and cfg.model.node_embedding <= 0:
        raise ConfigError(f"{pg.path}: the prepared graph has no node features; train a node "
                          "embedding (--model.node_embedding=64) or prep with --features")
    if pg.sparse_features and cfg.model.node_embedding > 0:
        raise ConfigError(f"{pg.path}: a node embedding joins dense input features; these are "
                          "stored sparse (prep with --sparse-features no to combine them)")
    if cfg.model.node_embedding < 0:
        raise ConfigError(f"config key 'model.node_embedding': {cfg.model.node_embedding} is "
                          "negative")


def graph_sizes(pg: PreparedGraph, embedding: int = 0) -> GraphSizes:
    """The planners' view of a prepared graph: its manifest's numbers, the input widened by
    a node embedding of ``embedding`` columns."""
    density = (int(pg.manifest.get("feature_nnz", 0)) / max(1, pg.N * pg.F)
               if pg.sparse_features else None)
    return GraphSizes(pg.N, pg.E, pg.F + embedding, max(1, pg.C), pg.self_loops, density,
                      Balance.from_manifest(pg.manifest))


def node_order(pg: PreparedGraph) -> str:
    """The identity of the prepared directory's node order (its nodes.h5 checksum): a node
    embedding's checkpointed rows follow that order."""
    return str(pg.manifest.get("files", {}).get("nodes.h5", {}).get("sha256", ""))


def dataset_identity(pg: PreparedGraph) -> str:
    """What the prepared data is a graph of, whatever its node order: the sha256 of the
    manifest's sizes (N, E, F, C, FE), label kind, name and source (``params["source"]``:
    format, input and the options that shape the graph). Re-prepping the same input with
    another permutation keeps it; another graph, even of the same F and C, changes it."""
    m = pg.manifest
    keys = {k: m.get(k) for k in ("N", "E", "F", "C", "FE", "multilabel", "name")}
    keys["source"] = m.get("params", {}).get("source")
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()


def dataset_name(pg: PreparedGraph) -> str:
    """The prepared directory and the dataset's name, for messages."""
    return f"{pg.path} ({pg.manifest.get('name', '?')})"


def model_spec(cfg: TrainConfig) -> ModelSpec:
    """The configured model's registry entry."""
    try:
        return default_registry().get(cfg.model.name)
    except KeyError as e:
        raise ConfigError(f"config key 'model.name': {e.args[0]}") from None


def memory_limit(cfg: TrainConfig, device: torch.device | None = None) -> int | None:
    """Bytes one rank may use: parallel.memory_per_rank_gb, else what a plan may fill of the
    GPU (parallel.gpu_memory_fraction of its memory less parallel.gpu_memory_reserve_gb:
    :func:`plexgt.plan.machine.usable_memory`; the whole of it OOMs, the memory model counting
    tensors only), else (CPU ranks) no limit."""
    if cfg.parallel.memory_per_rank_gb > 0:
        return int(cfg.parallel.memory_per_rank_gb * 2**30)
    if device is not None and device.type == "cuda":
        return usable_memory(torch.cuda.get_device_properties(device).total_memory,
                             cfg.parallel.gpu_memory_fraction,
                             cfg.parallel.gpu_memory_reserve_gb)
    return None


def run_plan(cfg: TrainConfig, pg: PreparedGraph, world_size: int,
             device: torch.device | None = None,
             registry: StrategyRegistry | None = None, inference: bool = False) -> RunPlan:
    """The run's layout on ``world_size`` ranks (:func:`plexgt.plan.choose.choose`): the
    configured values, the plan's where they are left open (``inference``: priced for one
    forward pass, ``plexgt predict``'s). The same on every rank, since it reads only sizes,
    the config and the profile."""
    prof, source = planning_profile(cfg, device)
    rp = choose(graph_sizes(pg, cfg.model.node_embedding), ModelShape.of(cfg, inference),
                world_size, system_model_for(prof, device), plexus_coefficients_for(prof),
                memory_limit(cfg, device), cfg.parallel.strategy, cfg.parallel.grid,
                cfg.parallel.head_parallel, registry=registry,
                batch_table=(prof or {}).get("batch")).plan
    return replace(rp, coefficients=source)


def machine_profile(cfg: TrainConfig) -> dict[str, Any] | None:
    """parallel.profile read and validated, or None when none is configured."""
    return read_profile(cfg.parallel.profile) if cfg.parallel.profile else None


def planning_profile(cfg: TrainConfig, device: torch.device | None = None
                     ) -> tuple[dict[str, Any] | None, str]:
    """(the coefficients a run plans with, where they come from): parallel.profile read and
    validated; without one, on a CPU host, its quick calibration (:mod:`plexgt.plan.
    calibrate`: rank 0's, cached or measured, sent to every rank so that all plan alike);
    else None, the defaults."""
    if cfg.parallel.profile:
        return machine_profile(cfg), f"profile {cfg.parallel.profile}"
    if not cfg.parallel.calibrate or not calibration_applies(device):
        return None, "default coefficients"
    got: list[Any] = [None, "default coefficients (the quick calibration failed)"]
    many = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if not many or dist.get_rank() == 0:
        try:
            cal = calibration()
            got = [cal.profile, cal.describe()]
        except Exception as e:  # noqa: BLE001 -- a plan with defaults beats a failed run
            got[1] = f"default coefficients (the quick calibration failed: {e})"
    if many:
        dist.broadcast_object_list(got, src=0)
    return got[0], got[1]


def plexus_coefficients_for(prof: dict[str, Any] | None) -> Coefficients:
    """The 3D cost model's machine coefficients: the profile's, or the defaults without one."""
    return Coefficients.from_profile(prof)


def system_model_for(prof: dict[str, Any] | None, device: torch.device | None = None
                     ) -> SystemModel:
    """AGP's machine coefficients: the profile's, or the defaults without one; on a
    ``device`` without torch's sparse SDDMM (a ROCm GPU) marked so, whatever the profile
    says, so the plan never chooses a strategy that needs it
    (:func:`plexgt.plan.agp.unsupported`)."""
    sysm = SystemModel.from_profile(prof) if prof else SystemModel()
    if device is not None and not sampled_addmm_available(device):
        sysm = replace(sysm, host=replace(sysm.host, rocm=True))
    return sysm
