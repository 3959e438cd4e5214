"""``plexgt profile``'s measurements: collective and kernel microbenchmarks on this machine.

Run under ``mpiexec -n P plexgt profile --out system.json``. Measured:

* collectives (all_gather, reduce_scatter, all_to_all, all_reduce) over groups of ranks
  0..s-1 for s = 2, 4, ..., P (and P), over message sizes; x = the bytes one rank sends by the
  ledger's formula, so ``t = latency + s_per_byte · bytes`` prices any ledger entry directly;
* kernels on rank 0 alone (the calls and sizes: :mod:`plexgt.plan.kernel_samples`): the
  GCN's SpMM (per call, per output row · column and per nonzero · column, from patterns of
  one or two nonzeros a row to hundreds, so that a rank's thin block is priced at what it
  costs, not per nonzero alone), SDDMM (per nonzero · column), GEMM (per multiply-add),
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
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from plexgt.distributed import collectives as c
from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.ops import native
from plexgt.ops.attention import sampled_addmm_available
from plexgt.plan.batch_profile import (
    contention_samples,
    measure_batch_profile,
    measure_collectives,
)
from plexgt.plan.batch_shape import BatchShape
from plexgt.plan.batch_table import profile_table
from plexgt.plan.kernel_samples import Sample, kernel_mix, kernel_samples
from plexgt.plan.profile import (
    FORMAT,
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
    """Raw samples: spmm [nnz, cols, s, rows], sddmm [nnz, cols, s], gemm [m, k, n, s],
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
BATCH_SHAPE = BatchShape(layers=4, hidden=64, heads=8, size=256, sequences=4, features=128,
                         classes=8, targets=64)
"""The node-sequence model the profile's ``batch`` table is measured at (no sampler: its
cache and sequence building stay counted); a plan of another width carries its rates over
by the counted ratios (:func:`~plexgt.plan.batch_table.from_table`)."""


def run_profile(ctx: Any, quick: bool = False) -> dict[str, Any] | None:
    """Every measurement and fit; returns the profile on rank 0 (None elsewhere)."""

    if ctx.device.type == "cpu":
        # every rank has the compiled CPU kernels before anything is timed: a build (the first
        # use after an upgrade) inside the measurements holds a core for a minute, and one
        # did: 2 threads measured 0.11x as fast as 1 (1.6-1.8x on a quiet VM)
        native.load()
        if ctx.world_size > 1:
            dist.barrier()
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
    batch_coll = measure_collectives(3 if quick else 5) if ctx.world_size > 1 else None
    # the node sharing of the node-sequence model's blocks, measured on these ranks now (not
    # the kernel mix's: its compute is dense GEMMs and attention tiles)
    kappa = contention_samples(BATCH_SHAPE, repeats=3 if quick else 7)
    if ctx.rank != 0:
        return None
    bprof, _ = measure_batch_profile(BATCH_SHAPE, (1, 2) if quick else (1, 2, 4),
                                     repeats=3 if quick else 5, collectives=batch_coll,
                                     contention=kappa)
    kfits = fit_kernels(raw)
    cfits = {op: {s: fit_linear(rows) for s, rows in by.items()} for op, by in coll.items()}
    prof.update(collectives=coll, collective_fits=cfits, kernels=raw, kernel_fits=kfits,
                contention=cont, loaded=loaded, thread_speedup=speed)
    prof["plexus"] = fit_plexus_coefficients(kfits, cfits)
    prof["batch"] = profile_table(bprof, BATCH_SHAPE)
    prof["seconds"] = round(time.perf_counter() - t0, 2)
    return prof
