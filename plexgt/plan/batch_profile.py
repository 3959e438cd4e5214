"""The node-sequence (batch layout) cost model's Profile step: what
:class:`~plexgt.plan.batch_fits.BatchProfile` needs, measured on this machine.

What is timed, each forward + backward on one process with the model registry's batch-layout
model (its real block, GA-CP's real attention) at the shape being planned:

* one block at several (B, N') points per P_cp: a cp member's rows (N'/P_cp + N_s queries)
  against all N' + N_s columns, the ring run on a :meth:`~plexgt.distributed.collectives.
  Comm.loopback` group, so its P_cp blocks and online-softmax merges are computed and its
  exchanges are local copies (the exchanges are priced apart, by the ``ring`` curve);
* the embedding (rows of one micro-batch) and the head (targets), the optimizer (AdamW with
  the loop's clipping, per parameter), and with a sampler the building of one sequence;
* collectives: under a world of >= 2 ranks, neighbour exchanges (p2p and the ring) and
  all-reduces over groups of 2, 4, ... (:func:`measure_collectives`); otherwise the system
  profile's curves (:func:`~plexgt.plan.batch_fits.default_profile` of it).

Each time is the fastest of ``repeats`` after a warm-up, fitted by non-negative least
squares on relative error (the :class:`~plexgt.plan.batch_fits.BlockFit` terms).

Memory: the peak resident bytes of a few single-process stages (blocks, embed / head, P_cp
on the loopback, K micro-batches all alive as GPipe holds them, AdamW state), glibc made to
map every block over 128 KiB on its own and return freed memory (so the resident set counts
live memory, as ``perf/validate_plan.py`` measures), the high-water mark reset before the
measured step (``/proc/self/clear_refs``); fitted as measured = scale · (counted without the
score workspace) + scale · copies · (one score block's bytes) + base, giving
``memory_scale``, ``score_copies`` and ``memory_base_bytes`` (with a sampler, its cache's
footprint measured apart is the base's floor).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from scipy.optimize import nnls

from plexgt.distributed.collectives import Comm, CommLedger, partition_group
from plexgt.plan.agp import SystemModel
from plexgt.plan.batch_cost import RING_MESSAGES
from plexgt.plan.batch_fits import BatchProfile, BlockFit, Fit, default_profile
from plexgt.plan.batch_memory import memory_parts
from plexgt.plan.batch_shape import BatchMesh, BatchShape
from plexgt.plan.batch_stage import StageInputs, fastest_time, run_stage, stage_model
from plexgt.plan.profile import fit_linear

Tensor = torch.Tensor
SIZES = (128, 256, 512)
"""Sequence lengths N' a block is timed at (those P_cp divides)."""
BATCHES = (1, 2, 4)
"""Sequences B per micro-batch a block is timed at."""
CLIP_NORM = 1.0
"""The loop's gradient clipping, timed with the optimizer."""


# -- time -------------------------------------------------------------------------------
def block_samples(shape: BatchShape, cps: Sequence[int], dropout: float = 0.1,
                  repeats: int = 3, sizes: Sequence[int] = SIZES,
                  batches: Sequence[int] = BATCHES) -> list[list[float]]:
    """[P_cp, B, N', seconds] of one block's forward + backward on cp member 0."""
    model = stage_model(shape, 1, False, False, dropout).train()
    out = []
    for cp in cps:
        for size in sizes:
            if size % cp:
                continue
            for b in batches:
                inp = StageInputs(shape, b, size, cp)
                t = fastest_time(lambda inp=inp: run_stage(model, inp, 1), repeats)
                out.append([cp, b, size, t])
    return out


def rel_nnls(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error: min |a·c / t - 1|."""
    coef, _ = nnls(a / t[:, None], np.ones_like(t))
    return coef


def fit_blocks(samples: list[list[float]], shape: BatchShape) -> dict[int, BlockFit]:
    """P_cp -> :class:`BlockFit` (per call, per row, per row x column; the merges folded
    into the per-row term at each P_cp), from :func:`block_samples`."""
    out = {}
    for cp in sorted({int(r[0]) for r in samples}):
        rows = [r for r in samples if int(r[0]) == cp]
        a = np.array([[1.0, r[1] * (r[2] // cp + shape.global_nodes),
                       r[1] * (r[2] // cp + shape.global_nodes) * (r[2] + shape.global_nodes)]
                      for r in rows])
        c = rel_nnls(a, np.array([r[3] for r in rows]))
        out[cp] = BlockFit(float(c[0]), float(c[1]), float(c[2]))
    return out


def edge_samples(shape: BatchShape, dropout: float = 0.1, repeats: int = 3,
                 sizes: Sequence[int] = SIZES, batches: Sequence[int] = BATCHES
                 ) -> dict[str, list[list[float]]]:
    """{'embed': [B, rows, s], 'head': [B, targets, s]}: the first stage's embedding and the
    last stage's head and loss alone, forward + backward."""
    emb = stage_model(shape, 0, True, False, dropout).train()
    head = stage_model(shape, 0, False, True, dropout).train()
    out: dict[str, list[list[float]]] = {"embed": [], "head": []}
    for size in sizes:
        for b in batches:
            inp = StageInputs(shape, b, size, 1)
            t_emb = fastest_time(lambda i=inp: run_stage(emb, i, 1), repeats)
            out["embed"].append([b, size, t_emb])
            t = min(shape.targets, size)
            out["head"].append([b, t, fastest_time(lambda i=inp: run_stage(head, i, 1), repeats)])
    return out


def fit_rows(rows: list[list[float]]) -> BlockFit:
    """per call + b·rows·per row from [b, rows, seconds]."""
    a = np.array([[1.0, r[0] * r[1]] for r in rows])
    c = rel_nnls(a, np.array([r[2] for r in rows]))
    return BlockFit(float(c[0]), float(c[1]))


def optimizer_seconds_per_param(shape: BatchShape, repeats: int = 3, blocks: int = 4) -> float:
    """AdamW's step with the loop's clipping over ``blocks`` blocks' parameters, per
    parameter."""
    model = stage_model(shape, blocks, False, False, 0.0)
    params = [p for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3)

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
        opt.step()

    return fastest_time(step, repeats) / max(1, sum(p.numel() for p in params))


def sample_samples(sampler: Any, repeats: int = 6) -> list[list[float]]:
    """[1, N', seconds per sequence] of ``sampler.sequence('train', 0, i)`` (a
    :class:`~plexgt.data.node_batches.NodeBatches`), its cache warmed first."""
    n = sampler.batch.size
    count = max(1, sampler.sequences("train"))
    for i in range(min(count, 4)):
        sampler.sequence("train", 0, i)
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        sampler.sequence("train", 1, i % count)
        times.append(time.perf_counter() - t0)
    return [[1, n, float(min(times))]]


# -- collectives -------------------------------------------------------------------------
COMM_BYTES = (1 << 12, 1 << 16, 1 << 20, 1 << 22)


def measure_collectives(repeats: int = 5, sizes: Sequence[int] = COMM_BYTES
                        ) -> dict[str, Any] | None:
    """Under an initialised world of >= 2 ranks (every rank calls it): neighbour exchanges
    around the world's ring ([bytes, s], what a pipeline's p2p and GA-CP's ring do) and
    all-reduces over groups of 2, 4, ... ranks ({group: [bytes, s]}), the slowest rank's
    median; None without such a world."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    w, r = dist.get_world_size(), dist.get_rank()

    def timed(fn: Callable[[], None]) -> float:
        fn()
        ts = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        t = torch.tensor([statistics.median(ts)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    p2p = []
    for nb in sizes:
        x = torch.zeros(nb // 4)
        y = torch.empty_like(x)

        def exchange(x: Tensor = x, y: Tensor = y) -> None:
            ops = [dist.P2POp(dist.isend, x, (r + 1) % w), dist.P2POp(dist.irecv, y, (r - 1) % w)]
            for q in dist.batch_isend_irecv(ops):
                q.wait()

        p2p.append([float(nb), timed(exchange)])
    ar: dict[str, list[list[float]]] = {}
    g = 2
    while g <= w:
        groups = [dist.new_group(list(range(s, s + g))) for s in range(0, w - w % g, g)]
        mine = groups[r // g] if r < len(groups) * g else None
        rows = []
        for nb in sizes:
            x = torch.zeros(nb // 4)

            def reduce(x: Tensor = x, grp: Any = mine) -> None:
                if grp is not None:
                    dist.all_reduce(x, group=grp)

            rows.append([float(nb), timed(reduce)])
        ar[str(g)] = rows
        g *= 2
    return {"p2p": p2p, "allreduce": ar}


RING_FLOOR_S = 1e-6
"""Least seconds an exchange is recorded at (the difference of two noisy times can go
negative)."""
RING_POINTS = ((1, 256), (4, 256), (4, 512))
"""(B, N') a real cp ring of 2 is timed at (:func:`ring_samples`)."""


def ring_samples(shape: BatchShape, dropout: float = 0.1, repeats: int = 5,
                 points: Sequence[tuple[int, int]] = RING_POINTS) -> list[list[float]]:
    """Under an initialised world of >= 2 ranks (every rank calls it): GA-CP's exchanges
    on a real ring, [bytes of one exchange, seconds each]. Ranks 0 and 1 form a cp group
    and time one block's forward + backward at each (B, N') of ``points``, once on the group
    and once each on a loopback ring of 2 (the same computation, exchanges local copies),
    both members at once so the cores are shared alike; the slowest member's fastest of
    ``repeats``. An exchange costs (group - loopback) / its RING_MESSAGES exchanges: its
    transfer and the wait for the partner's compute to reach it, which on shared cores is
    most of it (~1-2 ms here against 0.3 ms for an idle neighbour exchange, and cp was
    priced 10-25 % fast without it). The other ranks wait; [] outside such a world."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return []
    out: list[list[float]] = []
    # the world in pairs, each rank a member of one (partition_group: its ranks agree on it
    # whatever groups came before): a world-wide new_group([0, 1]), which the other ranks do
    # not hold, left every later members-only group's creation hanging in gloo's rendezvous
    # (the multi-rank suite hung in the next test at 3 and 4 ranks)
    r, w = dist.get_rank(), dist.get_world_size()
    grp = partition_group([list(range(s, min(s + 2, w))) for s in range(0, w, 2)], r)
    if r < 2:
        comm = Comm.from_group(grp, "cp", CommLedger())
        model = stage_model(shape, 1, False, False, dropout).train()

        def timed(inp: StageInputs) -> float:
            run_stage(model, inp, 1)
            ts = []
            for _ in range(repeats):
                dist.barrier(group=grp)
                t0 = time.perf_counter()
                run_stage(model, inp, 1)
                ts.append(time.perf_counter() - t0)
            t = torch.tensor([min(ts)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=grp)
            return float(t.item())

        for b, size in points:
            if size % 2:
                continue
            real = timed(StageInputs(shape, b, size, 2, comm=comm))
            loop = timed(StageInputs(shape, b, size, 2))
            nbytes = 2 * b * (size // 2) * shape.hidden * shape.esize  # K and V, 1 block
            out.append([float(nbytes), max(RING_FLOOR_S, (real - loop) / RING_MESSAGES)])
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, out)
    return got[0]


CONTENTION_S = 0.15
"""Seconds a contention sample lasts alone: past a scheduler slice, so p ranks time-share."""


def contention_samples(shape: BatchShape, dropout: float = 0.1, repeats: int = 7,
                       ranks: Sequence[int] = (2, 4), points: Sequence[tuple[int, int]]
                       | None = None, seconds: float = CONTENTION_S) -> dict[int, float]:
    """Under an initialised world (every rank calls it): {p: κ(p)} for each p of ``ranks``
    the world holds. A sample: block forward + backwards (P_cp = 1) at each (B, N') of
    ``points`` (default B = 1 and all the step's sequences, at the model's N'), repeated to
    last ``seconds`` alone, run by ranks 0..p-1 at once (the slowest's time; the other ranks
    wait in a barrier, asleep as a bubble's stage is). The sizes 1, 2, 4 are sampled in
    turn ``repeats`` times, and κ(p) is the median over the rounds of the p-rank time over
    the alone time of the same round: adjacent samples see the same outside load (fastest
    of 3 per size apart gave κ(2) = 1.09, 1.98, 2.69 for three models in a row here). It is
    the node sharing under *this* run's load (the quick calibration's cached κ(2) = 1.87,
    taken under another, priced W = 2 35 % slow). {} outside a world of >= 2 ranks."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return {}
    model = stage_model(shape, 1, False, False, dropout).train()
    points = points or ((1, shape.size), (shape.sequences, shape.size))
    inputs = [StageInputs(shape, b, size, 1) for b, size in points]
    me, sizes = dist.get_rank(), [1, *(p for p in ranks if p <= dist.get_world_size())]

    def sweep() -> None:
        for inp in inputs:
            run_stage(model, inp, 1)

    def slowest(t: float) -> float:
        x = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return float(x.item())

    sweep()  # warm-up; then how many sweeps last ``seconds`` (rank 0's, shared)
    t0 = time.perf_counter()
    sweep()
    calls = int(slowest(min(50.0, np.ceil(seconds / max(1e-6, time.perf_counter() - t0))
                            if me == 0 else 0.0)))
    rounds: dict[int, list[float]] = {p: [] for p in sizes}
    for _ in range(repeats):
        for p in sizes:
            dist.barrier()
            t0 = time.perf_counter()
            if me < p:
                for _ in range(max(1, calls)):
                    sweep()
            rounds[p].append(slowest(time.perf_counter() - t0 if me < p else 0.0))
    return {p: float(statistics.median(t / a for t, a in zip(rounds[p], rounds[1])))
            for p in sizes[1:]}


# -- memory ------------------------------------------------------------------------------
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


@contextlib.contextmanager
def memory_mode() -> Iterator[None]:
    """glibc maps every block over 128 KiB on its own and returns freed memory (the resident
    set then counts live memory); afterwards blocks up to 32 MiB come from the heap again, as
    a training run settles (perf/validate_plan.py's two modes)."""
    try:
        libc: Any = ctypes.CDLL("libc.so.6")
    except OSError:
        libc = None
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, 128 << 10)
        libc.mallopt(M_TRIM_THRESHOLD, 0)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
            libc.mallopt(M_TRIM_THRESHOLD, 64 << 20)


def trim() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> bool:
    """Reset the resident high-water mark (False where the kernel does not let us)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return rss()


def stage_peak(shape: BatchShape, mesh: BatchMesh, blocks: int, pos: int, dropout: float = 0.1
               ) -> int:
    """Peak resident bytes of one rank of a stage of ``blocks`` blocks at position ``pos``
    (0 first, 1 middle, 2 last, 3 the only stage) in its third GPipe step (all K
    micro-batches forward, then backward, then AdamW), above the level before it was built."""
    b = shape.sequences // (mesh.dp * mesh.micro_batches)
    with memory_mode():
        trim()
        base = rss()
        model = stage_model(shape, blocks, pos in (0, 3), pos in (2, 3), dropout).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        inputs = [StageInputs(shape, b, shape.size, mesh.cp, seed=k)
                  for k in range(mesh.micro_batches)]
        peak = 0
        for step in range(3):
            if step == 2:
                trim()
                reset_peak()
            outs = [run_stage(model, inp, step, backward=False) for inp in inputs]
            for o in reversed(outs):
                o.backward(None if o.dim() == 0 else torch.ones_like(o))
            del outs
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step == 2:
                peak = peak_rss() - base
        del model, opt, inputs
        trim()
    return max(0, peak)


MEMORY_POINTS = ((1, 1, 1, 4, 3), (4, 1, 1, 4, 3), (1, 1, 2, 4, 3), (1, 2, 1, 4, 0),
                 (2, 1, 1, 2, 1), (1, 1, 4, 2, 2), (1, 2, 2, 4, 3))
"""(K, dp, cp, blocks, pos) stages whose peak fits the memory terms; the first two differ
only in K, which separates the per-micro-batch workspace from what every sequence saves."""


def memory_samples(shape: BatchShape, dropout: float = 0.1,
                   points: Sequence[tuple[int, int, int, int, int]] = MEMORY_POINTS,
                   peak: Callable[..., int] | None = None) -> list[list[float]]:
    """[K, dp, cp, blocks, pos, peak bytes] of :func:`stage_peak` (or ``peak``) at
    ``points`` (those the shape's sequences and size allow), after one discarded warm-up
    measurement: a process's first training step grows it once (autograd's and the
    allocator's first-use state: 130 MiB for a 4-block stage measured first here, 38 MiB
    measured again), which the run being predicted pays in its own warm-up steps, not in
    its measured peak."""
    peak = peak or stage_peak
    ok = [p for p in points if not (shape.sequences % (p[1] * p[0]) or shape.size % p[2])]
    out = []
    for i, (k, dp, cp, n, pos) in enumerate(ok):
        mesh = BatchMesh(dp, 1 if pos == 3 else 2, cp, k)
        if i == 0:
            peak(shape, mesh, n, pos, dropout)  # warm-up, discarded
        out.append([k, dp, cp, n, pos, peak(shape, mesh, n, pos, dropout)])
    return out


def fit_memory(samples: list[list[float]], shape: BatchShape) -> tuple[float, float, int]:
    """(memory_scale, score_copies, base bytes): measured = scale·(counted without the score
    workspace) + scale·copies·(one score block) + base, least squares on relative error,
    every term >= 0 (the sampler's cache is not in these stages: the caller adds it)."""
    a, t = [], []
    for k, dp, cp, n, pos, peak in samples:
        mesh = BatchMesh(int(dp), 1 if pos == 3 else 2, int(cp), int(k))
        c0 = sum(memory_parts(shape, mesh, 0.0).stage(int(n), int(pos)).values())
        c1 = sum(memory_parts(shape, mesh, 1.0).stage(int(n), int(pos)).values())
        a.append([c0, c1 - c0, 1.0])
        t.append(max(1.0, peak))
    c = rel_nnls(np.array(a, dtype=np.float64), np.array(t, dtype=np.float64))
    scale = float(c[0]) if c[0] > 0 else 1.0
    return scale, float(c[1]) / scale, int(c[2])


def sampler_bytes(sampler: Any, steps: int = 3, warm: Any = None) -> int:
    """Resident bytes a fresh sampler's caches hold once warm: ``steps`` steps of sequences
    built, above the level before (its block cache of feature and adjacency rows: ~44 MiB on
    Computers, where every block is touched within a few steps). ``warm``, a second fresh
    sampler of the same graph, builds the same sequences first and is dropped: the process's
    first sequences cost it once what no sampler holds (the graph's files mapped, scipy's and
    numpy's first-use state: the first model profiled in a process measured 52 MiB, the
    others 44, and its runs held 44)."""
    def build(s: Any) -> None:
        for i in range(steps * s.batch.sequences):
            s.sequence("train", 0, i % max(1, s.sequences("train")))

    with memory_mode():
        if warm is not None:
            build(warm)
        trim()
        base = rss()
        build(sampler)
        trim()
        return max(0, rss() - base)


# -- the whole measurement ---------------------------------------------------------------
def measure_batch_profile(shape: BatchShape, cps: Sequence[int] = (1, 2, 4),
                          sysm: SystemModel | None = None, sampler: Any = None,
                          dropout: float = 0.1, repeats: int = 5, memory: bool = True,
                          collectives: dict[str, Any] | None = None, warm_sampler: Any = None,
                          contention: dict[int, float] | None = None
                          ) -> tuple[BatchProfile, dict[str, Any]]:
    """(the profile, its raw samples) of ``shape`` on this machine (module doc).

    ``sysm``: the system profile's model, whose collective curves and node sharing (κ) are
    used where nothing here measures them; ``sampler``: a fresh
    :class:`~plexgt.data.node_batches.NodeBatches` of the run (sequence building timed and
    its cache counted in the base; without one, the counted default), ``warm_sampler`` a
    second one of the same graph that warms the process first (:func:`sampler_bytes`);
    ``collectives``:
    :func:`measure_collectives`' result, and ``contention``
    :func:`contention_samples`', when the caller ran them under a world."""
    base = default_profile(shape, sysm)
    threads = torch.get_num_threads()
    raw: dict[str, Any] = {"threads": threads}
    with torch.random.fork_rng():
        if memory:  # first: its caches fill as sequences are built
            raw["sampler_bytes"] = sampler_bytes(sampler, warm=warm_sampler) \
                if sampler is not None else 0
        raw["block"] = block_samples(shape, cps, dropout, repeats)
        raw.update(edge_samples(shape, dropout, repeats))
        raw["optimizer_s_per_param"] = optimizer_seconds_per_param(shape, repeats)
        if sampler is not None:
            raw["sample"] = sample_samples(sampler)
        if memory:
            raw["memory"] = memory_samples(shape, dropout)
    if collectives is not None:
        raw["collectives"] = collectives
    if contention:
        raw["contention"] = {str(p): k for p, k in contention.items()}
    return fit_batch_profile(base, raw, shape), raw


def fit_batch_profile(base: BatchProfile, raw: dict[str, Any], shape: BatchShape
                      ) -> BatchProfile:
    """``base`` (counted, or an earlier fit) with every term ``raw`` (the samples of
    :func:`measure_batch_profile`) measures fitted in: what a stored run refits from."""
    ns = shape.global_nodes
    prof = replace(base, block=fit_blocks(raw["block"], shape),
                   block_samples={(int(c), int(b), int(n) // int(c) + ns, int(n) + ns): float(t)
                                  for c, b, n, t in raw["block"]},
                   embed=fit_rows(raw["embed"]),
                   head=fit_rows(raw["head"]),
                   optimizer_s_per_param=float(raw["optimizer_s_per_param"]),
                   source="measured on this host")
    if raw.get("sample"):
        (_, n, t), = raw["sample"]
        prof = replace(prof, sample=BlockFit(per_row_s=t / n))
    if raw.get("memory"):
        scale, copies, mbase = fit_memory(raw["memory"], shape)
        prof = replace(prof, memory_scale=scale, score_copies=copies,
                       memory_base_bytes=mbase + int(raw.get("sampler_bytes", 0)))
    if raw.get("collectives"):
        prof = with_collectives(prof, raw["collectives"])
    if raw.get("contention"):  # measured in this run (contention_samples): replaces the host's
        prof = replace(prof, contention={int(p): float(k)
                                         for p, k in raw["contention"].items()})
    return prof


def with_collectives(prof: BatchProfile, coll: dict[str, Any]) -> BatchProfile:
    """``prof`` with :func:`measure_collectives`' curves fitted (latency + seconds per byte):
    a neighbour exchange is the pipeline's p2p, and the cp ring's step too unless ``coll``
    has ``ring``, :func:`ring_samples`' exchanges measured inside GA-CP on a real group."""
    ex = Fit(**fit_linear(coll["p2p"]))
    ring = Fit(**fit_linear(coll["ring"])) if coll.get("ring") else ex
    ar = {int(g): Fit(**fit_linear(rows)) for g, rows in coll["allreduce"].items()}
    return replace(prof, p2p=ex, ring=ring, allreduce=ar or prof.allreduce)
