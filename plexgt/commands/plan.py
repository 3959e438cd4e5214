"""``plexgt plan``: predicted time and memory per rank of every strategy and scale, and a choice.

gt / gps: the attention strategies (GP-AG, GP-A2A) x scales 1, 2, 4, ..., P, chosen by AGP
(:mod:`plexgt.plan.agp`); for gps each scale s > 1 is priced with the GCN path in the 1D
layout and 3D on the 3D planner's best grid of s ranks (as ``plexgt train`` with
``parallel.grid = "auto"`` decides), one row each, the path shown. gcn: every Gx x Gy x Gz
of P ranked by the 3D tensor-parallel cost model (:func:`plexgt.plan.plexus_cost.
rank_grids`). Sizes come from the prepared directory's manifest; machine coefficients from
``--profile`` (``plexgt profile``) or defaults. One process, no MPI.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from plexgt.data.loader import PreparedGraph
from plexgt.distributed.layout3d import layer_orders
from plexgt.errors import DataError, UsageError
from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.agp import format_plan, plan, scales_for
from plexgt.plan.choose import GraphSizes, ModelShape, gcn_dims, gps_grid, workload
from plexgt.plan.plexus_cost import Coefficients, rank_grids
from plexgt.plan.profile import read_profile
from plexgt.tasks.task import graph_sizes, plexus_coefficients_for, system_model_for

HELP = "Predict time and memory of each strategy and scale; choose one (AGP / Plexus)."
ESIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, type=Path, help="prepared directory (plexgt prep)")
    p.add_argument("--model", required=True, choices=["gcn", "gt", "gps"])
    p.add_argument("--world-size", required=True, type=int, help="ranks available (P)")
    p.add_argument("--profile", type=Path, help="system profile JSON from plexgt profile")
    p.add_argument("--memory-per-rank", type=float, metavar="GB",
                   help="memory per rank in GiB; what does not fit is never chosen")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4, help="attention heads (gt, gps)")
    p.add_argument("--ffn-mult", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=sorted(ESIZE))
    p.add_argument("--strategies", default=None,
                   help="comma-separated attention strategies (default: all registered)")
    p.add_argument("--json", type=Path, help="also write the table as JSON here")


def _manifest(path: Path) -> tuple[GraphSizes, str]:
    """The prepared graph's sizes (from its manifest alone) and its name."""
    pg = PreparedGraph(path)  # refuses directories without a manifest
    name = pg.manifest.get("name", str(path))
    pg.close()
    if pg.N < 1 or pg.E < 0:
        raise DataError(f"{path}: manifest has N={pg.N}, E={pg.E}")
    return graph_sizes(pg), name


def load_profile(path: Path | None) -> dict[str, Any] | None:
    """The profile JSON, validated (UsageError naming the file when it is not one)."""
    if path is None:
        return None
    try:
        return read_profile(path)
    except ValueError as e:
        raise UsageError(f"--profile {e}") from None


def _check(args: argparse.Namespace) -> None:
    for name in ("world_size", "hidden", "layers", "heads", "ffn_mult"):
        v = getattr(args, name)
        if v < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be positive (got {v})")
    if args.memory_per_rank is not None and not args.memory_per_rank > 0:
        raise UsageError(f"--memory-per-rank must be positive (got {args.memory_per_rank})")
    if args.model != "gcn" and args.hidden % args.heads:
        raise UsageError(f"--hidden {args.hidden} is not divisible by --heads {args.heads}")


def run(args: argparse.Namespace) -> int:
    _check(args)
    sizes, name = _manifest(args.data)
    prof = load_profile(args.profile)
    limit = None if args.memory_per_rank is None else int(args.memory_per_rank * 2**30)
    shape = ModelShape(args.model, args.hidden, args.layers, args.heads, args.ffn_mult,
                       ESIZE[args.dtype])
    src = f"profile {args.profile}" if prof else "default coefficients (no --profile)"
    print(f"{name}: {args.model} on up to {args.world_size} ranks, {src}")
    if args.model == "gcn":
        table = _plan_gcn(args, sizes, shape, prof, limit)
    else:
        table = _plan_attention(args, sizes, shape, prof, limit)
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(table, indent=1) + "\n")
        except OSError as e:
            raise UsageError(f"--json {args.json}: {e.strerror or e}") from None
    return 0 if table.get("choice") else 1


def _plan_gcn(args: argparse.Namespace, sizes: GraphSizes, shape: ModelShape,
              prof: dict[str, Any] | None, limit: int | None) -> dict[str, Any]:
    coef = Coefficients.from_profile(prof)
    dims = gcn_dims(sizes, shape)
    nnz = sizes.e  # the stored pattern, self loops included (what train's grid choice prices)
    ests = rank_grids(args.world_size, sizes.n, nnz, dims, shape.esize, coef, limit)
    print(f"dims {dims}, nnz(Â) = {nnz}, layer orders {layer_orders(dims)}")
    print(f"{'grid':<10} {'time s':>9} {'comm s':>9} {'compute s':>9} {'MB/rank':>9} "
          f"{'mem GiB':>8} fits")
    fits = [limit is None or e.memory_bytes <= limit for e in ests]
    best = next((i for i, f in enumerate(fits) if f), None)
    rows = []
    for i, (e, ok) in enumerate(zip(ests, fits)):
        mark = "   <- recommended" if i == best else ""
        print(f"{str(e.grid):<10} {e.time_s:>9.4f} {e.comm_s:>9.4f} {e.compute_s:>9.4f} "
              f"{e.bytes_per_rank / 1e6:>9.2f} {e.memory_bytes / 2**30:>8.3f} "
              f"{'yes' if ok else 'no'}{mark}")
        rows.append({"grid": str(e.grid), "time_s": e.time_s, "comm_s": e.comm_s,
                     "compute_s": e.compute_s, "bytes_per_rank": e.bytes_per_rank,
                     "memory_bytes": e.memory_bytes, "fits": ok, "chosen": i == best})
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
    pl = plan(w, [reg.get(s) for s in names], scales, sysm, limit, grids)
    print("\n".join(format_plan(pl)))
    c = pl.choice
    out: dict[str, Any] = {
        "model": args.model, "k": pl.k,
        "rows": [{"strategy": r.est.strategy, "scale": r.est.scale, "time_s": r.est.time_s,
                  "alpha": r.est.alpha, "beta": r.est.beta, "comm_s": r.est.comm_s,
                  "comm_bytes": r.est.comm_bytes, "memory": r.est.memory, "fits": r.fits,
                  "passes": r.passes, "chosen": r.chosen, "why": r.why,
                  **(_gcn_fields(r.est) if w.gcn else {})} for r in pl.rows],
        "choice": None if c is None else {"strategy": c.est.strategy, "scale": c.est.scale},
    }
    if w.gcn:
        out["gcn"] = {"grids": {str(s): str(g) for s, g in (grids or {}).items()},
                      "choice": None if c is None else _gcn_fields(c.est)}
    return out


def _gcn_fields(est: Any) -> dict[str, Any]:
    """The GCN path an estimate assumed: '1d' or '3d' and its grid."""
    return {"gcn_path": est.gcn_path,
            "gcn_grid": None if est.gcn_grid is None else str(est.gcn_grid)}
