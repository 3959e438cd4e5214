"""The node-sequence (batch layout) models' Search: the fastest (P_dp, P_pp, P_cp, K,
partition) that fits, and the frontier.

Over every mesh with P_dp·P_pp·P_cp = W (P_dp | G, P_cp | N', P_pp <= L), every K dividing a
replica's G/P_dp sequences, and every contiguous partition of the L blocks into P_pp stages
of at least one block — C(L-1, P_pp-1) of them, 1,771 at L = 24, P_pp = 4, and ~10^8 at
L = 32, P_pp = 8 — so partitions are never enumerated. For one mesh the step is
(:func:`~plexgt.plan.batch_cost.step_seconds`, GPipe's critical path)

    Σ_s t_s  +  (K - 1) · max_s t_s  +  tail(max_s params_s)

with t_s, params_s and the stage's memory m_s functions of its blocks [a, b) and its position.
Two maxima, each handled by a cap over the finitely many values it can take, so the search
is exact:

* the pipeline term: for a cap T on every stage's time, a dynamic programme over (blocks
  consumed, stages used) finds the least Σ_s t_s over the partitions whose stages all take
  <= T (and fit the memory limit); the optimum's own max_s t_s is one of the segment times,
  and at that cap the programme finds a partition at least as fast, so
  min over T of (K - 1)·T + minsum(T) is the pipeline's exact minimum. Every cap is one
  slice of a single vectorised programme (caps x L x L numpy arrays); K = 1 needs only
  T = inf;
* the tail: a cap c on the parameters any stage may hold (segments above it pruned), caps
  tried from the largest down; the pipeline's minimum only grows as the cap falls, so the
  loop stops once it plus tail(smallest cap) cannot beat the best so far — in practice one
  or two programmes per mesh.

Among partitions of equal step time the one of least peak memory is returned: the least
memory cap (a binary search over the segments' memory values) at which the same step time is
still reached. A mesh's leanest partition (least max_s m_s) is a min-max programme.

The programmes are O(caps · P_pp · L²) numpy work a mesh: W = 64, L = 32 in well under a
second (perf/bench_hgt_search.py).

The frontier (time against peak memory per rank) is over every mesh's fastest partition and
its leanest one (least peak memory, fastest among those): the configurations no other beats
on both.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plexgt.distributed.mesh import check_layout, meshes_for, parse_stages
from plexgt.errors import ConfigError, GridError
from plexgt.plan.batch_cost import StageCosts, pipeline_seconds, stage_costs, tail_seconds
from plexgt.plan.batch_fits import BatchProfile
from plexgt.plan.batch_shape import BatchMesh, BatchShape, check_mesh, check_stages, position
from plexgt.plan.pareto import frontier as pareto_frontier

INF = float("inf")
FIXED_KEYS = ("dp", "pp", "cp", "stages", "micro_batches")
"""What a config may fix (``parallel.*`` keys that are not 'auto' / 0)."""


class NoBatchPlan(ConfigError):
    """No node-sequence configuration fits the memory per rank (the line says the limit
    and the least any configuration needs)."""

    least_memory: int | None = None


@dataclass(frozen=True)
class BatchCandidate:
    """One priced configuration."""

    dp: int
    pp: int
    cp: int
    micro_batches: int
    stages: tuple[int, ...]
    step_s: float
    stage_bytes: tuple[int, ...]
    """Predicted peak bytes per rank of each stage."""

    @property
    def peak_bytes(self) -> int:
        return max(self.stage_bytes)

    @property
    def mesh(self) -> BatchMesh:
        return BatchMesh(self.dp, self.pp, self.cp, self.micro_batches)

    @property
    def label(self) -> str:
        return (f"dp{self.dp} pp{self.pp} cp{self.cp} K{self.micro_batches} "
                f"[{','.join(map(str, self.stages))}]")


@dataclass(frozen=True)
class BatchPlan:
    """:func:`choose_batch`'s answer: the fastest fitting configuration and the frontier."""

    dp: int
    pp: int
    cp: int
    micro_batches: int
    stages: tuple[int, ...]
    step_s: float
    """Predicted seconds of one step."""
    stage_bytes: tuple[int, ...]
    """Predicted peak bytes per rank of each stage."""
    frontier: tuple[BatchCandidate, ...]
    """Time against peak memory per rank, fastest first."""

    @property
    def peak_bytes(self) -> int:
        return max(self.stage_bytes)


@dataclass
class BatchSearch:
    """Everything :func:`search_batch` priced."""

    best: BatchCandidate | None
    candidates: list[BatchCandidate] = field(default_factory=list)
    """Every mesh's fastest and leanest fitting partitions."""
    frontier: list[BatchCandidate] = field(default_factory=list)
    meshes: int = 0
    """(dp, pp, cp, K) priced."""
    programmes: int = 0
    """Partition programmes run."""
    least_memory: int | None = None
    """Least peak bytes per rank of any partition of any mesh (fitting or not)."""
    seconds: float = 0.0


# -- the partition programme -------------------------------------------------------------
@dataclass(frozen=True)
class Tables:
    """A mesh's stage terms by position (0 first, 1 middle, 2 last, 3 only) and block count
    n = 0..L: seconds t[pos, n], peak bytes m[pos, n], parameters p[pos, n]."""

    t: np.ndarray
    m: np.ndarray
    p: np.ndarray

    @classmethod
    def of(cls, costs: StageCosts, layers: int) -> Tables:
        n = np.arange(layers + 1)
        return cls(np.stack([costs.time(n, q) for q in range(4)]),
                   np.floor(np.stack([costs.memory(n, q) for q in range(4)])),  # whole bytes
                   np.stack([costs.params(n, q) for q in range(4)]).astype(np.float64))


def _segments(row: np.ndarray, layers: int) -> np.ndarray:
    """[a, b] -> row[b - a] for b > a, inf elsewhere (a middle stage holding blocks a..b-1)."""
    idx = np.arange(layers + 1)
    span = idx[None, :] - idx[:, None]
    out = np.full((layers + 1, layers + 1), INF)
    ok = span >= 1
    out[ok] = row[span[ok]]
    return out


def minmax_partition(cost: np.ndarray, pp: int, layers: int
                     ) -> tuple[float, tuple[int, ...] | None]:
    """The least max over stages of ``cost[pos, n]`` (inf = segment not allowed) over every
    partition of ``layers`` blocks into ``pp`` stages of >= 1 block, and one partition
    reaching it (None when none is allowed). Dynamic programme over (blocks consumed, stages
    used): best[s][j] = min over a < j of max(best[s-1][a], cost of blocks a..j-1 at stage
    s's position)."""
    if pp == 1:
        v = float(cost[3, layers])
        return (v, (layers,)) if v < INF else (INF, None)
    best = np.full(layers + 1, INF)
    best[1:] = cost[0, 1:]
    args: list[np.ndarray] = []
    if pp > 2:
        mid = _segments(cost[1], layers)
        for _ in range(pp - 2):
            cand = np.maximum(best[:, None], mid)
            arg = np.argmin(cand, axis=0)
            best = cand[arg, np.arange(layers + 1)]
            args.append(arg)
    tail = cost[2, layers - np.arange(layers + 1)]
    tail[layers] = INF  # the last stage needs a block
    final = np.maximum(best, tail)
    a = int(np.argmin(final))
    v = float(final[a])
    if v == INF:
        return INF, None
    cuts = [layers, a]
    for arg in reversed(args):
        a = int(arg[a])
        cuts.append(a)
    cuts.append(0)
    cuts.reverse()
    return v, tuple(b - a for a, b in zip(cuts, cuts[1:]))


def minsum_partition(cost: np.ndarray, pp: int, layers: int, caps: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """For every cap T in ``caps`` [nT]: the least sum over stages of ``cost[pos, n]`` (inf =
    segment not allowed) over the partitions of ``layers`` blocks into ``pp`` stages of >= 1
    block whose every stage costs <= T. Returns (sums [nT], the last stage's start [nT], the
    middle stages' back-pointers [pp - 2 arrays of nT x (L+1)]) for :func:`_cuts`.
    best[s][j] = min over a < j of best[s-1][a] + cost of blocks a..j-1 at stage s's
    position, every cap one slice of the same arrays."""
    n_t, n = len(caps), layers + 1
    c = np.where(cost[None] <= caps[:, None, None], cost[None], INF)  # [nT, 4, L+1]
    if pp == 1:
        return c[:, 3, layers], np.zeros(n_t, dtype=np.int64), []
    best = c[:, 0, :].copy()
    best[:, 0] = INF  # the first stage needs a block
    args: list[np.ndarray] = []
    if pp > 2:
        idx = np.arange(n)
        span = idx[None, :] - idx[:, None]
        ok = span >= 1
        mid = np.full((n_t, n, n), INF)
        mid[:, ok] = c[:, 1, span[ok]]
        for _ in range(pp - 2):
            cand = best[:, :, None] + mid
            arg = np.argmin(cand, axis=1)  # [nT, L+1]
            best = np.take_along_axis(cand, arg[:, None, :], axis=1)[:, 0, :]
            args.append(arg)
    tail = c[:, 2, layers - np.arange(n)]
    tail[:, layers] = INF  # the last stage needs a block
    final = best + tail
    last = np.argmin(final, axis=1)
    return final[np.arange(n_t), last], last, args


def _cuts(layers: int, last: int, args: Sequence[np.ndarray], i: int) -> tuple[int, ...]:
    """The partition (blocks per stage) of cap ``i`` from :func:`minsum_partition`'s
    back-pointers."""
    if not args and last == 0:
        return (layers,)
    cuts = [layers, last]
    a = last
    for arg in reversed(args):
        a = int(arg[i, a])
        cuts.append(a)
    cuts.append(0)
    cuts.reverse()
    return tuple(b - a for a, b in zip(cuts, cuts[1:]))


def pipeline_partition(cost: np.ndarray, pp: int, micro_batches: int, layers: int
                       ) -> tuple[float, tuple[int, ...] | None]:
    """The least Σ_s t_s + (K - 1)·max_s t_s over the partitions (``cost[pos, n]`` = t, inf
    = not allowed) and one reaching it (None when none is allowed): min over the caps T
    (every finite segment time, or inf alone at K = 1) of (K - 1)·T + minsum(T)."""
    rows = [3] if pp == 1 else [0, 2] if pp == 2 else [0, 1, 2]
    if micro_batches == 1:
        caps = np.array([INF])
    else:
        vals = cost[rows].ravel()
        caps = np.unique(vals[np.isfinite(vals)])
        if not len(caps):
            return INF, None
    sums, last, args = minsum_partition(cost, pp, layers, caps)
    obj = sums if micro_batches == 1 else sums + (micro_batches - 1) * caps
    i = int(np.argmin(obj))
    if not np.isfinite(obj[i]):
        return INF, None
    stages = _cuts(layers, int(last[i]), args, i)
    per = [float(cost[position(j, pp), m]) for j, m in enumerate(stages)]
    return pipeline_seconds(per, micro_batches), stages


def _stage_terms(tab: Tables, stages: Sequence[int], micro_batches: int
                 ) -> tuple[float, float, tuple[int, ...]]:
    """(pipeline seconds, the most parameters a stage holds, every stage's bytes)."""
    pp = len(stages)
    pos = [position(i, pp) for i in range(pp)]
    return (pipeline_seconds([float(tab.t[q, n]) for q, n in zip(pos, stages)],
                             micro_batches),
            max(float(tab.p[q, n]) for q, n in zip(pos, stages)),
            tuple(int(tab.m[q, n]) for q, n in zip(pos, stages)))


def _fastest(shape: BatchShape, prof: BatchProfile, mesh: BatchMesh, tab: Tables,
             fits: np.ndarray) -> tuple[tuple[float, tuple[int, ...]] | None, int]:
    """((step seconds, partition) of the fastest partition using only the ``fits``
    segments, or None; programmes run): the parameter-cap loop of the module doc."""
    layers, pp, k = shape.layers, mesh.pp, mesh.micro_batches
    caps = np.unique(tab.p[fits])
    if not len(caps):
        return None, 0
    low_tail = tail_seconds(prof, shape, mesh, float(caps[0]))
    best: tuple[float, tuple[int, ...]] | None = None
    runs = 0
    i = len(caps) - 1
    while i >= 0:
        allowed = fits & (tab.p <= caps[i])
        pipe, stages = pipeline_partition(np.where(allowed, tab.t, INF), pp, k, layers)
        runs += 1
        if stages is None or (best is not None and pipe + low_tail >= best[0]):
            break
        pipe, pmax, _ = _stage_terms(tab, stages, k)
        step = pipe + tail_seconds(prof, shape, mesh, pmax)
        if best is None or step < best[0]:
            best = (step, stages)
        i = int(np.searchsorted(caps, pmax)) - 1  # caps between pmax and caps[i]: the same
    return best, runs


TIE = 1e-12
"""Relative step-time difference below which two partitions tie (least memory wins)."""


def best_partition(shape: BatchShape, prof: BatchProfile, mesh: BatchMesh, limit: float,
                   tab: Tables | None = None) -> tuple[BatchCandidate | None, int]:
    """The fastest partition of ``mesh`` with every stage's memory <= ``limit`` (ties: least
    peak memory), exact (see the module doc); and the programmes it ran."""
    tab = tab or Tables.of(stage_costs(shape, prof, mesh), shape.layers)
    fits = tab.m <= limit
    found, runs = _fastest(shape, prof, mesh, tab, fits)
    if found is None:
        return None, runs
    step, stages = found
    # least peak memory among the partitions as fast: the least memory cap still reaching it
    peak = max(_stage_terms(tab, stages, mesh.micro_batches)[2])
    mcaps = np.unique(tab.m[fits & (tab.m < peak)])
    lo, hi = 0, len(mcaps)  # mcaps[hi:] (and the peak itself) reach the step
    while lo < hi:
        mid = (lo + hi) // 2
        got, r = _fastest(shape, prof, mesh, tab, fits & (tab.m <= mcaps[mid]))
        runs += r
        if got is not None and got[0] <= step * (1 + TIE):
            hi, stages = mid, got[1]
        else:
            lo = mid + 1
    return price(shape, prof, mesh, stages, tab), runs


def leanest_partition(shape: BatchShape, prof: BatchProfile, mesh: BatchMesh, limit: float,
                      tab: Tables | None = None) -> tuple[BatchCandidate | None, int]:
    """The partition of least peak memory (the fastest of those) that fits ``limit``."""
    tab = tab or Tables.of(stage_costs(shape, prof, mesh), shape.layers)
    mem, stages = minmax_partition(np.where(tab.m <= limit, tab.m, INF), mesh.pp,
                                   shape.layers)
    if stages is None:
        return None, 1
    cand, runs = best_partition(shape, prof, mesh, min(limit, mem), tab)
    return cand, runs + 1


def price(shape: BatchShape, prof: BatchProfile, mesh: BatchMesh, stages: Sequence[int],
          tab: Tables | None = None) -> BatchCandidate:
    """One fixed configuration's step seconds and stage bytes."""
    check_mesh(shape, mesh)
    check_stages(shape, stages, mesh.pp)
    tab = tab or Tables.of(stage_costs(shape, prof, mesh), shape.layers)
    pipe, pmax, mem = _stage_terms(tab, stages, mesh.micro_batches)
    step = pipe + tail_seconds(prof, shape, mesh, pmax)
    return BatchCandidate(mesh.dp, mesh.pp, mesh.cp, mesh.micro_batches, tuple(stages), step,
                        mem)


def partitions(layers: int, pp: int) -> Iterator[tuple[int, ...]]:
    """Every contiguous partition of ``layers`` blocks into ``pp`` stages (>= 1 each)."""
    for cuts in itertools.combinations(range(1, layers), pp - 1):
        yield tuple(b - a for a, b in zip((0, *cuts), (*cuts, layers)))


def enumerate_partitions(shape: BatchShape, prof: BatchProfile, mesh: BatchMesh, limit: float
                         ) -> BatchCandidate | None:
    """Brute force over :func:`partitions` (the programme's check; small L only): the
    fastest fitting one, ties to the least peak memory."""
    tab = Tables.of(stage_costs(shape, prof, mesh), shape.layers)
    best: BatchCandidate | None = None
    for st in partitions(shape.layers, mesh.pp):
        c = price(shape, prof, mesh, st, tab)
        if c.peak_bytes > limit:
            continue
        if best is None or c.step_s < best.step_s * (1 - TIE) or (
                c.step_s <= best.step_s * (1 + TIE) and c.peak_bytes < best.peak_bytes):
            best = c
    return best


# -- meshes ------------------------------------------------------------------------------
def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def meshes(shape: BatchShape, world: int, fixed: dict[str, Any] | None = None
           ) -> Iterator[BatchMesh]:
    """Every (dp, pp, cp, K) of ``world`` ranks the step divides, the ``fixed`` ones only."""
    fixed = fixed or {}
    stages = fixed.get("stages")
    for dp in divisors(world):
        if shape.sequences % dp or fixed.get("dp", dp) != dp:
            continue
        for pp in divisors(world // dp):
            cp = world // (dp * pp)
            if pp > shape.layers or shape.size % cp or fixed.get("pp", pp) != pp \
                    or fixed.get("cp", cp) != cp or (stages and len(stages) != pp):
                continue
            for k in divisors(shape.sequences // dp):
                if fixed.get("micro_batches", k) == k:
                    yield BatchMesh(dp, pp, cp, k)


def check_fixed(shape: BatchShape, world: int, fixed: dict[str, Any]) -> dict[str, Any]:
    """``fixed`` with stages as a tuple; ConfigError (one line) for keys or values the
    step cannot take (the layout's rules are :mod:`plexgt.distributed.mesh`'s, the words
    ``plexgt train`` uses)."""
    bad = set(fixed) - set(FIXED_KEYS)
    if bad:
        raise ConfigError(f"plan: unknown fixed choice(s) {', '.join(sorted(bad))} "
                          f"(known: {', '.join(FIXED_KEYS)})")
    out = dict(fixed)
    if "stages" in out:
        out["stages"] = parse_stages(out["stages"], shape.layers, out.get("pp"))
    try:
        meshes_for(world, out.get("dp", "auto"), out.get("pp", "auto"), out.get("cp", "auto"))
    except GridError as e:
        raise ConfigError(f"config keys 'parallel.dp/pp/cp': {e}") from None
    check_layout(shape.sequences, shape.size, shape.layers, out.get("dp"), out.get("pp"),
                 out.get("cp"), out.get("micro_batches"))
    return out


def search_batch(shape: BatchShape, world: int, prof: BatchProfile, limit: float = INF,
               fixed: dict[str, Any] | None = None) -> BatchSearch:
    """Every mesh of ``world`` ranks (:func:`meshes`), each's fastest and leanest partition
    under ``limit`` bytes per rank (or the fixed one), the fastest of all and the frontier."""
    t0 = time.perf_counter()
    fixed = check_fixed(shape, world, fixed or {})
    out = BatchSearch(None)
    least = INF
    for mesh in meshes(shape, world, fixed):
        out.meshes += 1
        tab = Tables.of(stage_costs(shape, prof, mesh), shape.layers)
        if "stages" in fixed:
            c = price(shape, prof, mesh, fixed["stages"], tab)
            least = min(least, c.peak_bytes)
            found = [c] if c.peak_bytes <= limit else []
        else:
            lean, runs = leanest_partition(shape, prof, mesh, INF, tab)
            out.programmes += runs
            if lean is not None:
                least = min(least, lean.peak_bytes)
            found = []
            if lean is not None and lean.peak_bytes <= limit:
                fast, runs = best_partition(shape, prof, mesh, limit, tab)
                out.programmes += runs
                found = [fast] if fast == lean else [fast, lean]
        out.candidates.extend(c for c in found if c is not None)
    cands = out.candidates
    out.best = min(cands, key=lambda c: (c.step_s, c.peak_bytes, c.pp, c.cp, c.micro_batches),
                   default=None)
    idx = pareto_frontier(cands, lambda c: c.step_s, lambda c: c.peak_bytes)
    out.frontier = [cands[i] for i in idx]
    out.least_memory = None if least == INF else int(least)
    out.seconds = time.perf_counter() - t0
    return out


def choose_batch(shape: BatchShape, world: int, prof: BatchProfile, limit: float = INF,
               fixed: dict[str, Any] | None = None) -> BatchPlan:
    """The plan for ``world`` ranks: the config's non-auto choices ``fixed`` (keys
    :data:`FIXED_KEYS`: ints, and stages as a tuple or '3,7,7,7'), the rest the search's
    fastest under ``limit`` bytes per rank. :class:`NoBatchPlan` when nothing fits;
    ConfigError for fixed choices the step cannot take."""
    found = search_batch(shape, world, prof, limit, fixed)
    b = found.best
    if b is None:
        if not found.meshes:
            raise NoBatchPlan(f"plan: no (dp, pp, cp, micro_batches) of {world} ranks "
                            f"divides batch.sequences = {shape.sequences}, batch.size = "
                            f"{shape.size} and {shape.layers} layers with the fixed "
                            f"choices {fixed or {}}")
        err = NoBatchPlan(f"plan: nothing fits {limit / 2**30:.2f} GiB per rank on "
                        f"{world} ranks; the least any configuration needs is "
                        f"{(found.least_memory or 0) / 2**30:.2f} GiB")
        err.least_memory = found.least_memory
        raise err
    return BatchPlan(b.dp, b.pp, b.cp, b.micro_batches, b.stages, b.step_s, b.stage_bytes,
                   tuple(found.frontier))
