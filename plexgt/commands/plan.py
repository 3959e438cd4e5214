"""``plexgt plan``: what ``plexgt train`` would run, on P ranks and on every scale up to P.

One chooser: every line it prints is a view of what :func:`plexgt.plan.choose.choose` priced,
the search ``train --grid auto --strategy auto`` runs, and its exit status is that search's
(0: a configuration fits on P ranks; 1: none does, with the least memory per rank any needs
and the smallest world size that fits). The model comes from the same configuration loader
as train's (:func:`plexgt.plan.knobs.load_config`: a ``--config`` TOML, these flags and
``--key=value`` overrides, train's defaults and checks), so the two cannot disagree. Sizes
come from a prepared directory's manifest (``--data``) or from ``--nodes --edges --features
--classes`` (plan papers100M before preparing it); machine coefficients from ``--profile``
(``plexgt profile``), a machine description (``--machine perlmutter|frontier|dgx-a100|
FILE.toml``, :mod:`plexgt.plan.machine`), on a CPU host without either a quick calibration of
it (:mod:`plexgt.plan.calibrate`: seconds, cached per host; what ``train`` plans with too), or
defaults. One process, no MPI (the calibration's two worker processes aside).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from plexgt.commands.plan_batch import search_view
from plexgt.config import ELEMENT_BYTES, TrainConfig
from plexgt.data.loader import PreparedGraph
from plexgt.errors import ConfigError, DataError, UsageError
from plexgt.models.registry import default_registry as model_registry
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.strategy import StrategyRegistry
from plexgt.plan.calibrate import OFF_ENV, applies, calibration, disabled
from plexgt.plan.choose import (
    Choice,
    GraphSizes,
    ModelShape,
    NothingFits,
    RunPlan,
    choose,
    gcn_dims,
    smallest_fitting_world,
)
from plexgt.plan.host import Host
from plexgt.plan.knobs import load_config
from plexgt.plan.machine import MachineError, load_machine, merge_profile
from plexgt.plan.profile import profile_notes, read_profile
from plexgt.plan.search import GcnConfig, GcnSearch
from plexgt.plan.search_attention import AttentionConfig
from plexgt.tasks.task import graph_sizes, plexus_coefficients_for, system_model_for

HELP = "Predict time and memory per rank; choose the layout train would run (one search)."

MODEL_FLAGS = {  # flag -> (config key, help): defaults are the config's, as train's
    "model": ("model.name", "model (default: the config's, gcn)"),
    "hidden": ("model.hidden", "hidden width d"),
    "layers": ("model.layers", "layers (gcn) or blocks (gt, gps)"),
    "heads": ("model.heads", "attention heads (gt, gps)"),
    "ffn_mult": ("model.ffn_mult", "feed-forward width in units of d (gt, gps)"),
    "super_nodes": ("model.super_nodes", "gt / gps: global super nodes"),
    "node_embedding": ("model.node_embedding",
                       "a learnable node embedding of D columns in the input: priced as D "
                       "more input features"),
    "dtype": ("dtype", "activation dtype"),
    "strategy": ("parallel.strategy", "attention strategy, or auto"),
    "grid": ("parallel.grid", "gcn / gps: GxxGyxGz, or auto"),
    "head_parallel": ("parallel.head_parallel",
                      "strategies with a head axis: its ranks a (default 0: every divisor "
                      "of each scale)"),
    "ring_chunks": ("parallel.ring_chunks",
                    "ring strategies: pieces each K/V block travels in (default 0: the "
                    "search's)"),
    "attention_block_rows": ("parallel.attention_block_rows",
                             "strategies without a ring: query rows per attention block "
                             "(default 0: the search's)"),
}
INT_FLAGS = ("hidden", "layers", "heads", "ffn_mult", "super_nodes", "node_embedding",
             "head_parallel", "ring_chunks", "attention_block_rows")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path,
                   help="prepared directory (plexgt prep): the sizes from its manifest")
    p.add_argument("--nodes", type=int, help="plan from sizes alone: nodes N (no --data)")
    p.add_argument("--edges", type=int, help="stored edges E, self loops included")
    p.add_argument("--features", type=int, help="input features F")
    p.add_argument("--classes", type=int, help="classes C")
    p.add_argument("--world-size", required=True, type=int, help="ranks available (P)")
    p.add_argument("--config", help="the run's TOML file (as train's): the model to price")
    p.add_argument("--profile", type=Path, help="system profile JSON from plexgt profile")
    p.add_argument("--machine", help="machine description: a shipped one (perlmutter, "
                   "frontier, dgx-a100) or a TOML file; memory per rank defaults to what a "
                   "plan may fill of its GPUs (node.memory_fraction, less "
                   "node.memory_reserve_gib)")
    p.add_argument("--no-calibrate", action="store_true",
                   help="without --profile or --machine on a CPU host: price with the "
                        "default coefficients instead of a quick calibration of this host "
                        "(seconds, once: cached in ~/.cache/plexgt; also PLEXGT_NO_CALIBRATE=1)")
    p.add_argument("--memory-per-rank", type=float, metavar="GB",
                   help="memory per rank in GiB; what does not fit is never chosen")
    for flag, (_key, text) in MODEL_FLAGS.items():
        opt = "--" + flag.replace("_", "-")
        if flag == "model":
            p.add_argument(opt, choices=model_registry().names(), help=text)
        elif flag == "dtype":
            p.add_argument(opt, choices=list(ELEMENT_BYTES), help=text)
        else:
            p.add_argument(opt, type=int if flag in INT_FLAGS else str, help=text,
                           metavar="D" if flag == "node_embedding" else None)
    p.add_argument("--strategies", default=None,
                   help="comma-separated attention strategies the search may take "
                        "(default: every registered one)")
    p.add_argument("--inference", action="store_true",
                   help="price one forward pass (plexgt predict) instead of a training step: "
                        "no autograd graph, gradients or optimizer state, activations freed "
                        "layer by layer; what predict --grid auto chooses")
    p.add_argument("--json", type=Path, help="also write what it printed as JSON here")
    p.set_defaults(accepts_overrides=True)
    p.allow_abbrev = False
    p.epilog = ("Any config key can be set as --key=value, as for train "
                "(--model.hidden=256 --parallel.ring_chunks=2); the defaults are train's.")


def _manifest(path: Path, embedding: int = 0) -> tuple[GraphSizes, str]:
    """The prepared graph's sizes (from its manifest alone; the input widened by a node
    embedding) and its name."""
    pg = PreparedGraph(path)  # refuses directories without a manifest
    name = pg.manifest.get("name", str(path))
    pg.close()
    problem = graph_problem(pg.N, pg.E, pg.F + embedding, max(1, pg.C))
    if problem:
        raise DataError(f"{path}: manifest has N={pg.N}, E={pg.E}, F={pg.F}: {problem}"
                        + (" (a featureless graph plans with --node-embedding)"
                           if pg.F + embedding < 1 else ""))
    return graph_sizes(pg, embedding), name


INDEX_LIMIT = 2**63
"""Nodes and stored edges must fit the int64 indices prep writes and training reads."""


def graph_problem(n: int, e: int, features: int, classes: int) -> str:
    """What makes these sizes a graph no run can have ('' when none): no nodes, no edges,
    more edges than node pairs (E counts stored entries of the N x N pattern, so E <= N²),
    no input or no class, or counts past int64."""
    if n < 1:
        return "a graph needs nodes (N >= 1)"
    if max(n, e) >= INDEX_LIMIT:
        return "N and E must fit int64 indices (< 2^63)"
    if e < 1:
        return "a graph with no edges has nothing to aggregate or attend over (E >= 1)"
    if e > n * n:
        return f"E > N² = {n * n}: an N-node pattern holds at most N² entries"
    if features < 1:
        return "the input has no feature (F >= 1)"
    if classes < 1:
        return "the task has no class (C >= 1)"
    return ""


def load_profile(path: Path | None) -> dict[str, Any] | None:
    """The profile JSON, validated (UsageError naming the file when it is not one)."""
    if path is None:
        return None
    try:
        return read_profile(path)
    except ValueError as e:
        raise UsageError(f"--profile {e}") from None


SIZE_FLAGS = ("nodes", "edges", "features", "classes")
MAX_WORLD_SIZE = 8192
"""The most ranks plan searches. Its search prices every factorisation of every scale
1..P: 72,003 grids at P = 2048 (5.5 s on the benchmark's 2-core VM, under the 10 s target),
390,836 at 8192 (41 s on that VM shared with other jobs), 896,188 at 16384 (92 s), and past
that listing the factorisations alone grows faster than P² (65536: 377 s before any pricing;
10⁶ never ends). 8192 covers Perlmutter's whole GPU partition (7,168 GPUs)."""
MAX_RANK_LAYERS = MAX_WORLD_SIZE * 3
"""The most ranks x layers plan prices: every configuration is priced layer by layer, so
the search's time grows with both (1,000 gcn layers on 64 ranks took 97 s); 8192 ranks of
the benchmark's 3 layers is the bound, 2048 ranks may have 12 layers, 64 ranks 384."""
MAX_RING_CHUNKS = 16
"""The most pieces a K/V block travels in that plan prices: the ring's cost lists one
message per piece and step, so the search's time grows with them (gt on papers100M at
P = 2048: 2.3 s with the search's own 1, 2 and 4 pieces, 4.9 s with 16, 21 s with 64); a
block cut finer sends latency-bound messages."""


def _sizes(args: argparse.Namespace) -> tuple[GraphSizes, str]:
    """The graph's sizes: a prepared manifest (--data) or the four size flags, not both."""
    given = [f for f in SIZE_FLAGS if getattr(args, f) is not None]
    if args.data is not None:
        if given:
            raise UsageError(f"--data and --{given[0]} both give sizes; use one")
        return _manifest(args.data, args.node_embedding)
    if len(given) != len(SIZE_FLAGS):
        missing = [f"--{f}" for f in SIZE_FLAGS if f not in given]
        raise UsageError(f"give --data, or all of --nodes --edges --features --classes "
                         f"(missing {' '.join(missing)})")
    problem = "--features must be >= 0" if args.features < 0 else graph_problem(
        args.nodes, args.edges, args.features + (args.node_embedding or 0), args.classes)
    if problem:
        raise UsageError(f"--nodes {args.nodes} --edges {args.edges} --features "
                         f"{args.features} --classes {args.classes}: {problem}"
                         + (" (--features 0 needs --node-embedding)"
                            if args.features + (args.node_embedding or 0) < 1 else ""))
    return (GraphSizes(args.nodes, args.edges, args.features + (args.node_embedding or 0),
                       args.classes),
            f"N={args.nodes} E={args.edges}")


def _config(args: argparse.Namespace, registry: StrategyRegistry) -> TrainConfig:
    """The model and layout to price, loaded as train loads them (flags over ``--config``,
    ``--key=value`` over both); a bad value is train's one line, as a usage error here."""
    flags = {key: getattr(args, flag) for flag, (key, _) in MODEL_FLAGS.items()}
    if args.memory_per_rank is not None:
        flags["parallel.memory_per_rank_gb"] = args.memory_per_rank
    if args.no_calibrate:
        flags["parallel.calibrate"] = False
    try:
        return load_config(args.config, flags, getattr(args, "overrides", []), registry)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def _check(args: argparse.Namespace) -> None:
    """The flags' own bounds: what no run has, and what the search cannot price in seconds."""
    ints = {f: getattr(args, f) for f in INT_FLAGS if getattr(args, f) is not None}
    if ints.get("node_embedding", 0) < 0:
        raise UsageError(f"--node-embedding {args.node_embedding} is negative")
    four = [ints.get(f, 0) for f in ("head_parallel", "ring_chunks", "attention_block_rows",
                                     "super_nodes")]
    if min(four) < 0:
        raise UsageError("--head-parallel, --ring-chunks, --attention-block-rows and "
                         f"--super-nodes must be >= 0 (got {', '.join(map(str, four))})")
    for name in ("world_size", "hidden", "layers", "heads", "ffn_mult"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be positive (got {v})")
    if args.memory_per_rank is not None and not 0 < args.memory_per_rank < math.inf:
        raise UsageError(f"--memory-per-rank must be positive and finite, in GiB "
                         f"(got {args.memory_per_rank})")
    if args.world_size > MAX_WORLD_SIZE:
        raise UsageError(f"--world-size {args.world_size}: plan searches at most "
                         f"{MAX_WORLD_SIZE} ranks (its every-scale grid search grows faster "
                         f"than P and takes minutes beyond)")


def _check_config(args: argparse.Namespace, cfg: TrainConfig) -> None:
    """Bounds on what the configuration asks the search to price."""
    m, par = cfg.model, cfg.parallel
    if args.world_size * m.layers > MAX_RANK_LAYERS:
        raise UsageError(f"--world-size {args.world_size} x --layers {m.layers} = "
                         f"{args.world_size * m.layers}: plan prices at most "
                         f"{MAX_RANK_LAYERS} ranks x layers in about a minute (each "
                         f"configuration is priced layer by layer at every scale)")
    if par.ring_chunks > MAX_RING_CHUNKS:
        raise UsageError(f"--ring-chunks {par.ring_chunks}: plan prices at most "
                         f"{MAX_RING_CHUNKS} pieces a K/V block (each piece is one more "
                         f"message per ring step to price, and latency-bound far sooner)")
    if m.name != "gcn" and m.hidden % m.heads:
        raise UsageError(f"--hidden {m.hidden} is not divisible by --heads {m.heads}")


def _registry(args: argparse.Namespace, base: StrategyRegistry) -> StrategyRegistry:
    """The strategies the search may take: ``--strategies``' names of ``base``, or all."""
    if not args.strategies:
        return base
    names = [x.strip() for x in args.strategies.split(",") if x.strip()]
    reg = StrategyRegistry()
    for s in names:
        if s not in base:
            raise UsageError(f"--strategies: unknown {s!r}; known: {', '.join(base.names())}")
        reg.register(base.get(s))
    if args.head_parallel and args.head_parallel > 1 and args.model != "gcn" \
            and all(c.head_axes is None for c in reg):
        raise UsageError(f"--head-parallel {args.head_parallel} would be ignored: "
                         f"--strategies {args.strategies} has no head axis ("
                         + ", ".join(c.name for c in base if c.head_axes is not None)
                         + " has)")
    return reg


def run(args: argparse.Namespace, registry: StrategyRegistry | None = None) -> int:
    """Plan on ``registry``'s strategies (default: the built-in ones), as train would."""
    _check(args)
    reg = _registry(args, registry or default_registry())
    cfg = _config(args, reg)
    _check_config(args, cfg)
    args.node_embedding = cfg.model.node_embedding
    sizes, name = _sizes(args)
    given = args.profile or (Path(cfg.parallel.profile) if cfg.parallel.profile else None)
    prof = load_profile(given)
    src = f"profile {given}" if prof else ""
    if prof is None and not args.machine:
        prof, src = _calibration(cfg)
    limit = None if args.memory_per_rank is None else int(args.memory_per_rank * 2**30)
    if args.machine:
        try:
            mach = load_machine(args.machine)
        except MachineError as e:
            raise UsageError(f"--machine {e}") from None
        measured = prof
        prof = merge_profile(mach.profile(args.world_size), measured)
        limit = mach.usable_memory_bytes if limit is None else limit
        src = (f"machine description {mach.name} ({mach.path}; a model projection, not a "
               "measurement)" + (f", overridden by profile {args.profile}" if measured else ""))
    shape = ModelShape.of(cfg, args.inference)
    m = cfg.model
    print(f"{name}: {m.name} (hidden {m.hidden}, {m.layers} layers"
          + (f", {m.heads} heads" if m.name != "gcn" else "") + f", {cfg.dtype}"
          + ("; inference: one forward pass" if args.inference else "") + f") on up to "
          f"{args.world_size} ranks")
    print(f"coefficients: {src}")
    print("memory per rank: " + ("no limit" if limit is None else
                                 f"at most {limit / 2**30:.2f} GiB"))
    node = Host.from_profile(prof)
    if node.device == "cpu":
        print(describe_node(node))
    if m.name == "gcn":
        print(f"layer widths {gcn_dims(sizes, shape)}, stored nonzeros {sizes.e}")
    print(f"load balance: the busiest rank's block priced, from {sizes.balance.source}")
    for note in profile_notes(prof):
        print(f"note: {note}")
    out = _search(args, cfg, sizes, shape, prof, limit, reg)
    out.update(model=m.name, config=_model_fields(cfg), inference=args.inference,
               coefficients=src)
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(out, indent=1) + "\n")
        except OSError as e:
            raise UsageError(f"--json {args.json}: {e.strerror or e}") from None
    return 0 if out.get("choice") else 1


def _calibration(cfg: TrainConfig) -> tuple[dict[str, Any] | None, str]:
    """Without a profile or machine description: this CPU host's quick calibration (what
    ``train`` plans with too), or None and why the defaults."""
    why = ("--no-calibrate" if not cfg.parallel.calibrate else f"{OFF_ENV} is set"
           if disabled() else "" if applies() else
           "a GPU host: measure it with plexgt profile, or give --machine")
    if why:
        return None, f"default coefficients (no --profile; {why})"
    cal = calibration(announce=lambda: print(
        "calibrating this host's kernels and collectives (seconds, once: the result is "
        "cached; --no-calibrate skips it)", file=sys.stderr, flush=True))
    return cal.profile, cal.describe()


def _model_fields(cfg: TrainConfig) -> dict[str, Any]:
    m = cfg.model
    return {"name": m.name, "hidden": m.hidden, "layers": m.layers, "heads": m.heads,
            "ffn_mult": m.ffn_mult, "super_nodes": m.super_nodes,
            "node_embedding": m.node_embedding, "dtype": cfg.dtype}


def describe_node(node: Host) -> str:
    """One line on how the planner shares a CPU node among its ranks."""
    speed = ", ".join(f"{t} threads {x:.2f}x" for t, x in sorted(node.thread_speedup.items()))
    kappa = ", ".join(f"{p} ranks {k:.2f}" for p, k in sorted(node.contention.items()) if p > 1)
    return (f"node: {node.cores} CPU cores shared by the ranks; ranks fewer than the cores "
            f"run cores/ranks threads each (measured speedup over {node.threads}: "
            f"{speed or 'none measured'}); slowdown of ranks at once: {kappa or 'none measured'}")


def _search(args: argparse.Namespace, cfg: TrainConfig, sizes: GraphSizes, shape: ModelShape,
            prof: dict[str, Any] | None, limit: int | None, reg: StrategyRegistry
            ) -> dict[str, Any]:
    """The one search (:func:`plexgt.plan.choose.choose`) over every scale 1..P and on
    exactly P ranks (what ``plexgt train`` on P ranks runs), printed as views, and returned
    for the JSON."""
    sysm, coef = system_model_for(prof), plexus_coefficients_for(prof)
    if shape.batch is not None:
        return search_view(args, cfg, sizes, shape, sysm, limit, (prof or {}).get("batch"))
    par = cfg.parallel
    kw = dict(memory_per_rank=limit, strategy=par.strategy, grid=par.grid,
              head_parallel=par.head_parallel, registry=reg)
    P = args.world_size
    out: dict[str, Any] = {"search": {}, "choice": None, "rows": []}
    try:
        wide = choose(sizes, shape, P, sysm, coef, any_scale=True, **kw)
    except NothingFits as e:
        wide = None
        out["search"]["any_scale"] = None
        out["search"]["least_memory_bytes"] = (None if e.least_memory is None
                                               else e.least_memory[0])
    if wide is not None:
        _print_scales(wide, P, out)
    try:
        rp = choose(sizes, shape, P, sysm, coef, **kw).plan
    except NothingFits as e:
        out["search"]["at_world_size"] = None
        more = smallest_fitting_world(sizes, shape, P, MAX_WORLD_SIZE, sysm, coef,
                                      limit or 0, par.strategy, par.head_parallel, reg) \
            if limit is not None and P < MAX_WORLD_SIZE else None
        out["search"]["smallest_world_size"] = None if more is None else more.scale
        print(f"{e}; " + (f"the smallest world size that fits is {more.scale} ranks "
                          f"({more.label}, {more.memory_bytes / 2**30:.3g} GiB per rank)"
                          if more is not None else
                          f"no world size up to {MAX_WORLD_SIZE} ranks fits"))
        return out
    out["search"]["at_world_size"] = out["choice"] = _run_plan_fields(rp)
    runs, step = (("predict --grid auto", "forward") if args.inference
                  else ("train --grid auto --strategy auto", "step"))
    print(f"choice on {P} ranks (what {runs} runs): {rp.label}, "
          f"{rp.time_s:.4g} s a {step}, {rp.memory_bytes / 2**30:.3g} GiB per rank")
    print(f"where the {step}'s predicted time goes:")
    for what, t in rp.split:
        print(f"  {t:>10.4g} s  {what}")
    if not args.inference:
        print("next: " + train_command(args, cfg, rp))
    return out


def _print_scales(wide: Choice, P: int, out: dict[str, Any]) -> None:
    """The every-scale search as a table: each scale's fastest fitting configuration, the
    Pareto set marked."""
    rp, found = wide
    front = {(c.scale, c.label) for c in found.frontier}
    what = f"{found.grids} grids, " if isinstance(found, GcnSearch) else ""
    print(f"search over every scale 1..{P}: {what}{found.priced} configurations priced, "
          f"{getattr(found, 'pruned', 0)} dropped on memory before pricing, in "
          f"{found.seconds:.2f} s")
    print(f"{'ranks':>6}  {'configuration':<44} {'step s':>10} {'GiB/rank':>9}")
    rows = []
    for c in found.best_per_scale:
        f = _config_fields(c)
        on = (c.scale, c.label) in front
        chosen = (c.scale, c.label) == (rp.scale, rp.label)
        rows.append({**f, "frontier": on, "chosen": chosen, "fits": True})
        if on or c.scale in (1, P) or c.scale & (c.scale - 1) == 0:
            print(f"{c.scale:>6}  {c.label:<44} {f['time_s']:>10.4g} "
                  f"{f['memory_bytes'] / 2**30:>9.3g}"
                  + ("  * Pareto" if on else "") + ("  <- fastest" if chosen else ""))
    print("(each row: the fastest configuration of that many ranks that fits, listed at powers "
          "of two, P and\n the Pareto set: those no other configuration beats on both time and "
          "memory; step s: one\n "
          + ("forward pass's" if rp.shape is not None and rp.shape.inference
             else "training step's")
          + " predicted seconds; GiB/rank: its predicted peak memory per rank)")
    print(f"fastest at any scale: {rp.label} on {rp.scale} ranks, {rp.time_s:.4g} s, "
          f"{rp.memory_bytes / 2**30:.3g} GiB")
    out["rows"] = rows
    out["search"].update(any_scale=_run_plan_fields(rp), priced=found.priced,
                         pruned=getattr(found, "pruned", 0), seconds=found.seconds,
                         frontier=[_config_fields(c) for c in found.frontier],
                         best_per_scale=[_config_fields(c) for c in found.best_per_scale])


def train_command(args: argparse.Namespace, cfg: TrainConfig, rp: RunPlan) -> str:
    """The ``plexgt train`` line that runs the chosen layout (the plan's values made explicit,
    so the run does not search again)."""
    parts = [f"mpiexec -n {rp.scale} plexgt train",
             f"--data {args.data}" if args.data is not None else "--data PREPARED",
             f"--model {cfg.model.name}"]
    if args.config:
        parts.append(f"--config {args.config}")
    m, d = cfg.model, TrainConfig().model
    for key in ("hidden", "layers", "heads", "ffn_mult", "super_nodes", "node_embedding",
                "residual", "norm", "pre_norm", "jk", "input_proj", "head"):
        v = getattr(m, key)
        if v != getattr(d, key):
            parts.append(f"--model.{key}={str(v).lower() if isinstance(v, bool) else v}")
    if cfg.dtype != TrainConfig().dtype:
        parts.append(f"--dtype={cfg.dtype}")
    if rp.grid is not None:
        parts.append(f"--grid {rp.grid}")
    if rp.strategy:
        parts.append(f"--strategy {rp.strategy}")
        if rp.head_parallel > 1:
            parts.append(f"--parallel.head_parallel={rp.head_parallel}")
        if rp.ring_chunks > 1:
            parts.append(f"--parallel.ring_chunks={rp.ring_chunks}")
        if rp.attention_block_rows:
            parts.append(f"--parallel.attention_block_rows={rp.attention_block_rows}")
    else:
        if rp.gcn_order != "auto":
            parts.append(f"--parallel.gcn_order={rp.gcn_order}")
        if rp.block_rows:
            parts.append(f"--parallel.block_rows={rp.block_rows}")
    if args.profile is not None:
        parts.append(f"--parallel.profile={args.profile}")
    if args.no_calibrate:
        parts.append("--parallel.calibrate=false")
    if args.memory_per_rank is not None:
        parts.append(f"--parallel.memory_per_rank_gb={args.memory_per_rank}")
    return " ".join(parts)


def _run_plan_fields(rp: RunPlan) -> dict[str, Any]:
    return {"label": rp.label, "scale": rp.scale,
            "grid": None if rp.grid is None else str(rp.grid), "strategy": rp.strategy,
            "head_parallel": rp.head_parallel, "ring_chunks": rp.ring_chunks,
            "attention_block_rows": rp.attention_block_rows, "gcn_order": rp.gcn_order,
            "split": [{"what": w, "seconds": t} for w, t in rp.split],
            "block_rows": rp.block_rows, "time_s": rp.time_s, "memory_bytes": rp.memory_bytes}


def _config_fields(c: GcnConfig | AttentionConfig) -> dict[str, Any]:
    """One searched configuration: what it is and its prediction."""
    if isinstance(c, GcnConfig):
        return {"label": c.label, "scale": c.scale, "grid": str(c.grid), "order": c.order,
                "block_rows": c.block_rows, "time_s": c.est.time_s, "comm_s": c.est.comm_s,
                "compute_s": c.est.compute_s, "memory_bytes": c.est.memory_bytes}
    e = c.est
    return {"label": c.label, "scale": c.scale, "strategy": c.strategy,
            "head_parallel": c.head_parallel, "ring_chunks": c.ring_chunks,
            "attention_block_rows": c.block_rows,
            "gcn_grid": None if c.gcn_grid is None else str(c.gcn_grid),
            "time_s": e.time_s, "compute_s": e.compute_s, "comm_s": e.comm_s,
            "overhead_s": e.overhead_s, "memory_bytes": c.memory_bytes}
