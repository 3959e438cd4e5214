"""The run configuration as a run and a plan load it: the schema's checks
(:func:`plexgt.config.read_config`) plus those that need the layers below the planner.

Why here and not in :mod:`plexgt.config`: the config is the bottom schema every layer reads,
so it cannot ask the attention registry which strategies exist, the grid which shapes parse,
or the profile reader whether a file is a profile. ``plexgt train`` and ``plexgt plan`` both
load through :func:`load_config`, so a value one refuses the other refuses too, in the same
words.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plexgt.config import ParallelConfig, TrainConfig, read_config
from plexgt.data.node_batches import check_batch
from plexgt.distributed.grid import parse_grid
from plexgt.distributed.mesh import check_layout, parse_extent, parse_stages
from plexgt.errors import ConfigError, GridError
from plexgt.models.registry import default_registry as model_registry
from plexgt.models.spec import ModelRegistry
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.plan.profile import read_profile


def strategy_choices(registry: StrategyRegistry | None = None) -> tuple[str, ...]:
    """What ``parallel.strategy`` accepts: 'auto' (the plan's pick) or a registered name."""
    return ("auto", *(registry or default_registry()).names())


def check_config(cfg: TrainConfig, registry: StrategyRegistry | None = None,
                 models: ModelRegistry | None = None) -> None:
    """ConfigError naming the key when the config names what does not exist or does not
    apply: a model the model registry lacks, attention keys on a model without attention, a
    strategy the registry lacks, a head axis the strategy has not, a grid that does not
    parse, a profile that does not read; the node-sequence layout's keys on a full-graph
    model, and on a node-sequence model what :func:`check_batch_layout` checks."""
    reg = registry or default_registry()
    models = models or model_registry()
    par, m = cfg.parallel, cfg.model
    names = models.names()
    if m.name not in names:
        raise ConfigError(f"config key 'model.name': {m.name!r} is not one of "
                          f"{', '.join(names)}")
    spec = models.get(m.name)
    batch_layout = [s.name for s in models if s.layout == "batch"]
    if spec.layout == "batch":
        check_batch_layout(cfg)
    else:
        for k in MESH_KEYS:
            if getattr(par, k) != getattr(DEFAULT_PARALLEL, k):
                raise ConfigError(f"config key 'parallel.{k}': {getattr(par, k)!r} applies to "
                                  f"node-sequence models ({', '.join(batch_layout)}); {m.name} "
                                  "trains full-graph (leave it at its default)")
    attention = spec.attention
    if attention and m.hidden % m.heads:
        raise ConfigError(f"config key 'model.hidden': {m.hidden} is not divisible by "
                          f"model.heads={m.heads}")
    if m.super_nodes < 0 or (m.super_nodes and not attention):
        with_attention = ", ".join(s.name for s in models if s.attention)
        raise ConfigError(f"config key 'model.super_nodes': {m.super_nodes} must be >= 0, "
                          f"and 0 for {m.name} (super nodes join attention: {with_attention})")
    if attention:
        for k, v in (("residual", m.residual != "none"), ("input_proj", m.input_proj),
                     ("head", m.head), ("init", m.init != "torch")):
            if v:
                raise ConfigError(f"config key 'model.{k}' is the grid3d models': {m.name} "
                                  "blocks always add their input, project it and end in a "
                                  "classifier")
    elif m.jk != "none" and not m.head:
        raise ConfigError(f"config key 'model.jk': {m.jk!r} needs model.head=true for "
                          f"{m.name} (the combined layers feed a linear classifier)")
    if par.head_parallel > 1 and not attention:
        raise ConfigError(f"config key 'parallel.head_parallel': {par.head_parallel} would be "
                          f"ignored: {m.name} has no attention")
    allowed = strategy_choices(reg)
    if par.strategy not in allowed:
        raise ConfigError(f"config key 'parallel.strategy': {par.strategy!r} is not one of "
                          f"{', '.join(allowed)}")
    if par.head_parallel > 1 and par.strategy != "auto" \
            and reg.get(par.strategy).head_axes is None:
        with_axis = [s.name for s in reg if s.head_axes is not None]
        raise ConfigError(f"config key 'parallel.head_parallel': {par.head_parallel} would be "
                          f"ignored: parallel.strategy {par.strategy} has no head axis "
                          f"({', '.join(with_axis) or 'no strategy'} has)")
    if par.grid != "auto":
        try:
            parse_grid(par.grid)
        except GridError as e:
            raise ConfigError(f"config key 'parallel.grid': {e}") from None
    if par.profile:
        try:
            read_profile(par.profile)
        except ValueError as e:
            raise ConfigError(f"config key 'parallel.profile': {e}") from None


MESH_KEYS = ("dp", "pp", "cp", "stages", "micro_batches")
"""The parallel keys of the node-sequence layout's dp x pp x cp mesh."""
DEFAULT_PARALLEL = ParallelConfig()


def check_batch_layout(cfg: TrainConfig) -> None:
    """The checks of a node-sequence model (layout 'batch') that the config alone decides:
    the [batch] table (:func:`plexgt.data.node_batches.check_batch`), the mesh keys (by
    :mod:`plexgt.distributed.mesh`'s rules: ``parse_extent``, ``parse_stages``,
    ``check_layout``), and the keys of the full-graph layouts it would ignore."""
    m, par, b = cfg.model, cfg.parallel, cfg.batch
    check_batch(b)
    if m.hidden % m.heads:
        raise ConfigError(f"config key 'model.hidden': {m.hidden} is not divisible by "
                          f"model.heads={m.heads}")
    for k, bad, why in (
            ("super_nodes", m.super_nodes != 0, "its global nodes are batch.global_nodes"),
            ("residual", m.residual != "none", "its blocks always add their input"),
            ("input_proj", m.input_proj, "it always projects its input"),
            ("head", m.head, "it always ends in a classifier"),
            ("init", m.init != "torch", "it initialises every parameter from its name"),
            ("jk", m.jk != "none", "its head reads the last block"),
            ("norm", m.norm not in ("auto", "layer"), "its blocks are pre-LayerNorm"),
            ("checkpoint", m.checkpoint != "none", "it does not recompute blocks yet")):
        if bad:
            raise ConfigError(f"config key 'model.{k}': {getattr(m, k)!r} does not apply to "
                              f"{m.name}: {why}")
    for k, bad in (("strategy", par.strategy != "auto"), ("grid", par.grid != "auto"),
                   ("head_parallel", par.head_parallel > 0)):
        if bad:
            raise ConfigError(f"config key 'parallel.{k}': {getattr(par, k)!r} applies to the "
                              f"full-graph layouts; {m.name} is laid out by parallel.dp, pp, "
                              "cp and stages")
    dp, pp, cp = (parse_extent(getattr(par, k), f"parallel.{k}") for k in ("dp", "pp", "cp"))
    k = par.micro_batches
    if k < 0:
        raise ConfigError(f"config key 'parallel.micro_batches': {k} must be >= 0 (0: the "
                          "plan's)")
    parse_stages(par.stages, m.layers, pp)
    check_layout(b.sequences, b.size, m.layers, dp, pp, cp, k or None)


def load_config(path: str | Path | None = None, flags: dict[str, Any] | None = None,
                overrides: list[str] | None = None,
                registry: StrategyRegistry | None = None) -> TrainConfig:
    """A run's :class:`TrainConfig`: TOML file < flags ({dotted key: value}) < ``key=value``
    overrides, every key checked by the schema and by :func:`check_config`."""
    cfg = read_config(path, flags, overrides)
    check_config(cfg, registry)
    return cfg
