"""3D tensor-parallel GCN on Coauthor Physics, side by side with its baselines, in one run.

1. 1 rank: epoch time of Plexus3DGCN (grid 1x1x1; layer orders 'auto', and all
   'aggregate_first' for comparison) against PyG GCNConv (same layers, cached Â).
2. 8 ranks: communication bytes per rank (ledger) of every 3D grid against the 1D row partition.
3. 1 -> 2 ranks: speedup of the best 2-rank grid over 1 rank (one thread per rank, 2 cores).
4. The planner's predicted epoch time against the measured one for every factorisation of 8
   (oversubscribed), with Spearman's rank correlation. Coefficients are calibrated in this run
   (SpMM and GEMM from the 1-rank epoch, bytes/latency from an all-reduce sweep at 8 ranks).

Usage: python -m perf.bench_plexus [--epochs 3] [--hidden 64] [--rounds 3]. Workers are started with
mpiexec; results go to perf/results/bench_plexus.json, last line ``RESULT ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from perf.gcn1d_baseline import Row1DGCN, read_row1d
from perf.harness import (
    DATASETS_DIR,
    JobFailed,
    gnn_benchmark,
    hardware,
    launch,
    module,
    mpiexec,
    prepared,
    result_line,
    today,
    write_json,
)
from plexgt.data.formats.gnn_benchmark import read_gnn_benchmark
from plexgt.data.graph import GraphData, random_split, symmetrize
from plexgt.data.loader import PreparedGraph
from plexgt.distributed.bootstrap import init_distributed, shutdown
from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.distributed.grid import block_bounds, build_groups, factorizations, padded, parse_grid
from plexgt.distributed.layout3d import layer_layouts
from plexgt.parallel.plexus3d import Plexus3DGCN, plexus_comms
from plexgt.parallel.plexus_loss import _ParallelCrossEntropy, parallel_cross_entropy
from plexgt.plan.plexus_cost import Coefficients, estimate, row1d_step_bytes
from plexgt.tasks.gcn import read_plexus_inputs


def _physics() -> GraphData:
    g = symmetrize(read_gnn_benchmark(gnn_benchmark("physics")))
    g.splits = random_split(g.num_nodes, 0)
    return g


# ------------------------------------------------------------------------------ workers
def worker_plexus(args: argparse.Namespace) -> None:
    ctx = init_distributed("gloo")
    grid = parse_grid(args.grid)
    pg = PreparedGraph(args.data)
    dims = [pg.F, args.hidden, pg.C]
    lays = layer_layouts(grid, ctx.rank, pg.N, dims, args.order)
    ledger = CommLedger()
    groups = build_groups(grid, ctx.rank, ctx.world_size, ctx.timeout)
    comms = plexus_comms(groups, ledger, lays[-1])
    data = read_plexus_inputs(pg, lays, torch.float32)
    model = Plexus3DGCN(lays, comms, data.adj, dropout=0.0, block_rows=args.block_rows)
    torch.manual_seed(0)
    ref = [torch.nn.Linear(a, b) for a, b in zip(dims, dims[1:])]
    model.load_full([(m.weight, m.bias) for m in ref])
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)

    def epoch() -> float:
        opt.zero_grad()
        loss = parallel_cross_entropy(model(data.x), data.labels, data.masks["train"], lays[-1],
                                      comms)
        loss.backward()
        opt.step()
        return loss.item()

    epoch()
    ledger.reset()
    torch.distributed.barrier()
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        epoch()
    torch.distributed.barrier()
    dt = (time.perf_counter() - t0) / args.epochs
    sent = ledger.total(kind="sent") // args.epochs
    spmm_nnz_cols = sum(
        a.nnz * (lay.d_out // lay.g[1] * 2 if lay.order == "gemm_first"
                 else lay.d_in // lay.g[1] * (2 if lay.layer else 1))
        for a, lay in zip(model.adj, lays))
    calib = {}
    if args.calibrate:
        calib = _calibrate(model, data, lays, ctx) if ctx.world_size == 1 else _comm_sweep(ctx)
    rows = [None] * ctx.world_size if ctx.rank == 0 else None
    torch.distributed.gather_object(sent, rows, dst=0)
    if ctx.rank == 0:
        print("JSON " + json.dumps({"grid": str(grid), "ranks": ctx.world_size, "epoch_s": dt,
                                    "bytes_per_rank_max": max(rows), "bytes_per_rank": rows,
                                    "orders": [lay.order for lay in lays],
                                    "spmm_nnz_cols": spmm_nnz_cols,
                                    **calib}), flush=True)
    shutdown(ctx)


def _calibrate(model, data, lays, ctx) -> dict:  # noqa: ANN001 - bench internals
    """Seconds per SpMM nonzero·column and per GEMM multiply-add on this machine."""
    adj = model.adj[0]
    # a dense operand of the features' shape: the SpMM's time is the shape's, and the input
    # itself may be CSR (prep's auto layout stores Physics' 0.39%-dense features so)
    h = torch.randn(adj.shape[1], min(64, lays[0].d_in),
                    generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    for blk in adj.fwd:
        torch.sparse.mm(blk, h)
    spmm = (time.perf_counter() - t0) / max(1, adj.nnz * h.shape[1])
    a, b = torch.randn(4096, 512), torch.randn(512, 128)
    a @ b
    t0 = time.perf_counter()
    for _ in range(5):
        a @ b
    gemm = (time.perf_counter() - t0) / (5 * 4096 * 512 * 128)
    return {"spmm_s_per_nnz_col": spmm, "gemm_s_per_fma": gemm}


def _comm_sweep(ctx) -> dict:  # noqa: ANN001
    """Latency and seconds per byte of an all-reduce among all ranks (least squares)."""
    sizes, times = [], []
    for nbytes in (1 << 12, 1 << 18, 1 << 21, 1 << 23):
        x = torch.zeros(nbytes // 4)
        dist.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(3):
            dist.all_reduce(x)
        times.append((time.perf_counter() - t0) / 3)
        p = ctx.world_size
        sizes.append(2 * (p - 1) * nbytes / p)
    slope, icpt = np.polyfit(sizes, times, 1)
    return {"latency_s": max(float(icpt), 1e-6), "s_per_byte": max(float(slope), 1e-12)}


def worker_row1d(args: argparse.Namespace) -> None:
    ctx = init_distributed("gloo")
    pg = PreparedGraph(args.data)
    p = ctx.world_size
    ledger = CommLedger()
    comm = Comm.from_group(torch.distributed.group.WORLD, "world", ledger)
    adj, feats = read_row1d(pg, p, ctx.rank, 2)
    rp = padded(pg.N, p) // p
    model = Row1DGCN(comm, pg.N, [pg.F, args.hidden, pg.C], adj)
    x = torch.zeros(rp, pg.F)
    x[: feats.shape[0]] = torch.from_numpy(feats.astype(np.float32))
    rows = block_bounds(pg.N, p, ctx.rank)
    lab = torch.full((rp,), -1, dtype=torch.long)
    lab[: rows[1] - rows[0]] = torch.from_numpy(pg.read_labels(rows, "P"))
    mask = torch.zeros(rp, dtype=torch.bool)
    mask[: rows[1] - rows[0]] = torch.from_numpy(pg.read_mask("train", rows, "P"))
    t0 = time.perf_counter()
    loss = _ParallelCrossEntropy.apply(model(x), lab, mask, 0, pg.C,
                                       Comm.single("plane", ledger), comm)
    loss.backward()
    dt = time.perf_counter() - t0
    sent = [None] * p if ctx.rank == 0 else None
    torch.distributed.gather_object(ledger.total(kind="sent"), sent, dst=0)
    if ctx.rank == 0:
        print("JSON " + json.dumps({"ranks": p, "bytes_per_rank_max": max(sent),
                                    "step_s": dt}), flush=True)
    shutdown(ctx)


def worker_pyg(args: argparse.Namespace) -> None:
    try:  # PyG is an optional baseline (the perf extra): without it the row is empty
        import torch_geometric
        from torch_geometric.nn import GCNConv
    except ImportError:
        print("JSON " + json.dumps({"pyg": None}), flush=True)
        return
    pg = PreparedGraph(args.data)
    a = pg.read_adjacency("A1").tocoo()
    # the graph in P order on both sides: relabel columns Q -> P through the permutations
    pp, pq = pg.read_perm("P"), pg.read_perm("Q")
    pinv = np.empty_like(pp)
    pinv[pp] = np.arange(pg.N)
    src = torch.from_numpy(pinv[pq[a.col]].astype(np.int64))
    dst = torch.from_numpy(a.row.astype(np.int64))
    keep = src != dst  # GCNConv adds the self loops itself
    ei = torch.stack([src[keep], dst[keep]])
    x = torch.from_numpy(pg.read_features()[np.argsort(pinv[pq])].astype(np.float32))
    y = torch.from_numpy(pg.read_labels(None, "P"))
    m = torch.from_numpy(pg.read_mask("train", None, "P"))
    torch.manual_seed(0)
    c1, c2 = GCNConv(pg.F, args.hidden, cached=True), GCNConv(args.hidden, pg.C, cached=True)
    opt = torch.optim.AdamW([*c1.parameters(), *c2.parameters()], lr=0.01)

    def epoch() -> None:
        opt.zero_grad()
        out = c2(torch.relu(c1(x, ei)), ei)
        torch.nn.functional.cross_entropy(out[m], y[m]).backward()
        opt.step()

    epoch()
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        epoch()
    print("JSON " + json.dumps({"pyg": torch_geometric.__version__,
                                "epoch_s": (time.perf_counter() - t0) / args.epochs}),
          flush=True)


# ------------------------------------------------------------------------------ driver
def _run(cmd: list[str]) -> dict:
    """The JSON line a worker printed; :class:`~perf.harness.JobFailed` when it failed."""
    r = launch(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=3600)
    line = [l for l in r.stdout.splitlines() if l.startswith("JSON ")][-1]
    return json.loads(line[5:])


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 1 << 34


def _spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=["plexus", "row1d", "pyg"])
    ap.add_argument("--data")
    ap.add_argument("--grid", default="1x1x1")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--block-rows", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds of the 1- and 2-rank runs (fastest kept)")
    ap.add_argument("--order", default="auto",
                    help="GCN layer order: auto, aggregate_first or gemm_first")
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "plexgt-bench"))
    args = ap.parse_args()
    if args.worker:
        {"plexus": worker_plexus, "row1d": worker_row1d, "pyg": worker_pyg}[args.worker](args)
        return

    if not gnn_benchmark("physics").exists():
        sys.exit(f"bench_plexus: Coauthor Physics not found under {DATASETS_DIR}")
    data = prepared(Path(args.workdir) / "physics", _physics, tiles=8, seed=0)
    me = module("perf.bench_plexus", "--data", str(data), "--epochs", str(args.epochs),
                "--hidden", str(args.hidden))
    # parts 1 and 3 in interleaved rounds, the fastest of each kept: load from other jobs on a
    # shared machine then falls on every variant alike instead of on whichever ran during it
    runs: dict[str, list[dict]] = {}
    variants = {
        "one": mpiexec(1, [*me, "--worker", "plexus", "--grid", "1x1x1"]),
        "one_agg": mpiexec(1, [*me, "--worker", "plexus", "--grid", "1x1x1",
                               "--order", "aggregate_first"]),
        "pyg": [*me, "--worker", "pyg"],
        **{g: mpiexec(2, [*me, "--worker", "plexus", "--grid", g])
           for g in ("2x1x1", "1x2x1", "1x1x2")},
    }
    for rnd in range(args.rounds):
        for name, cmd in variants.items():
            calib = ["--calibrate"] if name == "one" and rnd == 0 else []
            runs.setdefault(name, []).append(_run(cmd + calib))

    def fastest(name: str) -> dict:
        best = dict(min(runs[name], key=lambda r: r.get("epoch_s", float("inf"))))
        best["epoch_s_rounds"] = [r.get("epoch_s") for r in runs[name]]
        return best

    one, one_agg, pyg = fastest("one"), fastest("one_agg"), fastest("pyg")
    two = [fastest(g) for g in ("2x1x1", "1x2x1", "1x1x2")]
    pg = PreparedGraph(data)
    dims = [pg.F, args.hidden, pg.C]
    # 8 ranks share this machine's memory: a grid the memory model says will not fit in an
    # eighth of what is available now is skipped (and reported), as the planner would
    skipped, failed, eight = [], [], []
    for g in sorted(factorizations(8),
                    key=lambda g: estimate(g, pg.N, pg.E, dims, 4, Coefficients()).memory_bytes):
        need = estimate(g, pg.N, pg.E, dims, 4, Coefficients()).memory_bytes
        if need > _available_bytes() * 0.8 / 8:
            skipped.append({"grid": str(g), "predicted_mem_bytes": need,
                            "available_per_rank": _available_bytes() // 8})
            continue
        try:
            eight.append(_run(mpiexec(8, [*me, "--worker", "plexus", "--grid", str(g),
                                          *(["--calibrate"] if not eight else [])])))
        except JobFailed as e:  # e.g. killed for memory: report it, go on
            failed.append({"grid": str(g), "predicted_mem_bytes": need, "error": str(e)[-500:]})
            continue
        eight[-1]["predicted_mem_bytes"] = need
    row1d = _run(mpiexec(8, [*me, "--worker", "row1d"]))
    cores = len(os.sched_getaffinity(0))
    calib = runs["one"][0]  # the calibrated launch (round 0)
    coef = Coefficients(spmm_s_per_nnz_col=calib["spmm_s_per_nnz_col"],
                        gemm_s_per_fma=calib["gemm_s_per_fma"],
                        latency_s=eight[0]["latency_s"], s_per_byte=eight[0]["s_per_byte"])
    for r in eight:
        est = estimate(parse_grid(r["grid"]), pg.N, pg.E, dims, 4, coef)
        r["predicted_s"] = est.time_s
        # 8 single-thread ranks share the usable cores: compute runs that many times slower
        r["predicted_oversubscribed_s"] = est.comm_s + est.compute_s * max(1.0, 8 / cores)
    rho_over = _spearman([r["predicted_oversubscribed_s"] for r in eight],
                         [r["epoch_s"] for r in eight])
    rho = _spearman([r["predicted_s"] for r in eight], [r["epoch_s"] for r in eight])
    best8 = min(eight, key=lambda r: r["bytes_per_rank_max"])
    best2 = min(two, key=lambda r: r["epoch_s"])
    row1d_formula = row1d_step_bytes(8, pg.N, dims, 4)
    out = {
        "date": today(),
        "hardware": hardware(),
        "note": "CPU only; one thread per rank (OMP_NUM_THREADS=1); 8 ranks oversubscribed on "
                "the cores listed; float32; GCN 2 layers, hidden as given; AdamW step included",
        "dataset": "Coauthor Physics (symmetrised, self loops)", "N": pg.N, "nnz": pg.E,
        "F": pg.F, "C": pg.C, "hidden": args.hidden, "epochs_timed": args.epochs,
        "rounds_1_and_2_ranks": args.rounds,
        "one_rank": one, "one_rank_aggregate_first": one_agg, "pyg": pyg,
        "two_ranks": two, "eight_ranks": eight,
        "row1d_8": row1d, "row1d_8_formula_bytes": row1d_formula,
        "skipped_8_memory": skipped, "failed_8": failed,
        "coefficients": coef.__dict__, "spearman_pred_vs_measured_8": rho,
        "spearman_oversubscribed_pred_vs_measured_8": rho_over,
    }
    path = write_json("bench_plexus.json", out)
    print(f"wrote {path}")
    for r in eight:
        print(f"  8 ranks {r['grid']:>6}: {r['epoch_s']:.3f} s/epoch (predicted "
              f"{r['predicted_s']:.3f}, x{8 / cores:.0f} oversubscribed "
              f"{r['predicted_oversubscribed_s']:.3f}), "
              f"{r['bytes_per_rank_max'] / 2**20:.1f} MiB/rank")
    result_line(
        dataset="coauthor-physics",
        t1_plexus_s=one["epoch_s"],
        t1_pyg_s=pyg.get("epoch_s", float("nan")),
        ratio_vs_pyg=one["epoch_s"] / pyg["epoch_s"] if pyg.get("epoch_s") else float("nan"),
        t1_aggregate_first_s=one_agg["epoch_s"],
        best3d_grid_8=best8["grid"],
        bytes_best3d_8=best8["bytes_per_rank_max"],
        bytes_row1d_8=row1d["bytes_per_rank_max"],
        bytes_ratio_3d_vs_1d=best8["bytes_per_rank_max"] / row1d["bytes_per_rank_max"],
        speedup_1_to_2=one["epoch_s"] / best2["epoch_s"],
        best2_grid=best2["grid"],
        spearman_8=rho,
    )


if __name__ == "__main__":
    main()
