"""Run configuration: frozen dataclasses, one TOML file per run, ``--key=value`` overrides.

Precedence: defaults < TOML file < command-line flags < ``--key=value`` overrides. Every key is
checked: an unknown key or a value of the wrong type is a one-line error naming it. The
resolved configuration is logged by rank 0 and stored with every checkpoint (with its hash, so
a resume under a different configuration is refused rather than silently mixed).

A file may also hold a ``[recipe]`` table (:data:`RECIPE_TABLE`): what the configuration
reproduces (dataset, prep command, split file, published result, source), for people and for
``perf/train_reference.py --recipes``. It is description, not configuration: :func:`read_config`
sets nothing from it, so a recipe trains exactly as its other keys say (``configs/``).

Why this module imports nothing of plexgt but its errors: it is the bottom schema every layer
reads (``plexgt train`` and ``plexgt plan`` build the same record from the same defaults).
The checks that need a layer above it (a strategy the registry knows, a grid that parses, a
profile that reads) are :func:`plexgt.plan.knobs.check_config`'s; :func:`read_config` here
checks what the schema alone can.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from plexgt.errors import ConfigError

ELEMENT_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2}
"""Bytes per activation element of each ``dtype`` (bfloat16 keeps float32 master weights but
its activations and their collectives are 2 bytes): the one table the planners' memory and
traffic models and the task's memory check count with."""
GPU_MEMORY_FRACTION = 0.9
"""Share of a GPU's memory a plan may fill. The memory model counts tensors; the caching
allocator rounds and caches blocks (fragmentation), and cuBLAS / cuSPARSE take workspaces
per call, neither of which it prices: a plan at 95-100 % of an A100-40GB's memory OOMs."""
GPU_MEMORY_RESERVE_GIB = 1.5
"""GiB of a GPU gone before the first tensor, taken off after the fraction: the CUDA context
(about 0.3-0.6 GiB on A100 / H100 with lazy module loading) and NCCL's communicators, which
plexgt creates eagerly (``device_id``): the world's, up to six grid groups and gp_2d's two,
each holding NCCL_BUFFSIZE (4 MiB by default, NCCL's environment documentation) per channel,
peer and protocol, of the order of 100 MiB a communicator. An estimate, not a measurement: a
GPU run's metrics measure it (``peak_device_mem_bytes - peak_mem_bytes``); a machine
description or ``parallel.gpu_memory_reserve_gb`` replaces it."""


@dataclass(frozen=True)
class ModelConfig:
    """The network."""

    name: str = "gcn"
    """The model, by its registry name (``--model``'s choices; plexgt/models/registry.py
    lists them, docs/training.md describes them)."""
    hidden: int = 128
    """Hidden width d."""
    layers: int = 2
    """Number of layers (gcn) or blocks (gt, gps)."""
    heads: int = 4
    """Attention heads h (gt, gps); d' = d / h."""
    ffn_mult: int = 2
    """Width of each block's feed-forward layer in units of d (gt, gps)."""
    dropout: float = 0.5
    """Dropout probability on hidden activations."""
    input_dropout: float = 0.5
    """Dropout probability on the input features."""
    super_nodes: int = 0
    """Global super nodes S (gt, gps): learned virtual nodes every node attends to and that
    attend to every node, exactly; replicated on every rank, merged by all-reduce."""
    edge_bias: bool = True
    """gt, gps: when the prepared graph has edge features, each block's attention adds a
    learned per-head bias W_b·x_e to every edge's score (false: the features are unused)."""
    node_embedding: int = 0
    """D > 0: a learnable [N, D] node embedding appended to the input features (graphs without
    features, or with weak ones), sharded with the input on every layout; 0: none."""
    residual: str = "none"
    """grid3d models (gcn, sage, mlp): 'none', 'identity' (each layer adds its input; a
    learned projection where the input's width differs, the first layer on raw features, a
    last layer to the classes) or 'linear' (adds a learned Linear of its input: tunedGNN's
    ``conv(x) + lin(x)``). gt and gps blocks always add their input."""
    norm: str = "auto"
    """'layer' (LayerNorm), 'batch' (BatchNorm, full-graph batch statistics in training,
    running statistics in evaluation) or 'none', over the hidden dim: after every hidden
    layer (grid3d models) or in place of each block's LayerNorms (gt, gps). 'auto': 'layer'
    for models with attention, 'none' for grid3d ones. Exact on every layout: the statistics
    are all-reduced over the ranks that split the dim they run over."""
    pre_norm: bool = False
    """Pre-norm (the norm and ReLU before each layer, the residual stream left raw; gt/gps:
    x + f(norm(x)) and a final norm before the classifier), which trains deep stacks; false:
    post-norm (norm after the residual sum)."""
    jk: str = "none"
    """Jumping knowledge: the classifier reads 'cat' (concatenation), 'max' (elementwise
    maximum) or 'sum' of every layer's (block's) output instead of the last; grid3d models
    need ``model.head``."""
    input_proj: bool = False
    """grid3d models: a Linear F -> hidden before the first layer (tunedGNN's pre_linear), so
    every graph layer is hidden -> hidden. gt and gps always project their input."""
    head: bool = False
    """grid3d models: a Linear hidden -> classes after the last layer (tunedGNN's
    classifier), which then ends in ``hidden``; false: the last layer outputs the classes.
    gt and gps always end in a linear classifier."""
    init: str = "torch"
    """grid3d models: 'torch' (every Linear as nn.Linear draws it: uniform within
    1/sqrt(fan_in), weights and biases) or 'glorot' (the graph layers' weights Glorot-uniform
    and their biases zero, as PyG's GCNConv: tunedGNN's GCN; the residual, input and head
    Linears stay torch's). Measured on Amazon Photo (tunedGNN's 6-layer residual LN GCN, lr
    1e-3): 85 % validation accuracy at epoch 51 with 'glorot', 47 % with 'torch'."""
    checkpoint: str = "none"
    """Activation checkpointing: 'block' keeps only each block's input (a grid3d model's
    layer, with its norm and residual; a gt / gps block) for backward and runs the block's
    forward again, collectives included, when its gradient is needed: activation memory
    falls from L blocks' to L inputs plus one block's, for one more forward of compute and
    communication a step (the planner prices both). The results are the same (dropout masks
    are counter-based, BatchNorm's running statistics updated once); 'none': every
    activation kept."""

    def norm_kind(self, attention: bool) -> str:
        """``norm`` with 'auto' resolved for a model with (gt, gps) or without (the grid3d
        models) attention: 'layer' or 'none'. The caller knows which from the model's spec
        (this schema knows no model but by name)."""
        if self.norm != "auto":
            return self.norm
        return "layer" if attention else "none"


@dataclass(frozen=True)
class OptimConfig:
    """AdamW; the learning rate of each epoch follows ``schedule`` and is never above ``lr``."""

    lr: float = 0.01
    """Peak learning rate (the rate of every epoch under schedule 'constant')."""
    weight_decay: float = 5e-4
    """AdamW decoupled weight decay."""
    warmup_epochs: int = 10
    """Epochs of linear warm-up from lr/10 (schedule 'cosine')."""
    min_lr: float = 1e-4
    """Learning rate at the last epoch (schedule 'cosine'); taken as lr where it is above it,
    so a small lr is never raised (the rate then stays at lr after the warm-up)."""
    schedule: str = "cosine"
    """'cosine' (warm-up to lr, then cosine decay to min_lr) or 'constant' (lr at every
    epoch: no warm-up, no decay)."""
    name: str = "adamw"
    """'adamw' (decoupled weight decay) or 'adam' (weight decay as an L2 term of the
    gradient: tunedGNN's torch.optim.Adam)."""
    decay: str = "all"
    """Which parameters weight decay shrinks: 'all', or 'weights' (weight matrices only, not
    biases and norm parameters)."""
    clip_norm: float = 0.0
    """> 0: clip the gradient to this global 2-norm (over every parameter of the whole model,
    each element counted once whatever the layout); 0: no clipping."""


@dataclass(frozen=True)
class ParallelConfig:
    """How the model is spread over the ranks."""

    grid: str = "auto"
    """'auto' (the planner's choice) or 'GxxGyxGz' for 3D aggregation."""
    strategy: str = "auto"
    """Attention strategy (gt, gps): 'auto' (the plan's choice) or a name of the attention
    registry (``plexgt plan --help`` lists them; docs/planner.md says how each splits the
    work): the names of plan and metrics."""
    head_parallel: int = 0
    """Strategies with a head axis: ranks a of that axis (a divisor of the world size;
    consecutive ranks, so a node's GPUs when a divides the GPUs per node); 0 = the plan's."""
    ring_chunks: int = 0
    """Ring strategies: pieces each rank's K/V block travels in; c pieces hold 1/c of the
    block in flight for c times the messages. 0 = the plan's (1, or more where the memory
    per rank needs them)."""
    attention_block_rows: int = 0
    """Strategies without a ring: query rows per attention block; blocked, a layer keeps the
    [h, rows] log-sum-exp instead of the [h, E] probabilities and rebuilds scores in backward
    (one more SDDMM for [h, E_block] of memory). 0 = the plan's (whole, or blocks where the
    memory per rank needs them)."""
    block_rows: int = 0
    """Rows per aggregation block (overlap of SpMM and all-reduce); 0 = the plan's (the cost
    model's rows, or whole)."""
    memory_per_rank_gb: float = 0.0
    """GiB one rank may use: what the plan predicts above it is never chosen. 0 = what a plan
    may fill of the GPU on GPUs (``gpu_memory_fraction`` of it less ``gpu_memory_reserve_gb``),
    no limit on CPUs."""
    gpu_memory_fraction: float = GPU_MEMORY_FRACTION
    """GPUs, memory_per_rank_gb 0: the share of the GPU's memory a plan may fill (the rest is
    the allocator's fragmentation and the libraries' workspaces, which the memory model does
    not count), in (0, 1]."""
    gpu_memory_reserve_gb: float = GPU_MEMORY_RESERVE_GIB
    """GPUs, memory_per_rank_gb 0: GiB taken off after the fraction for what exists before
    any tensor, the CUDA context and NCCL's communicators (an estimate:
    :data:`GPU_MEMORY_RESERVE_GIB`; a GPU run's metrics measure it)."""
    axis_order: str = "auto"
    """Which grid axis is innermost in the rank numbering (consecutive ranks, so one node's
    GPUs: NVLink, xGMI), then the next: 'yxz' (Plexus's, the default order), 'xyz', ...; or
    'auto', the plan's (searched where a machine description gives the placement, else yxz).
    The results are the same under every order; the collectives' cost is not."""
    gcn_order: str = "auto"
    """GCN layer order: 'aggregate_first' (Â·H)·W, 'gemm_first' Â·(H·W), or 'auto' (GEMM
    first where a layer narrows, so the SpMM runs on the narrower width; same results)."""
    backend: str = "auto"
    """'auto' (nccl on GPUs, gloo on CPUs), 'nccl' or 'gloo'."""
    timeout_s: float = 300.0
    """Collective timeout: a lost rank becomes an error after this long, never a hang."""
    profile: str = ""
    """System profile JSON (``plexgt profile``) that grid 'auto' and strategy 'auto' plan
    with; empty = on a CPU host a quick calibration of it (seconds, cached per host), on GPUs
    built-in default coefficients, which may misjudge a machine."""
    calibrate: bool = True
    """Without a profile on a CPU host, plan with a quick calibration of it (measured once,
    cached in ~/.cache/plexgt); false = default coefficients (as ``PLEXGT_NO_CALIBRATE=1``)."""
    dp: str = "auto"
    """hgt: data-parallel replicas P_dp of the (pp x cp) mesh, each on its own batches, the
    gradients all-reduced; 'auto' = the plan's, else an integer."""
    pp: str = "auto"
    """hgt: pipeline stages P_pp (consecutive layers per stage, GPipe micro-batches); 'auto'
    = the plan's, else an integer."""
    cp: str = "auto"
    """hgt: context-parallel ranks P_cp splitting each batch's sequence (ring-rotated K/V
    blocks, the attention bias's columns sliced to the block that arrived); 'auto' = the
    plan's, else an integer dividing ``batch.size``."""
    stages: str = "auto"
    """hgt: layers per pipeline stage, comma-separated ('3,7,7,7': the first stage, which
    holds the embedding table and the batch's construction, takes fewer); they sum to
    ``model.layers`` and each is >= 1. 'auto' = the plan's partition."""
    micro_batches: int = 0
    """hgt: GPipe micro-batches K per step: a replica's share of ``batch.sequences`` split K
    ways (the gradient is the whole step's whatever K); 0 = the plan's."""


@dataclass(frozen=True)
class BatchConfig:
    """Node batches of the hierarchical graph transformer (hgt), which attends densely over
    a sequence of target nodes, their sampled context and learned global nodes instead of
    over the whole graph's edges (the other models train full-graph and ignore this table).

    A step is ``sequences`` sequences, the same whatever the layout: data-parallel replicas
    take disjoint shares of them, pipeline micro-batches split a replica's share, context
    parallelism splits each sequence, so every layout computes the single process's step."""

    targets: int = 256
    """Training nodes per sequence (an epoch's last sequences take what is left)."""
    size: int = 1024
    """Sequence length N': the targets followed by context nodes sampled from their
    neighbourhoods (``context``); context parallelism splits it over ``parallel.cp`` ranks,
    so it must be a multiple of cp."""
    sequences: int = 1
    """Sequences per optimizer step, over all replicas: ``parallel.dp`` divides it, and
    ``parallel.micro_batches`` divides its share per replica. The loss is the mean over every
    target of the step."""
    context: str = "hop2"
    """Where context nodes come from: 'hop1' (in-neighbours of the targets) or 'hop2'
    (in-neighbours and theirs), drawn uniformly by a counter-based RNG of (seed, epoch,
    sequence), so every layout draws the same sequences; a sequence whose neighbourhoods hold
    fewer than ``size`` nodes fills up with uniformly drawn nodes."""
    global_nodes: int = 1
    """Learned global nodes N_s joined to every sequence (replicated on the context-parallel
    ranks); 0: none."""


@dataclass(frozen=True)
class TrainConfig:
    """One training run."""

    data: str = ""
    """Prepared directory (``plexgt prep``)."""
    split_index: int | str = "default"
    """Which of the directory's stored splits trains and evaluates: 'default' (the one prep
    kept; split 0 of a ``prep --split-index all`` directory), an index it holds, or 'all': one
    complete run per stored split, reported as mean ± std (``plexgt train`` only; each run's
    outputs get ``split<k>`` in their paths, as ``--seeds``' get ``seed<k>``)."""
    epochs: int = 200
    """Epochs to train (a resumed run continues up to this count)."""
    eval_every: int = 1
    """Evaluate train/valid/test accuracy every this many epochs."""
    patience: int = 0
    """> 0: early stopping: stop once this many epochs have passed since the best validation
    epoch (evaluations every ``eval_every``), the model then restored to that epoch's state;
    0: run to ``epochs``."""
    metric: str = "auto"
    """'auto' (ROC-AUC for two classes, else accuracy), 'accuracy' or 'rocauc': reported per
    split in the metrics and the final line; the best validation epoch is chosen on it."""
    seed: int = 0
    """Seed of initialisation, dropout and everything random."""
    deterministic: bool = False
    """Deterministic kernels: a resumed run reproduces the uninterrupted losses exactly."""
    dtype: str = "float32"
    """'float32', 'float64', or 'bfloat16': mixed precision, float32 master weights,
    optimizer state, softmax statistics, loss and sparse sums, bfloat16 GEMMs, activations
    and their collectives."""
    tf32: bool = False
    """TF32 tensor cores for float32 GEMMs on GPUs that have them (A100, H100): faster, 10-bit
    mantissa products. Off under ``deterministic``."""
    metrics: str = ""
    """JSONL file of per-epoch metrics (rank 0); empty = none."""
    tensorboard: str = ""
    """Directory of TensorBoard event files with the same per-epoch scalars (rank 0; needs the
    ``tensorboard`` extra); empty = none."""
    checkpoint_dir: str = ""
    """Directory of checkpoints; empty = no checkpoints."""
    checkpoint_every: int = 0
    """Checkpoint every K epochs (0 = only on SIGTERM/SIGUSR1 and at the end)."""
    checkpoint_every_steps: int = 0
    """Batch-trained models (hgt): also checkpoint every K optimizer steps inside an epoch
    (0 = none; SIGTERM/SIGUSR1 checkpoint between steps regardless). For epochs longer than
    the time a failed node may cost; not part of the computation (hash)."""
    resume: bool = False
    """Continue from the latest complete checkpoint in ``checkpoint_dir``."""
    stop_after: int = 0
    """Stop (with a checkpoint, as on SIGUSR1) after this epoch; 0 = run to ``epochs``.
    For allocations shorter than the run: the schedule still spans ``epochs``."""
    progress: bool = True
    """Progress bar on rank 0 (stderr)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The network."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimiser."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """The distribution."""
    batch: BatchConfig = field(default_factory=BatchConfig)
    """Node batches (hgt)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def esize(self) -> int:
        """Bytes per activation element of ``dtype`` (:data:`ELEMENT_BYTES`)."""
        return ELEMENT_BYTES[self.dtype]

    def computation(self) -> dict[str, Any]:
        """The keys that determine the computation: not paths, the epoch count (a run may be
        extended on resume), bookkeeping, or the layout (``parallel``: every grid, world size
        and strategy computes the same model, and checkpoints are layout-independent). A
        resume must match them (:meth:`hash`)."""
        d = self.to_dict()
        for dotted, old in ADDED_LATER.items():
            table, _, key = dotted.rpartition(".")
            node = d[table] if table else d
            if node[key] == old:
                node.pop(key)
        for k in ("data", "metrics", "tensorboard", "checkpoint_dir", "checkpoint_every",
                  "checkpoint_every_steps", "resume", "progress", "eval_every", "stop_after",
                  "epochs", "parallel", "patience"):
            d.pop(k)
        d["model"].pop("checkpoint")  # recomputation computes the same model
        if d["batch"] == dataclasses.asdict(BatchConfig()):
            d.pop("batch")  # added later: the full-graph models' hashes stay what they were
        return d

    def hash(self) -> str:
        """Hash of :meth:`computation`."""
        return hashlib.sha256(json.dumps(self.computation(), sort_keys=True).encode()
                              ).hexdigest()[:16]


ADDED_LATER = {"optim.schedule": "cosine", "optim.name": "adamw", "optim.decay": "all",
               "optim.clip_norm": 0.0, "model.residual": "none", "model.norm": "auto",
               "model.pre_norm": False, "model.jk": "none", "model.input_proj": False,
               "model.head": False, "model.init": "torch", "split_index": "default"}
"""Keys added after checkpoints first recorded their configuration, with the value that
computes what runs before them computed: :meth:`TrainConfig.computation` leaves them out at
that value, so the hash of such a configuration, and the checkpoints that record it, stay
what they were (a resume of them is not refused as another configuration)."""

SPLIT_WORDS = ("default", "all")
"""The words ``split_index`` takes besides an index."""

CHOICES = {
    "metric": ("auto", "accuracy", "rocauc"),
    "optim.schedule": ("cosine", "constant"),
    "model.residual": ("none", "identity", "linear"),
    "model.norm": ("auto", "none", "layer", "batch"),
    "model.jk": ("none", "cat", "max", "sum"),
    "model.init": ("torch", "glorot"),
    "model.checkpoint": ("none", "block"),
    "optim.name": ("adamw", "adam"),
    "optim.decay": ("all", "weights"),
    "parallel.gcn_order": ("auto", "aggregate_first", "gemm_first"),
    "parallel.backend": ("auto", "nccl", "gloo"),
    "batch.context": ("hop1", "hop2"),
    "dtype": tuple(ELEMENT_BYTES),
}
"""The keys whose values the schema lists (``model.name``'s are the model registry's and
``parallel.strategy``'s the attention registry's, checked by :func:`plexgt.plan.knobs.
check_config`)."""


INT_OR_WORD = int | str
"""A key that is a number or a word (``split_index``: 3 or 'all')."""


def _coerce(key: str, typ: Any, value: Any) -> Any:
    if typ == INT_OR_WORD:
        if isinstance(value, str):
            text = value.strip()
            return int(text) if re.fullmatch(r"[+-]?\d+", text) else text
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}': {value!r} is not a number or a word")
    if isinstance(value, str) and typ is not str:
        text = value.strip()
        try:
            if typ is bool:
                if text.lower() in ("1", "true", "yes", "on"):
                    return True
                if text.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            return typ(text)
        except ValueError:
            raise ConfigError(f"config key '{key}': {value!r} is not a {typ.__name__}") from None
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ConfigError(f"config key '{key}': {value!r} is not a {typ.__name__}")
    return value


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    hints = get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    for k in values:
        if k not in names:
            raise ConfigError(f"unknown config key '{prefix}{k}'")
    kwargs = {}
    for f in fields(cls):
        if f.name not in values:
            continue
        typ = hints[f.name]
        v = values[f.name]
        if dataclasses.is_dataclass(typ):
            if not isinstance(v, dict):
                raise ConfigError(f"config key '{prefix}{f.name}' must be a table")
            kwargs[f.name] = _build(typ, v, f"{prefix}{f.name}.")
        else:
            kwargs[f.name] = _coerce(prefix + f.name, typ, v)
    return cls(**kwargs)


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config key '{dotted}': '{p}' is not a table")
    node[parts[-1]] = value


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


RECIPE_TABLE = "recipe"
"""The table of a config file that describes what it reproduces (module docstring); ignored
by :func:`read_config`, read by :func:`read_recipe`."""


def read_toml(p: Path) -> dict[str, Any]:
    """The config file ``p``'s tree; ConfigError naming it when it is missing or not TOML."""
    try:
        return tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML ({e})") from None


def read_recipe(path: str | Path) -> dict[str, Any]:
    """The ``[recipe]`` table of the config file ``path`` ({} when it has none)."""
    p = Path(path)
    recipe = read_toml(p).get(RECIPE_TABLE, {})
    if not isinstance(recipe, dict):
        raise ConfigError(f"{p}: '{RECIPE_TABLE}' must be a table")
    return recipe


def read_config(path: str | Path | None = None, flags: dict[str, Any] | None = None,
                overrides: list[str] | None = None) -> TrainConfig:
    """Resolve a :class:`TrainConfig` from a TOML file, flags ({dotted key: value}) and
    ``key=value`` override strings (dotted keys, e.g. ``model.hidden=256``), checked as far as
    the schema can (:func:`validate`); a run loads it through :func:`plexgt.plan.knobs.
    load_config`, which adds the layout's checks."""
    tree: dict[str, Any] = {}
    if path:
        tree = read_toml(Path(path))
        if isinstance(tree.get(RECIPE_TABLE), dict):  # description, not configuration
            tree.pop(RECIPE_TABLE)
    extra: dict[str, Any] = {}
    for k, v in (flags or {}).items():
        if v is not None:
            _set(extra, k, v)
    for item in overrides or []:
        key, sep, value = item.lstrip("-").partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form --key=value")
        _set(extra, key.replace("-", "_"), value)
    cfg = _build(TrainConfig, _merge(tree, extra), "")
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Value checks that types cannot express and the schema alone can make."""
    d = cfg.to_dict()
    for key, allowed in CHOICES.items():
        node: Any = d
        for p in key.split("."):
            node = node[p]
        if node not in allowed:
            raise ConfigError(f"config key '{key}': {node!r} is not one of {', '.join(allowed)}")
    m = cfg.model
    if m.hidden < 1 or m.layers < 1 or m.heads < 1 or m.ffn_mult < 1:
        raise ConfigError("config keys model.hidden, model.layers, model.heads, model.ffn_mult "
                          "must be >= 1")
    if m.node_embedding < 0:
        raise ConfigError(f"config key 'model.node_embedding': {m.node_embedding} is negative "
                          "(0: no embedding, D > 0: D learned columns)")
    if m.super_nodes and m.norm == "batch":
        raise ConfigError("config key 'model.norm': 'batch' with model.super_nodes: the super "
                          "rows have no batch statistics of their own (use 'layer')")
    for k in ("dropout", "input_dropout"):
        if not 0.0 <= getattr(m, k) < 1.0:
            raise ConfigError(f"config key 'model.{k}' must be in [0, 1)")
    o = cfg.optim
    for k in ("lr", "min_lr", "weight_decay"):
        v = getattr(o, k)
        if not (math.isfinite(v) and (v > 0 if k == "lr" else v >= 0)):
            raise ConfigError(f"config key 'optim.{k}': {v!r} must be a finite number "
                              f"{'> 0' if k == 'lr' else '>= 0'}")
    if not (math.isfinite(o.clip_norm) and o.clip_norm >= 0):
        raise ConfigError(f"config key 'optim.clip_norm': {o.clip_norm!r} must be a finite "
                          "number >= 0 (0: no clipping)")
    if cfg.patience < 0:
        raise ConfigError(f"config key 'patience': {cfg.patience} must be >= 0 (0: no early "
                          "stopping)")
    if not (math.isfinite(cfg.parallel.timeout_s) and cfg.parallel.timeout_s > 0):
        raise ConfigError(f"config key 'parallel.timeout_s': {cfg.parallel.timeout_s!r} must "
                          "be a finite number of seconds > 0")
    if (cfg.epochs < 1 or cfg.eval_every < 1 or cfg.checkpoint_every < 0 or cfg.stop_after < 0
            or cfg.checkpoint_every_steps < 0):
        raise ConfigError("config keys epochs, eval_every must be >= 1; checkpoint_every, "
                          "checkpoint_every_steps, stop_after >= 0")
    if isinstance(cfg.split_index, str) and cfg.split_index not in SPLIT_WORDS or (
            isinstance(cfg.split_index, int) and cfg.split_index < 0):
        raise ConfigError(f"config key 'split_index': {cfg.split_index!r} must be a split "
                          f"index >= 0 or one of {', '.join(SPLIT_WORDS)}")
    if cfg.resume and not cfg.checkpoint_dir:
        raise ConfigError("config key 'resume' needs 'checkpoint_dir'")
    par = cfg.parallel
    if min(par.head_parallel, par.ring_chunks, par.attention_block_rows, par.block_rows) < 0 \
            or not (math.isfinite(par.memory_per_rank_gb) and par.memory_per_rank_gb >= 0):
        raise ConfigError("config keys parallel.head_parallel, ring_chunks, "
                          "attention_block_rows, block_rows, memory_per_rank_gb must be >= 0 "
                          "(0: the plan's choice)")
    if par.axis_order != "auto" and sorted(par.axis_order) != ["x", "y", "z"]:
        raise ConfigError(f"config key 'parallel.axis_order': {par.axis_order!r} must be 'auto' "
                          "or the axes x, y, z once each, innermost first (e.g. yxz)")
    if not (0 < par.gpu_memory_fraction <= 1):
        raise ConfigError(f"config key 'parallel.gpu_memory_fraction': "
                          f"{par.gpu_memory_fraction!r} must be in (0, 1]")
    if not (math.isfinite(par.gpu_memory_reserve_gb) and par.gpu_memory_reserve_gb >= 0):
        raise ConfigError(f"config key 'parallel.gpu_memory_reserve_gb': "
                          f"{par.gpu_memory_reserve_gb!r} must be a finite number of GiB >= 0")


def notes(cfg: TrainConfig) -> list[str]:
    """One line for each value that is valid but does not do what it says (rank 0 prints
    them): a min_lr set above lr, which the cosine schedule takes as lr. The default min_lr
    above a small lr is the documented cap and says nothing."""
    o = cfg.optim
    if o.schedule == "cosine" and o.min_lr > o.lr and o.min_lr != OptimConfig.min_lr:
        return [f"optim.min_lr={o.min_lr:g} is above optim.lr={o.lr:g}; the schedule never "
                "raises the rate above lr, so it stays at lr after the warm-up (no decay)"]
    return []


def to_toml(cfg: TrainConfig) -> str:
    """The resolved configuration as TOML (logged, and stored beside checkpoints)."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for k, v in cfg.to_dict().items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {json.dumps(v)}")
    for name, t in tables:
        lines.append(f"\n[{name}]")
        lines.extend(f"{k} = {json.dumps(v)}" for k, v in t.items())
    return "\n".join(lines) + "\n"
