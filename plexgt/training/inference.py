"""Exact full-graph inference from a checkpoint: ``plexgt predict`` and ``plexgt evaluate``.

A checkpoint holds the model in the single-process model's form (:mod:`plexgt.training.
state`) and the computation's configuration (COMPLETE's ``config``), so any world size, grid
or strategy rebuilds the model and reads it, as ``--resume`` does; the layout is this job's
(``--grid``, ``--strategy``, ``--parallel.*``, else the plan's). Only the model's tensors are
read: not AdamW's moments (two thirds of a checkpoint), not the RNG.

The forward runs once, in eval mode (dropout off) under ``torch.inference_mode``: no autograd
graph, so each layer's input is freed as soon as the next layer has consumed it, and the
backward-only operators (the transposed adjacency blocks) are dropped before it runs.
Predictions leave the model's layout through one all-to-all (:func:`plexgt.parallel.
inference.to_id_blocks`) into blocks of the raw input's node order, which each rank writes
(:mod:`plexgt.data.predictions`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from plexgt import __version__
from plexgt.config import TrainConfig, read_config
from plexgt.data.loader import PreparedGraph
from plexgt.data.predictions import (
    Block,
    PredictionsFile,
    PredictionsWriter,
    Schema,
    node_id_base,
)
from plexgt.distributed.agree import agreed
from plexgt.distributed.bootstrap import DistContext, init_distributed
from plexgt.distributed.grid import block_bounds
from plexgt.errors import CheckpointError, ConfigError, DataError, UsageError
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.parallel.inference import (
    ShardIndex,
    capture,
    drop_backward,
    layer_names,
    resolve_layer,
    shard_index,
    split_shard,
    to_id_blocks,
)
from plexgt.plan.knobs import load_config
from plexgt.tasks.metrics import resolve_metric, task_roc_auc
from plexgt.tasks.task import Task, dataset_identity
from plexgt.training import checkpoint as ckpt
from plexgt.training import ownfiles
from plexgt.training.loop import autocast
from plexgt.training.numerics import apply_numerics

Tensor = torch.Tensor


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint: its directory's root, epoch and COMPLETE record."""

    root: Path
    epoch: int
    meta: dict[str, Any]

    @property
    def dir(self) -> Path:
        return ckpt.epoch_dir(self.root, self.epoch, ckpt.step_of(self.meta))


def find_checkpoint(path: str | Path) -> Checkpoint:
    """The checkpoint ``path`` names: an epoch's directory (``.../epoch_000042``), or a
    checkpoint directory (its newest complete epoch)."""
    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"{p}: no such checkpoint directory")
    marker = p / ckpt.COMPLETE
    if ownfiles.kind(marker) is not None:
        try:
            meta = json.loads(ownfiles.read_text(marker))
            epoch, step = ckpt.position(meta)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{marker}: corrupt checkpoint marker ({e})") from None
        if ckpt.epoch_dir(p.parent, epoch, step).name != p.name:
            raise CheckpointError(f"{marker}: records epoch {epoch}, not its directory's")
        return Checkpoint(p.parent, epoch, meta)
    found = ckpt.latest_complete(p)
    if found is None:
        raise CheckpointError(f"{p}: holds no complete checkpoint (an epoch_* directory with "
                              "COMPLETE, written by plexgt train --checkpoint-dir)")
    return Checkpoint(p, found[0], found[1])


def _dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(_dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


LAYOUT_PREFIX = "parallel."


def checkpoint_config(cp: Checkpoint, data: str, grid: str | None, strategy: str | None,
                      overrides: list[str] | None = None,
                      registry: StrategyRegistry | None = None) -> TrainConfig:
    """The run's configuration: the checkpoint's computation (model, numerics, seed), this
    job's data and layout. ``overrides`` (``--key=value``) may set ``parallel.*`` keys only:
    the rest would compute another model than the one trained."""
    for item in overrides or []:
        if not item.lstrip("-").startswith(LAYOUT_PREFIX):
            raise UsageError(f"{item}: the model and its numerics come from the checkpoint; "
                             f"only {LAYOUT_PREFIX}* keys can be set")
    tree = cp.meta.get("config")
    if not isinstance(tree, dict):
        raise CheckpointError(f"{cp.dir / ckpt.COMPLETE}: records no configuration")
    try:  # the checkpoint's keys alone first: what they lack or break is the checkpoint's
        read_config(None, _dotted(tree))
    except ConfigError as e:
        raise CheckpointError(f"{cp.dir}: its configuration does not load in plexgt "
                              f"{__version__} ({e})") from None
    flags = {**_dotted(tree), "data": data, "parallel.grid": grid,
             "parallel.strategy": strategy, "progress": False}
    return load_config(None, flags, overrides, registry)


def start_checkpoint_job(checkpoint: str, data: str, grid: str | None, strategy: str | None,
                         backend: str | None, overrides: list[str],
                         registry: StrategyRegistry | None = None
                         ) -> tuple[Checkpoint, TrainConfig, DistContext]:
    """What ``predict`` and ``evaluate --checkpoint`` start with, on every rank: the
    checkpoint found, the configuration it trained with on this job's data and layout
    (``backend``: one more ``parallel.backend`` override), its numerics and seed applied,
    and the process group up. Errors of the first two are agreed: one copy of the line."""
    cp = agreed(lambda: find_checkpoint(checkpoint))
    extra = [f"--parallel.backend={backend}"] if backend else []
    cfg = agreed(lambda: checkpoint_config(cp, data, grid, strategy, [*overrides, *extra],
                                           registry))
    apply_numerics(cfg)
    torch.manual_seed(cfg.seed)
    return cp, cfg, init_distributed(cfg.parallel.backend, cfg.parallel.timeout_s)


def check_checkpoint(cp: Checkpoint, cfg: TrainConfig, task: Task) -> None:
    """Refuse a checkpoint of another dataset (both named), of another node order where a
    node embedding's rows follow it, or of another format or configuration."""
    meta = cp.meta
    if meta.get("dataset") and task.dataset and meta["dataset"] != task.dataset:
        trained = meta.get("dataset_name") or "another dataset"
        raise CheckpointError(f"{cp.dir}: trained on {trained}; --data {task.dataset_name} "
                              "is another dataset")
    if task.node_order and meta.get("node_order") != task.node_order:
        raise CheckpointError(f"{cp.dir}: its node embedding's rows follow another prepared "
                              f"directory's node order than --data {cfg.data}'s; use the "
                              "directory it was trained on")
    ckpt.check_meta(cp.root, cp.epoch, meta, {"config_hash": cfg.hash(),
                                              "config": cfg.computation()})


def load_weights(cp: Checkpoint, cfg: TrainConfig, ctx: DistContext, task: Task) -> None:
    """Read the checkpoint's model (only its ``model/`` tensors) into ``task.model``'s
    parameters on this layout (collective; every check agreed by all ranks)."""
    agreed(lambda: check_checkpoint(cp, cfg, task), ctx.device)
    agreed(lambda: ckpt.verify_files(cp.root, cp.epoch, cp.meta), ctx.device)
    model = task.model
    params = {n: p.detach() for n, p in model.named_parameters()}
    template = {f"model/{k}": v for k, v in model.to_canonical(params).items()}
    state = agreed(lambda: ckpt.read_state(cp.root, cp.epoch, template,
                                           ckpt.step_of(cp.meta)), ctx.device)
    local = model.from_canonical({k.removeprefix("model/"): v for k, v in state.items()})
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(local[n])


@dataclass
class Inference:
    """One forward's outputs on this rank, as the model's layout holds them."""

    out: Tensor
    """The logits shard."""
    embedding: Tensor | None
    """The captured layer's output shard (None: none asked for)."""
    seconds: float


def infer(task: Task, ctx: DistContext, layer: str | None = None) -> Inference:
    """The forward in eval mode under ``torch.inference_mode`` (call inside one: the outputs
    are inference tensors), capturing ``layer``'s output (a resolved name) on the way."""
    task.model.eval()
    drop_backward(task.model)
    t0 = time.perf_counter()
    with capture(task.model, layer) as got, autocast(task, ctx.device):
        out = task.model(task.inputs)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    if layer is not None and got.value is None:
        raise RuntimeError(f"the forward never reached layer {layer}")
    return Inference(out, got.value, time.perf_counter() - t0)


def split_metrics(task: Task, out: Tensor) -> dict[str, float]:
    """The task's metric on every split, as ``plexgt train`` logs it (accuracy per split;
    exact ROC-AUC where the metric is ROC-AUC). Collective."""
    row: dict[str, float] = {}
    for split, (c, n) in task.correct(out).items():
        row[f"{split}_acc"] = c / max(1, n)
    for split, (s, y) in (task.scores(out) if task.scores is not None else {}).items():
        row[f"{split}_rocauc"] = task_roc_auc(s.cpu().numpy(), y.cpu().numpy())
    return row


def _float(t: Tensor) -> Tensor:
    """float32 or float64 (bfloat16 outputs of mixed-precision runs: float32)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def node_block(task: Task, pg: PreparedGraph, inf: Inference, layer: str | None,
               base: int) -> Block:
    """This rank's rows of the output file: nodes [lo, hi) = block rank of P of the original
    order, every column (collective: the all-to-alls of :func:`to_id_blocks`)."""
    device = inf.out.device
    n = pg.N
    idx = shard_index(task.model, pg, None, device)
    logits = to_id_blocks(_float(inf.out), idx, n)
    has0 = bool((idx.cols == 0).any())
    codes_idx = ShardIndex(idx.ids, torch.tensor([0 if has0 else -1], device=device), 1)
    codes = to_id_blocks(split_shard(task.model, pg, idx).to(torch.int64), codes_idx, n)
    p = dist.get_world_size() if dist.is_initialized() else 1
    lo, hi = block_bounds(n, p, dist.get_rank() if dist.is_initialized() else 0)
    cols: dict[str, np.ndarray] = {
        "node_id": np.arange(lo, hi, dtype=np.int64) + base,
        "split": codes[:, 0].to(torch.int8).cpu().numpy(),
    }
    if pg.multilabel:
        cols["prob"] = torch.sigmoid(logits).cpu().numpy()
    else:
        cols["pred"] = logits.argmax(dim=1).cpu().numpy().astype(np.int64)
    cols["logits"] = logits.cpu().numpy()
    if layer is not None and inf.embedding is not None:
        eidx = shard_index(task.model, pg, layer, device)
        cols["embedding"] = to_id_blocks(_float(inf.embedding).to(logits.dtype), eidx,
                                         n).cpu().numpy()
    return Block(lo, cols)


def write_block(writer: PredictionsWriter, block: Block, ctx: DistContext) -> None:
    """Every rank's block into ``writer``'s file: create (rank 0), write (all at once, or in
    rank order), assemble and rename (rank 0), each step agreed; after a failure anywhere
    rank 0 removes the temporaries, so nothing half-written is left."""
    rank0 = ctx.rank == 0
    try:
        agreed(lambda: writer.begin() if rank0 else None, ctx.device)
        if writer.sequential:
            for r in range(ctx.world_size):
                agreed(lambda r=r: writer.write(block) if ctx.rank == r else None, ctx.device)
        else:
            agreed(lambda: writer.write(block), ctx.device)
        agreed(lambda: writer.finish() if rank0 else None, ctx.device)
    except BaseException:
        if rank0:
            writer.discard()
        raise


def resolve_embeddings(task: Task, name: str | None) -> str | None:
    """``--embeddings``'s layer, resolved; UsageError listing the model's layers. ConfigError
    for a model whose outputs this plexgt cannot place (a family without an inference path
    yet), whatever ``name``."""
    try:
        layer_names(task.model)
    except ValueError as e:
        raise ConfigError(f"{e} (layout {task.grid} {task.strategy}); predict places the "
                          "outputs of gcn, gt and gps") from None
    if name is None:
        return None
    try:
        return resolve_layer(task.model, name)
    except ValueError as e:
        raise UsageError(f"--embeddings {name}: {e}") from None


def predictions_schema(task: Task, pg: PreparedGraph, cfg: TrainConfig, cp: Checkpoint,
                       layer: str | None, name: str | None) -> Schema:
    """The output's columns and the run's description stored with them."""
    dtype = "float64" if cfg.dtype == "float64" else "float32"
    width = 0
    if layer is not None:
        width = shard_index(task.model, pg, layer, torch.device("cpu")).width
    meta = {"plexgt_version": __version__, "checkpoint": str(cp.dir.resolve()),
            "epoch": cp.epoch, "model": cfg.model.name, "dataset": task.dataset,
            "dataset_name": task.dataset_name, "data": str(Path(cfg.data).resolve()),
            "metric": task.metric, "multilabel": pg.multilabel, "classes": pg.C,
            "split_index": pg.split,
            "node_id_base": node_id_base(pg), "embedding_layer": layer or "",
            "embedding_name": name or "", "layers": layer_names(task.model)}
    return Schema(pg.N, pg.C, pg.multilabel, dtype, width, meta)


def file_metric(f: PredictionsFile, pg: PreparedGraph, metric: str | None) -> str:
    """'acc' or 'rocauc' for a predictions file: ``metric`` ('auto', 'accuracy', 'rocauc')
    if given, else the one its run reported (its description), else the labels' default."""
    try:
        if metric is None and f.meta.get("metric") in ("acc", "rocauc"):
            return str(f.meta["metric"])
        return resolve_metric(metric or "auto", pg.C, pg.multilabel)
    except ValueError as e:
        raise UsageError(f"--metric: {pg.path}: {e}") from None


def evaluate_file(path: str | Path, data: str | Path, metric: str | None = None
                  ) -> dict[str, float]:
    """The metric per split of a predictions file against the prepared directory's labels
    and splits (read in the raw input's order), streamed a chunk of rows at a time: the
    accuracy of ``pred``, or the ROC-AUC of the logits (binary: logit 1 - logit 0). The file
    must be of this dataset: its N, its description's dataset (where it has one), its node
    ids in order and its split column must match (the stored split its run trained on, which
    its description names, of a directory holding several)."""
    pg = PreparedGraph(data)
    f = PredictionsFile(Path(path))
    k = f.meta.get("split_index")
    if isinstance(k, int) and k in pg.split_indices:  # the split the predicting run had
        pg.select_split(k)
    if f.n != pg.N:
        raise DataError(f"{f.path}: {f.n} rows, but {pg.path} has N={pg.N} nodes; "
                        "predictions of another dataset")
    ds = f.meta.get("dataset")
    if ds and ds != dataset_identity(pg):
        other = f.meta.get("dataset_name") or "another dataset"
        raise DataError(f"{f.path}: predictions of {other}, not of {pg.path}")
    m = file_metric(f, pg, metric)
    labels = pg.to_original(pg.read_labels(None, "Q"), "Q")
    masks = {s: pg.to_original(v, "Q") for s, v in pg.read_masks(None, "Q").items()}
    codes = np.zeros(pg.N, dtype=np.int8)
    for code, s in enumerate(("train", "valid", "test"), start=1):
        codes[masks[s]] = code
    base = node_id_base(pg)
    score_col = "logits" if "logits" in f.columns else "prob"
    cols = ["node_id", "split", "pred" if m == "acc" else score_col]
    counts = {s: [0, 0] for s in masks}
    scores: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {s: [] for s in masks}
    for lo, ch in f.chunks(cols):
        hi = lo + len(ch["node_id"])
        want = np.arange(lo, hi, dtype=np.int64) + base
        bad = np.flatnonzero(ch["node_id"] != want)
        if bad.size:
            i = int(bad[0])
            raise DataError(f"{f.path}: row {lo + i} holds node {int(ch['node_id'][i])}, not "
                            f"{int(want[i])}: not plexgt's node id order")
        bad = np.flatnonzero(ch["split"] != codes[lo:hi])
        if bad.size:
            i = int(bad[0])
            names = ("none", "train", "valid", "test")
            raise DataError(f"{f.path}: node {int(want[i])} is in split "
                            f"{names[ch['split'][i]]}, {pg.path} puts it in "
                            f"{names[codes[lo + i]]}; predictions of another dataset or split")
        for s, mask in masks.items():
            mk = mask[lo:hi]
            y = labels[lo:hi][mk]
            if m == "acc":
                counts[s][0] += int((ch["pred"][mk] == y).sum())
                counts[s][1] += int(mk.sum())
            else:
                z = ch[score_col][mk].astype(np.float64)
                scores[s].append((z if pg.multilabel else z[:, 1] - z[:, 0], y))
    if m == "acc":
        return {f"{s}_acc": c / max(1, n) for s, (c, n) in counts.items()}
    out = {}
    for s, parts in scores.items():
        z = np.concatenate([a for a, _ in parts]) if parts else np.zeros(0)
        y = np.concatenate([b for _, b in parts]) if parts else np.zeros(0, dtype=np.int64)
        out[f"{s}_rocauc"] = task_roc_auc(z, y)
    return out
