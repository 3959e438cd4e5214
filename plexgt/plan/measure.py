"""``plexgt profile``'s measurements: collective and kernel microbenchmarks on this machine.

Run under ``mpiexec -n P plexgt profile --out system.json``. Measured:

* collectives (all_gather, reduce_scatter, all_to_all, all_reduce) over groups of ranks
  0..s-1 for s = 2, 4, ..., P (and P), over message sizes; x = the bytes one rank sends by the
  ledger's formula, so ``t = latency + s_per_byte · bytes`` prices any ledger entry directly;
* kernels on rank 0 alone: SpMM and SDDMM (per nonzero · column), GEMM (per multiply-add),
  the sparse-attention kernel forward + backward (per edge·head·d', per edge·head, and per
  row·head·d' and column·head·d' of the pattern: square graphs of several N/E ratios,
  rectangular [N/2, N] and [N/4, N] ones like GP-AG's local rows against the gathered
  columns, and sparse ones both ways, where the per-node costs dominate) and, on the square
  patterns, the ring's block kernel that rebuilds the scores in backward instead, a
  streaming elementwise op and a [N, h, d'] -> [h, N, d'] layout copy (per element, over sizes
  from cache-resident to DRAM-bound: the model reads the per-element cost as a curve), and the
  row-local part of a transformer block (projections, LayerNorms, FFN; forward + backward,
  per row·d² and per row·d, up to tens of thousands of rows), and whole one-rank gt and GCN
  training steps (forward, loss, backward, AdamW), which calibrate what each planner's kernel
  fits add up to (:func:`plexgt.plan.agp.step_calibration`,
  :func:`plexgt.plan.plexus_cost.gcn_step_calibration`); every kernel sample is the
  fastest of three (``--quick``: two) interleaved passes over all of them, so a disturbance
  of a few seconds spoils one pass, not the fits;
* threads (CPU): two of those steps (the first gt, the last GCN) again with 2, 4, ...
  threads up to the cores (``thread_speedup``), for ranks fewer than the cores, which each
  run cores/ranks threads;
* under load ("loaded"): the kernel mix run back to back on s ranks against rank 0 alone (a
  sustained contention, which time-slicing cannot hide from: s CPU ranks on fewer cores share
  them; one GPU per rank shares nothing; also stored as ``contention``), and alternated with
  a tiny all-reduce, which prices what a collective costs when peers are busy computing
  rather than waiting in lock-step (medians of alternated pairs: the difference is ~1 ms on
  loops whose own time drifts by more).

Ranks outside a measured group wait in a torch.distributed barrier (a blocking socket read on
gloo, not a spinning MPI wait), so they do not steal the cores being measured. The JSON names
the hardware (CPU model, cores, GPU) and the libraries (torch, MPI, backend), and stores under
"plexus" the four coefficients :class:`plexgt.plan.plexus_cost.Coefficients` takes.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp
import torch
import torch.distributed as dist

from plexgt.distributed import collectives as c
from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.distributed.grid import Grid3D
from plexgt.distributed.layout3d import layer_layouts
from plexgt.models.gt import GTBlock
from plexgt.models.layers import ffn, residual_norm, sparse_features
from plexgt.ops.attention import (
    sampled_addmm_available,
    sddmm,
    sparse_attention,
    spmm,
    torch_kernels_reason,
)
from plexgt.ops.csr import CSRGraph
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.ring import Ring, column_blocks, ring_attention
from plexgt.parallel.gt_dist import DistGraphTransformer
from plexgt.parallel.plexus3d import Plexus3DGCN, gcn_block_values
from plexgt.parallel.rows1d import RowParallel, build_dist_graph
from plexgt.plan.profile import (
    FORMAT,
    GT_STEP_SHAPE,
    KERNEL_KINDS,
    OPS,
    OPTIONAL_KINDS,
    STEP_KINDS,
    VERSION,
    fit_kernels,
    fit_linear,
    fit_plexus_coefficients,
)


# -- description of the machine ---------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_system(ctx: Any) -> dict[str, Any]:
    """Hardware and library versions of this run (what the numbers are valid for)."""
    hw: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "host": platform.node(),
        "device": str(ctx.device.type),
        "gpu": torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else None,
        # a ROCm GPU has no torch.sparse.sampled_addmm: plans made with this profile never
        # choose the strategies that need it (plexgt.plan.agp.unsupported)
        "rocm": not sampled_addmm_available(ctx.device),
    }
    sw: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                          "backend": ctx.backend, "threads_per_rank": torch.get_num_threads()}
    try:
        import mpi4py
        from mpi4py import MPI

        sw["mpi"] = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
        sw["mpi4py"] = mpi4py.__version__
    except ImportError:
        sw["mpi"] = None
    return {"hardware": hw, "software": sw, "world_size": ctx.world_size,
            "ranks_per_node": ctx.local_size}


# -- timing -----------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timings(fn: Callable[[], Any], device: torch.device, repeats: int, min_time: float = 0.0
            ) -> list[float]:
    """Seconds of at least ``repeats`` calls (after one warm-up call; at most 50)."""
    fn()
    _sync(device)
    times = []
    start = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
        if len(times) >= 50:
            break
    return times


def timeit(fn: Callable[[], Any], device: torch.device, repeats: int, min_time: float = 0.0
           ) -> float:
    """Fastest of at least ``repeats`` calls (after one warm-up call), in seconds.

    The minimum, not the median: on a shared machine the other jobs only ever add time, so the
    fastest call is the best estimate of the kernel's own cost.
    """
    return float(np.min(timings(fn, device, repeats, min_time)))


def group_sizes(world: int) -> list[int]:
    """2, 4, 8, ... up to the world size, and the world size itself."""
    out = [s for s in (2 ** k for k in range(1, 20)) if s <= world]
    if world > 1 and world not in out:
        out.append(world)
    return out


# -- collectives ------------------------------------------------------------------------------
def _collective(op: str, comm: Any, shard_elems: int, device: torch.device
                ) -> tuple[Callable[[], Any], int]:
    """A closure running ``op`` with a per-rank shard of ``shard_elems`` floats, and the bytes
    one rank sends by the ledger's formula (:mod:`plexgt.distributed.collectives`)."""

    p = comm.size
    x = torch.randn(shard_elems, dtype=torch.float32, device=device)
    full = torch.randn(p * shard_elems, dtype=torch.float32, device=device)
    b = shard_elems * 4
    if op == "all_gather":
        return (lambda: c._all_gather(x, comm, 0)), c.all_gather_bytes(b, p)
    if op == "reduce_scatter":
        return (lambda: c._reduce_scatter(full, comm, 0)), c.reduce_scatter_bytes(p * b, p)
    if op == "all_to_all":
        splits = [shard_elems // p] * p
        y = x[: sum(splits)]
        return (lambda: c._all_to_all(y, comm, splits, splits, 0)), (p - 1) * splits[0] * 4
    if op == "all_reduce":
        return (lambda: c._all_reduce(full, comm)), c.all_reduce_bytes(p * b, p)
    raise ValueError(op)


def profile_collectives(ctx: Any, sizes_bytes: list[int], repeats: int) -> dict[str, Any]:
    """{op: {s: [[bytes_sent, seconds], ...]}} for every group size of the world."""
    out: dict[str, dict[str, list[list[float]]]] = {op: {} for op in OPS}
    for s in group_sizes(ctx.world_size):
        members = list(range(s))
        group = dist.group.WORLD if s == ctx.world_size else dist.new_group(members)
        if ctx.rank in members:
            comm = Comm.from_group(group, f"g{s}", CommLedger())
            for op in OPS:
                rows = []
                for nbytes in sizes_bytes:
                    elems = max(s, nbytes // 4 // s * s)
                    fn, sent = _collective(op, comm, elems, ctx.device)
                    dist.barrier(group=group)
                    t = timeit(fn, ctx.device, repeats)
                    # on the group's device: an NCCL group has no CPU backend
                    tt = torch.tensor([t], dtype=torch.float64, device=ctx.device)
                    dist.all_reduce(tt, op=dist.ReduceOp.MAX, group=group)
                    rows.append([float(sent), float(tt.item())])
                out[op][str(s)] = rows
        dist.barrier()
    return out


# -- kernels ----------------------------------------------------------------------------------
def random_graph(n: int, deg: int, seed: int, device: torch.device, cols: int | None = None
                  ) -> Any:
    """[n, cols] (default n x n) pattern, ``deg`` uniform random columns a row (duplicates
    merged)."""

    cols = n if cols is None else cols
    g = torch.Generator().manual_seed(seed)
    dst = torch.arange(n).repeat_interleave(deg)
    src = torch.randint(0, cols, (n * deg,), generator=g)
    graph = CSRGraph.from_coo(dst, src, n, cols).to(device)
    graph.transpose()
    _ = graph.row
    return graph


def dense_block(rows: int, d: int, device: torch.device) -> Callable[[], Any]:
    """Forward + backward of a GT block without its attention kernel (rows [rows, d])."""

    blk = GTBlock(d, 4, 2, 0.0).to(device)
    x = torch.randn(rows, d, device=device, requires_grad=True)

    def run() -> None:
        a = blk.attn
        y = a.q(x) + a.k(x) + a.v(x) + a.o(x)
        h = residual_norm(x, y, blk.norm1)
        out = residual_norm(h, ffn(h, blk.ffn1, blk.ffn2), blk.norm2)
        out.sum().backward()

    return run


GT_STEPS = ((4000, 20, 64, 4), (16000, 10, 128, 8))
"""[N, degree, hidden, heads] of the whole gt training steps the profile times (2 layers, 128
input features, 8 classes): what calibrates the kernel sums of :mod:`plexgt.plan.agp`."""


def gt_step(n: int, deg: int, hidden: int, heads: int, device: torch.device
            ) -> tuple[int, Callable[[], Any]]:
    """(E, one training step of the row-parallel gt on one rank: forward, loss, backward,
    AdamW) on a uniform random graph of n nodes, ``deg`` neighbours a node: the code
    ``plexgt train`` runs (the registry's baseline strategy, whose collectives are the
    identity on one rank), not the single-process model, whose layout shortcuts make it
    faster."""

    shape = GT_STEP_SHAPE
    pattern = random_graph(n, deg, 200 + n, torch.device("cpu")).to_scipy()
    comm = Comm.single("rows", CommLedger())
    graph = build_dist_graph(n, pattern, comm, default_registry().baseline(), heads)
    model = DistGraphTransformer(shape["features"], hidden, shape["classes"], shape["layers"],
                                 heads, dropout=0.0, ffn_mult=shape["ffn_mult"])
    step = RowParallel(model, graph.to(device), comm).to(device)
    opt = torch.optim.AdamW(step.parameters(), lr=1e-3)
    x = torch.randn(n, shape["features"], device=device)
    y = torch.randint(0, shape["classes"], (n,), device=device)

    def run() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(step(x), y).backward()
        opt.step()

    return pattern.nnz, run


GCN_STEPS = ((8000, 16, 256, 64, 0.0), (16000, 16, 4096, 64, 0.005),
             (32768, 16, 512, 128, 0.0), (32768, 16, 8192, 64, 0.004))
"""[N, degree, F, hidden, input density (0: dense)] of the whole one-rank GCN steps (2 layers,
8 classes) that calibrate the 3D model's SpMM + GEMM sums
(:func:`plexgt.plan.plexus_cost.gcn_step_calibration`): dense inputs, and wide sparse ones
whose layer 0 is an SpMM both ways."""


def gcn_step(n: int, deg: int, features: int, hidden: int, density: float,
             device: torch.device) -> tuple[list[float], Callable[[], Any]]:
    """(the sample's sizes [N, E, F, C, hidden, layers, density], one training step of the
    3D GCN on a one-rank grid: forward, loss, backward, AdamW) on a uniform random graph with
    self loops and a dense or CSR input: the code ``plexgt train`` runs, its collectives the
    identity."""

    classes, layers = GT_STEP_SHAPE["classes"], GT_STEP_SHAPE["layers"]
    rng = np.random.default_rng(300 + n)
    a = (random_graph(n, deg, 300 + n, torch.device("cpu")).to_scipy()
         + sp.identity(n, format="csr")).tocsr()  # A + I, as prep stores it
    a.data[:] = 1.0
    d = np.diff(a.indptr)
    adj = gcn_block_values(a, d, d)
    if density:
        xs = sp.random(n, features, density=density, format="csr", random_state=rng,
                       dtype=np.float32)
        x: Any = sparse_features(xs, device)
        nnz_density = xs.nnz / (n * features)
    else:
        x, nnz_density = torch.randn(n, features, device=device), 0.0
    dims = [features, hidden, classes]
    lays = layer_layouts(Grid3D(1, 1, 1), 0, n, dims,
                         first_order="gemm_first" if density else None)
    ledger = CommLedger()
    comms = {name: Comm.single(name, ledger) for name in ("x", "y", "z", "plane")}
    model = Plexus3DGCN(lays, comms, [adj] * layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    y = torch.randint(0, classes, (n,), device=device)

    def run() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x)[:n], y).backward()
        opt.step()

    return [n, adj.nnz, features, classes, hidden, layers, nnz_density], run


def kernel_mix(device: torch.device) -> Callable[[], Any]:
    """A fixed GEMM + attention workload (for the contention measurement)."""

    graph = random_graph(3000, 16, 7, device)
    a = torch.randn(3000, 64, device=device)
    w = torch.randn(64, 64, device=device)
    q = torch.randn(3000, 4, 16, device=device, requires_grad=True)

    def run() -> None:
        for _ in range(4):
            a @ w
        sparse_attention(graph, q, q, q).sum().backward()

    return run


class Sample(NamedTuple):
    """One call :func:`profile_kernels` times; its row is ``[*sizes, seconds, *tail]``."""

    kind: str
    sizes: list[float]
    fn: Callable[[], Any]
    tail: tuple[float, ...] = ()
    """Sizes recorded after the seconds (attention's rows and cols, where later profile
    versions appended them)."""


def _attention_samples(g: Any, rows: int, cols: int, device: torch.device,
                       recompute: bool = False) -> list[Sample]:
    """Forward + backward of the attention kernel on ``g`` for three (h, d'): rows
    [E, h, d', seconds, rows, cols]; with ``recompute``, the same of the ring's block kernel
    on the whole pattern as one block (kind 'recompute'): what the ring strategies and blocked
    rows pay over the fused kernel (scores rebuilt in backward from the saved log-sum-exp,
    the block's rows gathered and merged)."""

    out: list[Sample] = []
    ring = None
    # a ROCm GPU runs the ring's blocks on the fused kernel only (no sampled_addmm there)
    if recompute and (sampled_addmm_available(device) or not torch_kernels_reason(32)):
        whole = ((0, cols),)
        ring = Ring(Comm.single("ring", CommLedger()), column_blocks(g, 1, cols, whole), whole)
    for h, dh in ((2, 16), (4, 16), (4, 32)):
        q = torch.randn(rows, h, dh, device=device, requires_grad=True)
        k = torch.randn(cols, h, dh, device=device, requires_grad=True)

        def att(g: Any = g, q: torch.Tensor = q, k: torch.Tensor = k) -> None:
            sparse_attention(g, q, k, k).sum().backward()

        out.append(Sample("attention", [g.num_edges, h, dh], att, (rows, cols)))
        if ring is not None:
            def rc(q: torch.Tensor = q, k: torch.Tensor = k, ring: Ring = ring) -> None:
                ring_attention(q, k, k, ring).sum().backward()

            out.append(Sample("recompute", [g.num_edges, h, dh], rc, (rows, cols)))
    return out


def gathered_sddmm(graph: CSRGraph, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[Nr, h, d] x [Nc, h, d] -> [h, E] as :func:`~plexgt.ops.attention.sddmm`, by gathering
    each edge's rows: what the profile times as the SDDMM where torch has none (ROCm GPUs;
    [E, h, d] temporaries, fine at the profile's sizes)."""
    return (a.index_select(0, graph.row) * b.index_select(0, graph.indices)).sum(-1).t()


def kernel_samples(device: torch.device, quick: bool) -> list[Sample]:
    """Every kernel call :func:`profile_kernels` times, with its sizes."""

    graphs = [(2000, 8), (4000, 32)] if quick else [(2000, 8), (8000, 16), (6000, 64),
                                                     (3000, 256), (32768, 16)]
    # [rows, cols] patterns with 2x and 4x more columns than rows: GP-AG's local rows against
    # the gathered K, V, which separates the kernel's per-row from its per-column costs
    # and sparse ones (2 edges a row) where those per-node costs are most of the time, in
    # both directions, so the fit can tell them from the per-edge ones
    rect = [(1000, 4000, 32)] if quick else [(2000, 8000, 16), (4096, 8192, 32),
                                             (8192, 32768, 16), (8192, 65536, 2),
                                             (65536, 8192, 2), (32768, 32768, 2)]
    out: list[Sample] = []
    for i, (n, deg) in enumerate(graphs):
        g = random_graph(n, deg, i, device)
        e = g.num_edges
        for d in (16, 64):
            x = torch.randn(1, n, d, device=device)
            vals = torch.rand(1, e, device=device)
            out.append(Sample("spmm", [e, d], lambda g=g, v=vals, x=x: spmm(g, v, x)))
            xn = x.transpose(0, 1)  # sddmm takes node-major [N, h, d]
            sd = sddmm if sampled_addmm_available(device) else gathered_sddmm
            out.append(Sample("sddmm", [e, d], lambda g=g, x=xn, f=sd: f(g, x, x)))
        out += _attention_samples(g, n, n, device, recompute=True)
    for i, (rows, cols, deg) in enumerate(rect):
        g = random_graph(rows, deg, 100 + i, device, cols)
        out += _attention_samples(g, rows, cols, device)
    shapes = [(4096, 64, 64), (16384, 64, 64)] if quick else [
        (4096, 64, 64), (16384, 64, 64), (16384, 128, 128), (32768, 64, 256), (8192, 512, 64)]
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device)
        b = torch.randn(k, n, device=device)
        out.append(Sample("gemm", [m, k, n], lambda a=a, b=b: a @ b))
    for n in ((1 << 18, 1 << 21) if quick else (1 << 18, 1 << 20, 1 << 22, 1 << 23)):
        # outputs written into buffers kept across calls: a fresh allocation of tens of MB is
        # an mmap whose page faults cost 1x-5x the pass itself, depending on whether the kernel
        # found huge pages that time (measured bimodal); what is priced is the streaming
        a = torch.randn(n, device=device)
        b = torch.randn(n, device=device)
        c = torch.empty(n, device=device)
        out.append(Sample("elementwise", [n],
                    lambda a=a, b=b, c=c: torch.mul(a, b, out=c).add_(a)))
        x = torch.randn(n // 64, 4, 16, device=device)
        y = torch.empty(4, n // 64, 16, device=device)
        out.append(Sample("copy", [n], lambda x=x, y=y: y.copy_(x.transpose(0, 1))))
    for d in (32, 64, 128):
        for rows in ((256, 2048) if quick else (256, 2048, 8192, 32768)):
            out.append(Sample("dense_block", [rows, d], dense_block(rows, d, device)))
    sh = GT_STEP_SHAPE
    for n, deg, hidden, heads in ((2000, 10, 32, 4), (4000, 8, 64, 4)) if quick else GT_STEPS:
        e, step = gt_step(n, deg, hidden, heads, device)
        out.append(Sample("gt_step", [n, e, sh["features"], sh["classes"], hidden, heads,
                                sh["layers"]], step))
    for n, deg, f, hidden, density in GCN_STEPS[:2] if quick else GCN_STEPS:
        sizes, step = gcn_step(n, deg, f, hidden, density, device)
        out.append(Sample("gcn_step", sizes, step))
    return out


def speedup_steps(samples: list[Sample]) -> list[Callable[[], Any]]:
    """The whole steps :func:`thread_speedup` times, taken from the profile's samples (built
    once): its first gt step and its last GCN step (the widest sparse input)."""
    gt = [x.fn for x in samples if x.kind == "gt_step"]
    gcn = [x.fn for x in samples if x.kind == "gcn_step"]
    return gt[:1] + gcn[-1:]


def thread_speedup(device: torch.device, threads: int, cores: int,
                   steps: list[Callable[[], Any]]) -> dict[str, float]:
    """{t: how much faster one rank runs whole training ``steps`` (:func:`speedup_steps`)
    with t threads than with ``threads``}, for t doubling up to the cores (and the cores):
    what a CPU rank gains when fewer ranks than cores run and each takes cores/ranks threads.
    Empty on GPUs and where one thread fills the cores. Medians of three calls per count and
    step over two passes, the counts interleaved."""
    if device.type != "cpu" or cores <= threads or not steps:
        return {}
    counts = sorted({*(t for t in (threads * 2 ** i for i in range(1, 12)) if t < cores),
                     cores})
    runs: dict[int, list[list[float]]] = {t: [[] for _ in steps] for t in [threads, *counts]}
    try:
        for _ in range(2):
            for t in runs:
                torch.set_num_threads(t)
                for i, step in enumerate(steps):
                    runs[t][i] += timings(step, device, 3)
    finally:
        torch.set_num_threads(threads)
    med = {t: [float(np.median(x)) for x in by] for t, by in runs.items()}
    return {str(t): float(np.median([b / x for b, x in zip(med[threads], med[t])]))
            for t in counts}


def profile_kernels(samples: list[Sample], device: torch.device, rounds: int
                    ) -> dict[str, list[list[float]]]:
    """Raw samples: spmm [nnz, cols, s], sddmm [nnz, cols, s], gemm [m, k, n, s],
    attention and recompute [E, h, d', s, rows, cols] (forward + backward), elementwise and copy
    [elements, s], dense_block [rows, d, s] (forward + backward), gt_step [N, E, F, C,
    hidden, heads, layers, s] (a whole one-rank training step).

    ``samples``: :func:`kernel_samples`. Each kernel sample is the fastest call over
    ``rounds`` passes through all of them (3, 2 for a quick profile), a few calls each: a
    disturbance lasting seconds then spoils one pass of a sample, not all its calls, so the
    fits, which weigh samples against each other, see the same machine state throughout. All
    samples' operands are alive at once for that (a few hundred MB on the full profile's
    sizes). A whole step is the **median** of its calls over
    the passes: the calibration it feeds sets what a typical step costs against the kernels'
    fastest calls, which is what a training run's epochs (and the planner's validation, by
    median step) see on a shared machine; their fastest step would price a quiet moment.
    """
    reps = 3
    times: list[list[float]] = [[] for _ in samples]
    for _ in range(rounds):
        for i, smp in enumerate(samples):
            times[i] += timings(smp.fn, device, reps)
    out: dict[str, list[list[float]]] = {k: [] for k in KERNEL_KINDS + OPTIONAL_KINDS
                                         + STEP_KINDS}
    for smp, ts in zip(samples, times):
        t = float(np.median(ts) if smp.kind in STEP_KINDS else np.min(ts))
        out[smp.kind].append([*smp.sizes, t, *smp.tail])
    return out


def sustained(fn: Callable[[], Any], device: torch.device, iters: int,
              group: Any = None) -> float:
    """Seconds per call of ``fn`` run ``iters`` times back to back on every rank of ``group``
    at once (after a warm-up call and a barrier): the slowest rank's wall time / iters.

    Unlike :func:`timeit`'s fastest call, this is a throughput: ranks time-sharing cores, or
    waiting for each other in a collective, pay it in full, as a training step does.
    """

    fn()
    _sync(device)
    if group is not None:
        dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    if group is not None:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def loaded_sync_cost(t_work: float, t_both: float, t_coll: float) -> float:
    """Extra seconds a collective call costs between busy compute phases: the loop of
    (work, tiny all-reduce) less the work alone and the all-reduce alone (never < 0)."""
    return max(0.0, t_both - t_work - t_coll)


def paired_medians(first: Callable[[], float], second: Callable[[], float], pairs: int
                   ) -> tuple[float, float, float]:
    """(median of first, median of second, median of second - first) over ``pairs`` back-to-
    back pairs of measurements.

    What the loaded measurement wants is a difference of two loops ~1 ms apart whose own
    times wander by more than that over seconds on a shared machine (one pair of 10-call
    loops put it anywhere from 0 to 2 ms a call): pairing cancels the drift, the median drops
    the pairs a disturbance hit.
    """
    a, b = [], []
    for _ in range(pairs):
        a.append(first())
        b.append(second())
    diff = np.median(np.array(b) - np.array(a))
    return float(np.median(a)), float(np.median(b)), float(diff)


def profile_loaded(ctx: Any, iters: int, pairs: int = 9) -> dict[str, dict[str, float]]:
    """{s: {"contention": sustained time of the kernel mix on s ranks at once / on rank 0
    alone, "sync_s": extra seconds per collective call when the s ranks compute between calls
    (:func:`loaded_sync_cost`)}} for every group size; each time the median of ``pairs``
    measurements, the work alone and with a call taken in alternation
    (:func:`paired_medians`).

    A training step alternates compute with collectives; a rank that reaches one waits for
    peers still computing, and, with more ranks than cores, for a descheduled peer's next
    time slice. The collective microbenchmarks, ranks in lock-step, see neither.
    """

    mix = kernel_mix(ctx.device)
    flag = torch.zeros(1, device=ctx.device)
    solo = (float(np.median([sustained(mix, ctx.device, iters) for _ in range(pairs)]))
            if ctx.rank == 0 else 0.0)
    dist.barrier()
    out: dict[str, dict[str, float]] = {}
    for s in group_sizes(ctx.world_size):
        members = list(range(s))
        group = dist.group.WORLD if s == ctx.world_size else dist.new_group(members)
        if ctx.rank in members:
            def coll(g: Any = group) -> None:
                dist.all_reduce(flag, group=g)

            def both(g: Any = group) -> None:
                mix()
                dist.all_reduce(flag, group=g)

            t_work, t_both, extra = paired_medians(
                lambda g=group: sustained(mix, ctx.device, iters, g),
                lambda g=group: sustained(both, ctx.device, iters, g), pairs)
            t_coll = float(np.median([sustained(coll, ctx.device, 4 * iters, group)
                                      for _ in range(3)]))
            if ctx.rank == 0:
                out[str(s)] = {"contention": max(1.0, t_work / solo),
                               "sync_s": loaded_sync_cost(t_work, t_work + extra, t_coll),
                               "work_s": t_work, "work_and_call_s": t_both, "call_s": t_coll}
        dist.barrier()
    return out


# -- the whole profile ------------------------------------------------------------------------
def run_profile(ctx: Any, quick: bool = False) -> dict[str, Any] | None:
    """Every measurement and fit; returns the profile on rank 0 (None elsewhere)."""

    t0 = time.perf_counter()
    prof: dict[str, Any] = {"format": FORMAT, "version": VERSION, **describe_system(ctx)}
    if quick:
        sizes, reps = [1 << 12, 1 << 16, 1 << 20], 3
    else:
        sizes, reps = [1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 21, 1 << 23], 5
    if ctx.world_size > 1:
        coll = profile_collectives(ctx, sizes, reps)
    else:
        coll = {op: {} for op in OPS}
    raw: dict[str, list[list[float]]] = {}
    speed: dict[str, float] = {}
    if ctx.rank == 0:
        samples = kernel_samples(ctx.device, quick)
        raw = profile_kernels(samples, ctx.device, 2 if quick else 3)
        speed = thread_speedup(ctx.device, torch.get_num_threads(),
                               prof["hardware"]["cores"], speedup_steps(samples))
        del samples  # the operands, a few hundred MB, before the loaded run
    loaded: dict[str, dict[str, float]] = {}
    if ctx.world_size > 1:
        dist.barrier()
        loaded = profile_loaded(ctx, 4 if quick else 10, 3 if quick else 9)
    # contention: the sustained kernel-mix slowdown the loaded run measured
    cont = {"1": 1.0, **{s: v["contention"] for s, v in loaded.items()}}
    if ctx.rank != 0:
        return None
    kfits = fit_kernels(raw)
    cfits = {op: {s: fit_linear(rows) for s, rows in by.items()} for op, by in coll.items()}
    prof.update(collectives=coll, collective_fits=cfits, kernels=raw, kernel_fits=kfits,
                contention=cont, loaded=loaded, thread_speedup=speed)
    prof["plexus"] = fit_plexus_coefficients(kfits, cfits)
    prof["seconds"] = round(time.perf_counter() - t0, 2)
    return prof
