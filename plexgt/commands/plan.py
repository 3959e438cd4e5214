"""``plexgt plan``: predicted time and memory per rank of every strategy and scale, and a choice.

gt / gps: the attention strategies (GP-AG, GP-A2A, GP-Ring, GP-2D at every head axis) x
scales 1, 2, 4, ..., P, chosen by AGP (:mod:`plexgt.plan.agp`); for gps each scale s > 1 is
priced with the GCN path in the 1D layout and 3D on the 3D planner's best grid of s ranks (as
``plexgt train`` with ``parallel.grid = "auto"`` decides), one row each, the path shown. gcn:
every Gx x Gy x Gz of P ranked by the 3D tensor-parallel cost model
(:func:`plexgt.plan.plexus_cost.rank_grids`: what ``train --grid auto`` picks), then the
search over every scale 1..P, grid, layer order and blocking
(:func:`plexgt.plan.search.search_gcn`) with its fastest fitting configuration and
time-memory frontier. Sizes come from the prepared directory's manifest (``--data``) or from
``--nodes --edges --features --classes`` (plan papers100M before preparing it); machine
coefficients from ``--profile`` (``plexgt profile``), from a machine description
(``--machine perlmutter|frontier|dgx-a100|FILE.toml``, :mod:`plexgt.plan.machine`), or
defaults. One process, no MPI.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from plexgt.data.loader import PreparedGraph
from plexgt.distributed.layout3d import layer_orders
from plexgt.errors import ConfigError, DataError, UsageError
from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.agp import format_plan, plan, scales_for
from plexgt.plan.choose import (
    GraphSizes,
    ModelShape,
    RunPlan,
    choose,
    gcn_dims,
    gps_grid,
    workload,
)
from plexgt.plan.host import Host
from plexgt.plan.machine import MachineError, load_machine, merge_profile
from plexgt.plan.pareto import frontier
from plexgt.plan.plexus_cost import Coefficients, rank_grids
from plexgt.plan.profile import read_profile
from plexgt.plan.search import GcnConfig, GcnSearch
from plexgt.plan.search_attention import AttentionConfig
from plexgt.tasks.task import graph_sizes, plexus_coefficients_for, system_model_for

HELP = "Predict time and memory of each strategy and scale; choose one (AGP / Plexus)."
ESIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path,
                   help="prepared directory (plexgt prep): the sizes from its manifest")
    p.add_argument("--nodes", type=int, help="plan from sizes alone: nodes N (no --data)")
    p.add_argument("--edges", type=int, help="stored edges E, self loops included")
    p.add_argument("--features", type=int, help="input features F")
    p.add_argument("--classes", type=int, help="classes C")
    p.add_argument("--model", required=True, choices=["gcn", "gt", "gps"])
    p.add_argument("--world-size", required=True, type=int, help="ranks available (P)")
    p.add_argument("--profile", type=Path, help="system profile JSON from plexgt profile")
    p.add_argument("--machine", help="machine description: a shipped one (perlmutter, "
                   "frontier, dgx-a100) or a TOML file; memory per rank defaults to what a "
                   "plan may fill of its GPUs (node.memory_fraction, less "
                   "node.memory_reserve_gib)")
    p.add_argument("--memory-per-rank", type=float, metavar="GB",
                   help="memory per rank in GiB; what does not fit is never chosen")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4, help="attention heads (gt, gps)")
    p.add_argument("--ffn-mult", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=sorted(ESIZE))
    p.add_argument("--head-parallel", type=int, default=0,
                   help="gp_2d: the head axis a (default: every divisor of each scale)")
    p.add_argument("--ring-chunks", type=int, default=0,
                   help="gp_ring / gp_2d: pieces each K/V block travels in (default 0: "
                        "the search's; the table prices 1)")
    p.add_argument("--attention-block-rows", type=int, default=0,
                   help="gp_ag / gp_a2a: query rows per attention block (default 0: the "
                        "search's; the table prices whole)")
    p.add_argument("--super-nodes", type=int, default=0,
                   help="gt / gps: global super nodes (model.super_nodes)")
    p.add_argument("--node-embedding", type=int, default=0, metavar="D",
                   help="a learnable node embedding of D columns in the input "
                        "(model.node_embedding): priced as D more input features")
    p.add_argument("--strategies", default=None,
                   help="comma-separated attention strategies (default: all registered)")
    p.add_argument("--json", type=Path, help="also write the table as JSON here")


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
        args.nodes, args.edges, args.features + args.node_embedding, args.classes)
    if problem:
        raise UsageError(f"--nodes {args.nodes} --edges {args.edges} --features "
                         f"{args.features} --classes {args.classes}: {problem}"
                         + (" (--features 0 needs --node-embedding)"
                            if args.features + args.node_embedding < 1 else ""))
    return (GraphSizes(args.nodes, args.edges, args.features + args.node_embedding,
                       args.classes),
            f"N={args.nodes} E={args.edges}")


def _check(args: argparse.Namespace) -> None:
    if args.node_embedding < 0:
        raise UsageError(f"--node-embedding {args.node_embedding} is negative")
    if min(args.head_parallel, args.ring_chunks, args.super_nodes,
           args.attention_block_rows) < 0:
        raise UsageError(f"--head-parallel, --ring-chunks, --attention-block-rows and "
                         f"--super-nodes must be >= 0 (got {args.head_parallel}, "
                         f"{args.ring_chunks}, {args.attention_block_rows}, "
                         f"{args.super_nodes})")
    for name in ("world_size", "hidden", "layers", "heads", "ffn_mult"):
        v = getattr(args, name)
        if v < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be positive (got {v})")
    if args.memory_per_rank is not None and not 0 < args.memory_per_rank < math.inf:
        raise UsageError(f"--memory-per-rank must be positive and finite, in GiB "
                         f"(got {args.memory_per_rank})")
    if args.world_size > MAX_WORLD_SIZE:
        raise UsageError(f"--world-size {args.world_size}: plan searches at most "
                         f"{MAX_WORLD_SIZE} ranks (its every-scale grid search grows faster "
                         f"than P and takes minutes beyond)")
    if args.world_size * args.layers > MAX_RANK_LAYERS:
        raise UsageError(f"--world-size {args.world_size} x --layers {args.layers} = "
                         f"{args.world_size * args.layers}: plan prices at most "
                         f"{MAX_RANK_LAYERS} ranks x layers in about a minute (each "
                         f"configuration is priced layer by layer at every scale)")
    if args.ring_chunks > MAX_RING_CHUNKS:
        raise UsageError(f"--ring-chunks {args.ring_chunks}: plan prices at most "
                         f"{MAX_RING_CHUNKS} pieces a K/V block (each piece is one more "
                         f"message per ring step to price, and latency-bound far sooner)")
    named = [x.strip() for x in (args.strategies or "").split(",") if x.strip()]
    if args.head_parallel > 1 and (args.model == "gcn" or named and "gp_2d" not in named):
        raise UsageError(f"--head-parallel {args.head_parallel} would be ignored: "
                         + ("gcn has no attention" if args.model == "gcn" else
                            f"--strategies {args.strategies} has no head axis (gp_2d has)"))
    if args.model != "gcn" and args.hidden % args.heads:
        raise UsageError(f"--hidden {args.hidden} is not divisible by --heads {args.heads}")


def run(args: argparse.Namespace) -> int:
    _check(args)
    sizes, name = _sizes(args)
    prof = load_profile(args.profile)
    src = f"profile {args.profile}" if prof else "default coefficients (no --profile)"
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
    shape = ModelShape(args.model, args.hidden, args.layers, args.heads, args.ffn_mult,
                       ESIZE[args.dtype], ring_chunks=args.ring_chunks,
                       super_nodes=args.super_nodes, trained_input=args.node_embedding > 0,
                       attention_block_rows=args.attention_block_rows)
    print(f"{name}: {args.model} on up to {args.world_size} ranks, {src}")
    node = Host.from_profile(prof)
    if node.device == "cpu":
        print(describe_node(node))
    if args.model == "gcn":
        table = _plan_gcn(args, sizes, shape, prof, limit)
    else:
        table = _plan_attention(args, sizes, shape, prof, limit)
    table["search"] = _search(args, sizes, shape, prof, limit)
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(table, indent=1) + "\n")
        except OSError as e:
            raise UsageError(f"--json {args.json}: {e.strerror or e}") from None
    return 0 if table.get("choice") else 1


def describe_node(node: Host) -> str:
    """One line on how the planner shares a CPU node among its ranks."""
    speed = ", ".join(f"{t} threads {x:.2f}x" for t, x in sorted(node.thread_speedup.items()))
    kappa = ", ".join(f"{p} ranks {k:.2f}" for p, k in sorted(node.contention.items()) if p > 1)
    return (f"node: {node.cores} CPU cores shared by the ranks; ranks fewer than the cores "
            f"run cores/ranks threads each (measured speedup over {node.threads}: "
            f"{speed or 'none measured'}); slowdown of ranks at once: {kappa or 'none measured'}")


def _plan_gcn(args: argparse.Namespace, sizes: GraphSizes, shape: ModelShape,
              prof: dict[str, Any] | None, limit: int | None) -> dict[str, Any]:
    coef = Coefficients.from_profile(prof)
    dims = gcn_dims(sizes, shape)
    nnz = sizes.e  # the stored pattern, self loops included (what train's grid choice prices)
    ests = rank_grids(args.world_size, sizes.n, nnz, dims, shape.esize, coef, limit,
                      input_grad=shape.trained_input, input_density=sizes.feature_density)
    print(f"dims {dims}, nnz(Â) = {nnz}, layer orders {layer_orders(dims)}")
    print(f"{'grid':<10} {'time s':>9} {'comm s':>9} {'compute s':>9} {'MB/rank':>9} "
          f"{'mem GiB':>8} fits")
    fits = [limit is None or e.memory_bytes <= limit for e in ests]
    best = next((i for i, f in enumerate(fits) if f), None)
    ok_i = [i for i, f in enumerate(fits) if f]
    front = {ok_i[j] for j in frontier([ests[i] for i in ok_i], lambda e: e.time_s,
                                       lambda e: e.memory_bytes)}
    rows = []
    for i, (e, ok) in enumerate(zip(ests, fits)):
        mark = "   <- recommended" if i == best else "   (frontier)" if i in front else ""
        print(f"{str(e.grid):<10} {e.time_s:>9.4f} {e.comm_s:>9.4f} {e.compute_s:>9.4f} "
              f"{e.bytes_per_rank / 1e6:>9.2f} {e.memory_bytes / 2**30:>8.3f} "
              f"{'yes' if ok else 'no'}{mark}")
        rows.append({"grid": str(e.grid), "time_s": e.time_s, "comm_s": e.comm_s,
                     "compute_s": e.compute_s, "bytes_per_rank": e.bytes_per_rank,
                     "memory_bytes": e.memory_bytes, "fits": ok, "chosen": i == best,
                     "frontier": i in front})
    choice = None if best is None else str(ests[best].grid)
    print("no grid fits the memory limit" if choice is None else f"choice: grid {choice}")
    return {"model": "gcn", "rows": rows, "choice": choice}


def _plan_attention(args: argparse.Namespace, sizes: GraphSizes, shape: ModelShape,
                    prof: dict[str, Any] | None, limit: int | None) -> dict[str, Any]:
    reg = default_registry()
    names = reg.names() if not args.strategies else [s.strip() for s in
                                                     args.strategies.split(",") if s.strip()]
    for s in names:
        if s not in reg:
            raise UsageError(f"--strategies: unknown {s!r}; known: {', '.join(reg.names())}")
    w = workload(sizes, shape)
    sysm = system_model_for(prof)
    scales = scales_for(args.world_size)
    grids = None
    if w.gcn:
        coef = plexus_coefficients_for(prof)
        grids = {s: gps_grid(sizes, shape, s, coef) for s in scales if s > 1}
        print(f"GCN path: 1D (rows), or 3D on the 3D planner's grid for a {args.hidden} -> "
              f"{args.hidden} layer: "
              + (", ".join(f"{s} ranks {g}" for s, g in grids.items()) or "none (1 rank)"))
    pl = plan(w, [reg.get(s) for s in names], scales, sysm, limit, grids, args.head_parallel)
    lines = format_plan(pl)
    print("\n".join(lines[:-1]))
    fitting = [i for i, r in enumerate(pl.rows) if r.fits]
    front = [fitting[j] for j in frontier([pl.rows[i] for i in fitting],
                                          lambda r: r.est.time_s,
                                          lambda r: r.est.memory["total"])]
    print("Pareto frontier (no other fitting configuration is both faster and smaller): "
          + ("; ".join(f"{pl.rows[i].est.label} on {pl.rows[i].est.scale}: "
                       f"{pl.rows[i].est.time_s:.4g} s, "
                       f"{pl.rows[i].est.memory['total'] / 2**30:.3g} GiB" for i in front)
             or "none fits"))
    print(lines[-1])
    c = pl.choice
    out: dict[str, Any] = {
        "model": args.model, "k": pl.k,
        "rows": [{"strategy": r.est.strategy, "label": r.est.label,
                  "head_parallel": r.est.head_parallel, "scale": r.est.scale,
                  "time_s": r.est.time_s,
                  "alpha": r.est.alpha, "beta": r.est.beta, "comm_s": r.est.comm_s,
                  "comm_bytes": r.est.comm_bytes, "memory": r.est.memory, "fits": r.fits,
                  "passes": r.passes, "chosen": r.chosen, "why": r.why,
                  "frontier": i in front,
                  **(_gcn_fields(r.est) if w.gcn else {})} for i, r in enumerate(pl.rows)],
        "choice": None if c is None else {"strategy": c.est.strategy, "scale": c.est.scale,
                                          "head_parallel": c.est.head_parallel},
    }
    if w.gcn:
        out["gcn"] = {"grids": {str(s): str(g) for s, g in (grids or {}).items()},
                      "choice": None if c is None else _gcn_fields(c.est)}
    return out


def _gcn_fields(est: Any) -> dict[str, Any]:
    """The GCN path an estimate assumed: '1d' or '3d' and its grid."""
    return {"gcn_path": est.gcn_path,
            "gcn_grid": None if est.gcn_grid is None else str(est.gcn_grid)}


def _search(args: argparse.Namespace, sizes: GraphSizes, shape: ModelShape,
            prof: dict[str, Any] | None, limit: int | None) -> dict[str, Any]:
    """The whole-space search (:func:`plexgt.plan.choose.choose`) over every scale 1..P, and
    its choice on exactly P ranks (what ``plexgt train`` on P ranks runs); printed, and
    returned for the JSON."""
    sysm, coef = system_model_for(prof), plexus_coefficients_for(prof)
    names = [s.strip() for s in args.strategies.split(",")] if args.strategies else []
    strategy = names[0] if len(names) == 1 else "auto"
    kw = dict(memory_per_rank=limit, strategy=strategy, head_parallel=args.head_parallel)
    out: dict[str, Any] = {}
    for key, any_scale in (("any_scale", True), ("at_world_size", False)):
        try:
            got = choose(sizes, shape, args.world_size, sysm, coef, any_scale=any_scale, **kw)
        except ConfigError as e:
            print(f"search ({key.replace('_', ' ')}): {e}")
            out[key] = None
            continue
        rp, found = got
        out[key] = _run_plan_fields(rp)
        if any_scale:
            what = (f"{found.grids} grids, " if isinstance(found, GcnSearch) else "")
            print(f"search over every scale 1..{args.world_size}: {what}{found.priced} "
                  f"configurations priced, {getattr(found, 'pruned', 0)} dropped on memory "
                  f"before pricing, in {found.seconds:.2f} s")
            print(f"fastest that fits at any scale: {rp.label} on {rp.scale} ranks, "
                  f"{rp.time_s:.4g} s, {rp.memory_bytes / 2**30:.3g} GiB")
            front = [_config_fields(c) for c in found.frontier]
            print("frontier across scales (time vs memory per rank): " + "; ".join(
                f"{f['label']} on {f['scale']}: {f['time_s']:.4g} s, "
                f"{f['memory_bytes'] / 2**30:.3g} GiB" for f in front))
            out.update(priced=found.priced, pruned=getattr(found, "pruned", 0),
                       seconds=found.seconds, frontier=front,
                       best_per_scale=[_config_fields(c) for c in found.best_per_scale])
        else:
            print(f"on {args.world_size} ranks (what train --grid auto --strategy auto runs): "
                  f"{rp.label}, {rp.time_s:.4g} s, {rp.memory_bytes / 2**30:.3g} GiB")
    return out


def _run_plan_fields(rp: RunPlan) -> dict[str, Any]:
    return {"label": rp.label, "scale": rp.scale,
            "grid": None if rp.grid is None else str(rp.grid), "strategy": rp.strategy,
            "head_parallel": rp.head_parallel, "ring_chunks": rp.ring_chunks,
            "attention_block_rows": rp.attention_block_rows, "gcn_order": rp.gcn_order,
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
