"""Inference against training: ``plexgt predict``'s memory and time beside one training
epoch of the same model, on the same graph, ranks and layout.

    python -m perf.bench_predict [--models gcn gt gps] [--ranks 2] [--datasets DIR]

For each model a checkpoint is trained (``plexgt train``, 2 epochs); then two fresh jobs of
``--ranks`` ranks (a worker of this module under mpiexec) build the model from it exactly as
``plexgt predict`` does (:mod:`plexgt.training.inference`) and measure, each rank:

* train: one training step (forward, loss, backward, AdamW; the second step, so AdamW's
  moments exist as in every epoch after the first), :func:`plexgt.training.loop.step`;
* predict: loading the checkpoint's model, the inference forward, and the whole predict
  (forward, the exchange into node-id blocks, writing the file: Parquet unless
  ``--format``).

Memory is the peak of the window (on a CPU the resident set's high-water mark after
``clear_refs``; on a GPU the caching allocator's peak), reported whole and above the
resident set both jobs share once the model and data are built (the *base*: torch, the
graph, the parameters), max over ranks. On this CPU the base is mostly torch itself, so the
part above it is where training and inference differ. So that the resident set follows the
tensors alive, the workers run with glibc's mmap threshold fixed at 64 KiB (every larger
buffer is returned to the system when freed, instead of staying in the heap after the
warm-up step) and trim the heap before each window.

Against PyG full-batch inference, on one rank: two more fresh 1-rank jobs (the same worker,
mpiexec and environment) measure the forward alone, ``--repeats`` times (each its own
window; time: the median, memory: the largest peak):

* forward: the checkpoint's model as ``plexgt predict`` builds it on 1 rank, its weights
  loaded before the base is read, :func:`plexgt.training.inference.infer` (eval mode,
  ``torch.inference_mode``);
* pyg: the same architecture from ``torch_geometric.nn`` layers (:func:`pyg_model`), its
  weights random (time and memory do not depend on them), on the same prepared graph (its
  Q-ordered adjacency as ``edge_index``, self loops included, and its dense features),
  ``model.eval()`` under ``torch.inference_mode``. GCN's normalised edge weights (gcn_norm)
  are computed once before the base, as plexgt's Â is part of its graph; for gcn a second
  PyG run passes Â as a torch.sparse CSR ``adj_t`` (PyG's sparse-matrix-multiply path)
  instead of ``edge_index`` (gather-scatter).

PyG is an optional extra: without it the PyG rows say so and the rest runs.

Graph: Amazon Computers (gnn-benchmark, symmetrised) from ``--datasets``, else an SBM
graph of ``--nodes`` / ``--edges``.
Writes perf/results/bench_predict.json (with /proc/loadavg before and after: the cores are
shared) and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from perf.harness import (
    DATASETS_DIR,
    GNN_BENCHMARK,
    JobFailed,
    hardware,
    launch,
    module,
    mpiexec,
    plexgt,
    prep_sbm,
    prepared,
    result_line,
    today,
    trim_heap,
    write_json,
)
from plexgt.config import TrainConfig
from plexgt.data.loader import PreparedGraph, read_adjacency_q
from plexgt.data.predictions import PredictionsWriter, node_id_base
from plexgt.distributed.bootstrap import init_distributed, shutdown
from plexgt.distributed.collectives import CommLedger
from plexgt.tasks import build_task
from plexgt.training.inference import (
    checkpoint_config,
    find_checkpoint,
    infer,
    load_weights,
    node_block,
    predictions_schema,
    write_block,
)
from plexgt.training.loop import peak_memory_bytes, reset_peak_memory, step
from plexgt.training.numerics import apply_numerics

SETTINGS = {
    "gcn": ["--model.hidden=128", "--model.layers=2"],
    "gt": ["--model.hidden=128", "--model.heads=4", "--model.layers=2"],
    "gps": ["--model.hidden=128", "--model.heads=4", "--model.layers=2"],
}


def current_memory(device: torch.device) -> int:
    """Bytes held now: the resident set on a CPU, allocated tensors on a GPU."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _max_over_ranks(values: dict[str, float], device: torch.device) -> dict[str, float]:
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(values, t.cpu().tolist()))


def forward_windows(fn: Callable[[], Any], device: torch.device, repeats: int
                    ) -> tuple[dict[str, float], dict[str, list[float]]]:
    """``fn()`` ``repeats`` times, each in its own window (heap trimmed, peak reset, the
    previous output freed first): ({'peak': the largest peak, 'seconds': the median time},
    every repeat's times and peaks). The same for plexgt's forward and PyG's."""
    secs: list[float] = []
    peaks: list[float] = []
    for _ in range(repeats):
        trim_heap()
        reset_peak_memory(device)
        t0 = time.perf_counter()
        got = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        secs.append(time.perf_counter() - t0)
        peaks.append(float(peak_memory_bytes(device)))
        del got
    return ({"peak": max(peaks), "seconds": statistics.median(secs)},
            {"repeat_seconds": secs, "repeat_peaks": peaks})


def pyg_model(cfg: TrainConfig, in_dim: int, classes: int) -> nn.Module:
    """The checkpoint's architecture (``cfg.model``) from torch_geometric.nn layers, random
    weights: x [N, F] -> logits [N, C] given (edge_index [2, E], Â's edge weights [E]) or a
    sparse Â as ``adj_t`` [N, N].

    gcn: GCNConv(F, h) -> ReLU -> ... -> GCNConv(h, C), normalize=False (Â given). gt:
    Linear(F, h), per block X1 = LN(X + TransformerConv(X)), X2 = LN(X1 + FFN(X1)), Linear(h,
    C); TransformerConv(h, h/heads, heads, root_weight) is plexgt's attention sublayer term by
    term (Q from the destination, K and V from the source, softmax over each node's in-edges
    scaled by 1/sqrt(h/heads), + X W_o: its lin_skip). gps: the same plus the GCN path,
    H = LN(X + GCNConv(X)) + LN(X + TransformerConv(X)), X' = LN(H + FFN(H)), which PyG's own
    GPSConv is not (its attention is dense over all N nodes). Only the options these runs use
    (post-norm LayerNorm for gt/gps, no norm/residual/projection for gcn, no super nodes, no
    jumping knowledge, no edge features)."""
    # PyG is an optional extra (the perf baseline), imported only when it runs
    from torch_geometric.nn import GCNConv, TransformerConv

    m = cfg.model
    plain = (m.jk == "none" and m.node_embedding == 0 and m.super_nodes == 0)
    if m.name == "gcn" and plain and m.residual == "none" and m.norm_kind(False) == "none" \
            and not (m.input_proj or m.head):
        return _PygGCN(GCNConv, [in_dim] + [m.hidden] * (m.layers - 1) + [classes])
    if m.name in ("gt", "gps") and plain and m.norm_kind(True) == "layer" and not m.pre_norm:
        return _PygGT(GCNConv, TransformerConv, in_dim, m.hidden, classes, m.layers, m.heads,
                      m.ffn_mult, m.name == "gps")
    raise ValueError(f"bench_predict: no PyG baseline for model {m.name} with these options "
                     "(gcn plain, gt/gps post-norm LayerNorm only)")


class _PygGCN(nn.Module):
    def __init__(self, gcn: type, dims: list[int]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(gcn(a, b, normalize=False) for a, b in zip(dims, dims[1:]))

    def forward(self, x: torch.Tensor, graph: tuple, gcn: tuple) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, *gcn)
            if i < len(self.convs) - 1:
                x = torch.relu(x)
        return x


class _PygBlock(nn.Module):
    def __init__(self, gcn: type, transformer: type, d: int, heads: int, ffn_mult: int,
                 local: bool) -> None:
        super().__init__()
        self.attn = transformer(d, d // heads, heads=heads, root_weight=True)
        self.norm_attn = nn.LayerNorm(d)
        self.local = gcn(d, d, normalize=False) if local else None
        self.norm_local = nn.LayerNorm(d) if local else None
        self.ffn1, self.ffn2 = nn.Linear(d, ffn_mult * d), nn.Linear(ffn_mult * d, d)
        self.norm_out = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, gcn: tuple) -> torch.Tensor:
        h = self.norm_attn(x + self.attn(x, edge_index))
        if self.local is not None:
            assert self.norm_local is not None
            h = h + self.norm_local(x + self.local(x, *gcn))
        return self.norm_out(h + self.ffn2(torch.relu(self.ffn1(h))))


class _PygGT(nn.Module):
    def __init__(self, gcn: type, transformer: type, in_dim: int, d: int, classes: int,
                 layers: int, heads: int, ffn_mult: int, local: bool) -> None:
        super().__init__()
        self.input = nn.Linear(in_dim, d)
        self.blocks = nn.ModuleList(_PygBlock(gcn, transformer, d, heads, ffn_mult, local)
                                    for _ in range(layers))
        self.classifier = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor, graph: tuple, gcn: tuple) -> torch.Tensor:
        h = self.input(x)
        for blk in self.blocks:
            h = blk(h, *graph, gcn)
        return self.classifier(h)


def pyg_inputs(pg: PreparedGraph, device: torch.device, sparse: bool
               ) -> tuple[torch.Tensor, tuple, tuple]:
    """The prepared graph as PyG takes it, in Q order: dense x [N, F] float32, (edge_index
    [2, E] source -> destination, self loops as stored), and GCN's Â: (edge_index, weights)
    by gcn_norm, or with ``sparse`` (adj_t,) as a torch.sparse CSR [N, N]."""
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    a = read_adjacency_q(pg).tocoo()
    ei = torch.stack([torch.from_numpy(a.col.astype("int64")),
                      torch.from_numpy(a.row.astype("int64"))]).to(device)
    x = torch.from_numpy(pg.read_features().astype("float32")).to(device)
    gi, gw = gcn_norm(ei, None, pg.N, add_self_loops=True)
    gcn: tuple = (gi, gw)
    if sparse:
        gcn = (torch.sparse_coo_tensor(gi.flip(0), gw, (pg.N, pg.N)).coalesce()
               .to_sparse_csr(),)
    return x, (ei,), gcn


def worker_pyg(args: argparse.Namespace) -> None:
    """One 1-rank job (under mpiexec, like the others, but no process group): the PyG model
    of the checkpoint's architecture, random weights, forward ``args.repeats`` times."""
    try:
        import torch_geometric
    except ImportError:
        print("BENCH " + json.dumps({"pyg": None}), flush=True)
        return
    cp = find_checkpoint(args.checkpoint)
    cfg = checkpoint_config(cp, args.data, None, None)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.seed)
    pg = PreparedGraph(cfg.data)
    x, graph, gcn = pyg_inputs(pg, device, args.pyg_sparse)
    model = pyg_model(cfg, pg.F, pg.C).to(device).eval()
    trim_heap()
    out: dict[str, Any] = {"base": current_memory(device)}
    with torch.inference_mode():
        got, reps = forward_windows(lambda: model(x, graph, gcn), device, args.repeats)
    out.update(got, **reps, pyg=torch_geometric.__version__,
               params=sum(p.numel() for p in model.parameters()), edges=int(graph[0].shape[1]),
               self_loops=int((graph[0][0] == graph[0][1]).sum()),
               gcn_input="adj_t (torch.sparse CSR)" if args.pyg_sparse
               else "edge_index + edge_weight", device=str(device))
    print("BENCH " + json.dumps(out), flush=True)


def worker(args: argparse.Namespace) -> None:
    """One job (under mpiexec): build the checkpoint's model as predict does, measure
    ``args.worker`` ('train' or 'predict'), print rank 0's JSON line (max over ranks)."""
    cp = find_checkpoint(args.checkpoint)
    cfg = checkpoint_config(cp, args.data, None, args.strategy)
    apply_numerics(cfg)
    torch.manual_seed(cfg.seed)
    ctx = init_distributed(cfg.parallel.backend, cfg.parallel.timeout_s)
    task = build_task(cfg, ctx, CommLedger(device=ctx.device))
    dist.barrier()
    trim_heap()
    out: dict[str, float] = {}
    reps: dict[str, list[float]] = {}
    if args.worker == "train":
        opt = torch.optim.AdamW(task.model.parameters(), lr=cfg.optim.lr,
                                weight_decay=cfg.optim.weight_decay)
        out["base"] = current_memory(ctx.device)
        step(cfg, task, opt, 0, ctx.device)  # AdamW's moments come into being here
        trim_heap()
        out["before_step"] = current_memory(ctx.device)
        _, step_s, wait_s = step(cfg, task, opt, 1, ctx.device)  # resets the peak itself
        out.update(peak=peak_memory_bytes(ctx.device), seconds=step_s + wait_s)
    elif args.worker == "forward":
        load_weights(cp, cfg, ctx, task)
        trim_heap()
        out["base"] = current_memory(ctx.device)
        with torch.inference_mode():
            got, reps = forward_windows(lambda: infer(task, ctx), ctx.device, args.repeats)
        out.update(got, params_this_rank=sum(p.numel() for p in task.model.parameters()))
    else:
        pg = PreparedGraph(cfg.data)
        trim_heap()
        out["base"] = current_memory(ctx.device)
        reset_peak_memory(ctx.device)
        t0 = time.perf_counter()
        load_weights(cp, cfg, ctx, task)
        out["load_seconds"] = time.perf_counter() - t0
        with torch.inference_mode():
            inf = infer(task, ctx)
            out.update(forward_peak=peak_memory_bytes(ctx.device), forward_seconds=inf.seconds)
            t1 = time.perf_counter()
            block = node_block(task, pg, inf, None, node_id_base(pg))
        del inf
        writer = PredictionsWriter(Path(args.out), ctx.rank, ctx.world_size, True,
                                   predictions_schema(task, pg, cfg, cp, None, None))
        if ctx.rank == 0:
            writer.check()
        write_block(writer, block, ctx)
        out.update(peak=peak_memory_bytes(ctx.device),
                   export_seconds=time.perf_counter() - t1,
                   seconds=time.perf_counter() - t0)
    out = _max_over_ranks(out, ctx.device)
    if ctx.rank == 0:
        print("BENCH " + json.dumps({**out, **reps, "grid": task.grid,
                                     "strategy": task.strategy, "device": str(ctx.device)}),
              flush=True)
    shutdown(ctx)


def _job(args: argparse.Namespace, mode: str, ck: Path, data: Path, work: Path,
         ranks: int | None = None, *extra: str) -> dict:
    spec = ["--worker", mode, "--checkpoint", str(ck), "--data", str(data), "--out",
            str(work / f"pred.{args.format}"), "--repeats", str(args.repeats), *extra]
    if args.strategy:
        spec += ["--strategy", args.strategy]
    r = launch(mpiexec(ranks or args.ranks, module("perf.bench_predict", *spec)),
               env=dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536"))
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("BENCH "))
    return json.loads(line.removeprefix("BENCH "))


def _vs_pyg(args: argparse.Namespace, model: str, ck: Path, data: Path, work: Path
            ) -> dict[str, Any]:
    """plexgt's 1-rank forward against PyG's (and, for gcn, PyG's with a sparse Â): the
    three jobs' numbers and the ratios plexgt / PyG (of the median time, of the peak above
    each job's base, of the whole peak)."""
    mine = _job(args, "forward", ck, data, work, 1)
    theirs = []
    for sparse in ([False, True] if model == "gcn" else [False]):
        p = _job(args, "pyg", ck, data, work, 1, *(["--pyg-sparse"] if sparse else []))
        row: dict[str, Any] = {"pyg_sparse": sparse, "run": p}
        if p.get("pyg"):
            row["ratio"] = {"seconds": mine["seconds"] / p["seconds"],
                            "above_base": (mine["peak"] - mine["base"])
                            / max(1.0, p["peak"] - p["base"]),
                            "peak": mine["peak"] / p["peak"]}
        theirs.append(row)
    return {"plexgt": mine, "pyg": theirs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gcn", "gt", "gps"],
                    choices=["gcn", "gt", "gps"])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--strategy", help="gt, gps: the attention strategy (default: the plan's)")
    ap.add_argument("--format", default="parquet", choices=["parquet", "h5", "npy"],
                    help="predict's output format")
    ap.add_argument("--datasets", type=Path, default=DATASETS_DIR)
    ap.add_argument("--nodes", type=int, default=20000, help="SBM fallback")
    ap.add_argument("--edges", type=int, default=400000, help="SBM fallback")
    ap.add_argument("--repeats", type=int, default=3,
                    help="1-rank forwards of plexgt and of PyG (time: their median)")
    ap.add_argument("--no-pyg", action="store_true",
                    help="leave out the 1-rank plexgt-against-PyG forwards")
    ap.add_argument("--worker", choices=["train", "predict", "forward", "pyg"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--pyg-sparse", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "pyg":
        worker_pyg(args)
        return 0
    if args.worker:
        worker(args)
        return 0
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    src = args.datasets / "gnn-benchmark" / GNN_BENCHMARK["computers"]
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        if src.exists():
            name = "Amazon Computers (symmetrised, self loops, 60/20/20 random split)"
            data = prepared(work / "computers", ["--format", "gnn-benchmark", "--input",
                                                 str(src), "--symmetrize"])
        else:
            name = f"SBM {args.nodes} nodes, {args.edges} edges"
            data = prep_sbm(work / "sbm", args.nodes, args.edges, 8, 64)
        for model in args.models:
            ck = work / f"{model}-ck"
            cmd = plexgt("train", "--data", str(data), "--model", model, "--epochs", "2",
                         "--checkpoint-dir", str(ck), "--progress=false", *SETTINGS[model],
                         *(["--strategy", args.strategy] if args.strategy and model != "gcn"
                           else []))
            try:
                launch(mpiexec(args.ranks, cmd), env=dict(os.environ, OMP_NUM_THREADS="1"))
                train = _job(args, "train", ck, data, work)
                pred = _job(args, "predict", ck, data, work)
            except JobFailed as e:
                raise SystemExit(f"bench_predict: {model}: {e}") from e
            mib = 2**20
            runs[model] = {
                "layout": f"{train['grid']} {train['strategy']}", "train": train,
                "predict": pred,
                "peak_ratio": pred["peak"] / train["peak"],
                "above_base_mib": {"train": (train["peak"] - train["base"]) / mib,
                                   "predict_forward": (pred["forward_peak"] - pred["base"])
                                   / mib,
                                   "predict": (pred["peak"] - pred["base"]) / mib},
                "above_base_ratio": (pred["peak"] - pred["base"])
                / max(1.0, train["peak"] - train["base"]),
                "forward_over_step": pred["forward_seconds"] / train["seconds"],
                "predict_over_step": pred["seconds"] / train["seconds"],
            }
            if not args.no_pyg:
                try:
                    runs[model]["vs_pyg"] = _vs_pyg(args, model, ck, data, work)
                except JobFailed as e:
                    raise SystemExit(f"bench_predict: {model} against PyG: {e}") from e
            print(f"bench_predict: {model}: {json.dumps(runs[model])}", file=sys.stderr,
                  flush=True)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    write_json("bench_predict.json", {"bench": "predict", "date": today(),
                                      "hardware": hardware(), "dataset": name,
                                      "ranks": args.ranks, "format": args.format,
                                      "repeats": args.repeats,
                                      "loadavg_before": load_before,
                                      "loadavg_after": load_after,
                                      "settings": SETTINGS,
                                      "runs": runs})
    fields = {}
    for model, r in runs.items():
        fields[f"{model}_mem_ratio"] = r["above_base_ratio"]
        fields[f"{model}_time_ratio"] = r["predict_over_step"]
    for model, r in runs.items():
        for v in r.get("vs_pyg", {}).get("pyg", []):
            if v.get("ratio"):
                tag = "pyg_sparse" if v["pyg_sparse"] else "pyg"
                fields[f"{model}_{tag}_mem_ratio"] = v["ratio"]["above_base"]
                fields[f"{model}_{tag}_time_ratio"] = v["ratio"]["seconds"]
    result_line(bench="predict", ranks=args.ranks, **fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
