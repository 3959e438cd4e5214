"""gt / gps's search over every configuration a run can take: scale, strategy, head axis,
blocking, and gps's GCN path.

A job of P ranks can run attention on any s <= P of them with any registered strategy; gp_2d
on any head axis a dividing s (a x b = s); gp_ag / gp_a2a with the rows of each attention
whole or in blocks (the [h, rows] log-sum-exp kept instead of the [h, E] probabilities, the
scores rebuilt in backward: memory for one more SDDMM); gp_ring / gp_2d with each K/V block
sent in 1, 2 or 4 pieces (1/c of it in flight for c times the messages); gps with its GCN
path 1D or 3D on the 3D planner's grid of s ranks, redistributed between the layouts.
:func:`search_attention` prices them with AGP's model (:func:`plexgt.plan.agp.estimate`)
and returns the fastest configuration that fits and the Pareto frontier of predicted time
against memory per rank (the best of each scale on it).

Memory-aware pruning: each configuration's memory (:func:`plexgt.plan.agp.memory_of`, a few
closed forms) is checked before its time is priced, and what does not fit is never priced.

Two stages, as gcn's search (:mod:`plexgt.plan.search`). First, at every scale, every
strategy in its configured blocking and, for gp_2d, every head axis up to the head count
(a > h leaves ranks without a head), the 1D path for gps; a configuration that does not fit
is retried in its memory-saving variants (blocked rows, more ring pieces); for gps, at
:data:`SAMPLE_3D` spread scales, the leader with the 3D path too. Then, on the
scales that can matter (:data:`REFINE_SCALES` spread along the first stage's frontier and
its :data:`REFINE_SCALES` fastest), every variant of every strategy and every head axis,
and for gps the 3D path under the scale's :data:`REFINE_3D` leading attention
configurations. Why: at
P = 2048 the full product is ~10^5 estimates of ~0.3 ms. The second stage assumes blocking,
large head axes and the 3D path reorder configurations within the leading scales, not across
the whole field; ``refine=False`` prices everything everywhere, and the tests compare the
two on small P. With the 3D path the ranks' collectives differ (the redistribution); a
search prices the slowest of :data:`COMM_SAMPLE` evenly spaced ranks (every rank up to
that many), not of all s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from plexgt.distributed.grid import Grid3D
from plexgt.parallel.attention.strategy import AttentionStrategy
from plexgt.plan.agp import Estimate, SystemModel, Workload, estimate, memory_of, unsupported
from plexgt.plan.pareto import chosen_and_frontier, frontier

REFINE_SCALES = 16
"""Scales priced in every variant beyond the first stage's frontier: its fastest this many."""
BLOCKS = 8
"""A blocked variant cuts a rank's attention rows into this many blocks."""
RING_CHUNKS = (1, 2, 4)
"""Pieces a ring strategy's K/V blocks may travel in."""
COMM_SAMPLE = 16
"""Ranks whose collectives are priced for gps's 3D path (the slowest is taken)."""
SAMPLE_3D = 128
"""gps: first-stage scales (spread evenly, and the powers of two) whose leader is priced with
the 3D path too."""
REFINE_3D = 4
"""gps: the leading attention configurations of a refined scale priced with the 3D path."""


@dataclass(frozen=True)
class AttentionConfig:
    """One configuration of a gt / gps run and its prediction."""

    est: Estimate
    ring_chunks: int
    """Pieces a ring's K/V blocks travel in (1 for the gather / all-to-all strategies)."""
    block_rows: int
    """gp_ag / gp_a2a: attention query rows per block; 0: whole."""

    @property
    def scale(self) -> int:
        return self.est.scale

    @property
    def strategy(self) -> str:
        return self.est.strategy

    @property
    def head_parallel(self) -> int:
        return self.est.head_parallel

    @property
    def gcn_grid(self) -> Grid3D | None:
        return self.est.gcn_grid

    @property
    def memory_bytes(self) -> int:
        return self.est.memory["total"]

    @property
    def label(self) -> str:
        """'gp_2d 2x8 chunks=2', 'gp_ag blocks of 4096 rows', '+ gcn 3d 2x2x4' for gps."""
        out = self.est.label
        if self.est.rings and self.ring_chunks > 1:
            out += f" chunks={self.ring_chunks}"
        if self.block_rows:
            out += f" block_rows={self.block_rows}"
        if self.est.gcn_path:
            out += f" gcn {self.est.gcn_label}"
        return out


@dataclass
class AttentionSearch:
    """What :func:`search_attention` found."""

    best_per_scale: list[AttentionConfig]
    """The fastest fitting configuration of each scale that has one, by scale."""
    chosen: AttentionConfig | None
    """The fastest that fits at any scale (ties: fewer ranks); None when nothing fits."""
    frontier: list[AttentionConfig] = field(default_factory=list)
    """Of ``best_per_scale``: those no other is both faster and smaller, fastest first."""
    priced: int = 0
    """Configurations whose time was priced."""
    pruned: int = 0
    """Configurations dropped on memory before pricing."""
    seconds: float = 0.0
    """Wall time of the search."""
    least_memory: tuple[int, int] | None = None
    """(bytes per rank, scale) of the configuration that needs the least memory, fitting or
    not: what a limit nothing fits under would have to be raised to."""


def _local_rows(c: AttentionStrategy, w: Workload, s: int) -> int:
    """Query rows of the busiest rank's attention (what blocking cuts)."""
    n_loc = -(-w.n // s)
    return s * n_loc if c.full_graph else n_loc


def variants(c: AttentionStrategy, w: Workload, s: int, vary: tuple[bool, bool] = (True, True)
             ) -> list[tuple[int, int]]:
    """(ring chunks, attention block rows) of ``c`` on s ranks, the workload's first, then
    the memory-saving ones (more pieces; rows in :data:`BLOCKS` blocks) where ``vary``
    (chunks, rows) allows."""
    if c.rings:
        chunks = [w.ring_chunks] + [k for k in RING_CHUNKS if k != w.ring_chunks]
        return [(k, 0) for k in chunks] if s > 1 and vary[0] else [(w.ring_chunks, 0)]
    rows = _local_rows(c, w, s)
    blocked = -(-rows // BLOCKS)
    out = [(1, w.attention_block_rows)]
    if vary[1] and blocked != w.attention_block_rows and blocked < rows:
        out.append((1, blocked))
    return out


def thin(items: list, k: int) -> list:
    """At most k of ``items``, evenly spread (first and last kept): a frontier of hundreds of
    scales, each a little smaller and slower, is refined at k of them."""
    if len(items) <= k:
        return items
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def comm_sample(s: int) -> list[int]:
    """Up to :data:`COMM_SAMPLE` ranks spread evenly over s, first and last included."""
    if s <= COMM_SAMPLE:
        return list(range(s))
    return sorted({round(i * (s - 1) / (COMM_SAMPLE - 1)) for i in range(COMM_SAMPLE)})


def search_attention(w: Workload, strategies: list[AttentionStrategy], world_size: int,
                     sysm: SystemModel, memory_limit: int | None = None,
                     scales: list[int] | None = None, head_parallel: int = 0,
                     gcn_grid_at: Callable[[int], Grid3D] | None = None,
                     refine: bool = True, vary: tuple[bool, bool] = (True, True),
                     only_3d: bool = False) -> AttentionSearch:
    """Search ``strategies`` x scales (default 1..world_size) x head axes (``head_parallel``
    > 0: that one only) x blocking (``vary``: ring chunks, attention block rows; False keeps
    the workload's), and for gps the 1D path and, given ``gcn_grid_at`` (s -> a grid of s
    ranks), the 3D one (``only_3d``: the 3D one is required); see the module docstring.
    ``refine=False`` prices every combination at every scale. A strategy the machine
    cannot run (:func:`~plexgt.plan.agp.unsupported`: a ring on ROCm GPUs) is not searched."""
    t0 = time.perf_counter()
    strategies = [c for c in strategies if not unsupported(c, sysm)]
    priced = pruned = 0
    seen: set[tuple] = set()

    least: tuple[int, int] | None = None

    def fits(mem: dict[str, int], s: int) -> bool:
        nonlocal least
        if least is None or mem["total"] < least[0]:
            least = (mem["total"], s)
        return memory_limit is None or mem["total"] <= memory_limit

    def price(c: AttentionStrategy, s: int, a: int, chunks: int, br: int,
              grid: Grid3D | None) -> AttentionConfig | None:
        nonlocal priced, pruned
        key = (c.name, s, a, chunks, br, grid)
        if key in seen:
            return None
        seen.add(key)
        wv = replace(w, ring_chunks=chunks, attention_block_rows=br,
                     gcn_grid=grid if w.gcn else None)
        if not fits(memory_of(c, wv, s, a), s):
            pruned += 1
            return None
        priced += 1
        ranks = comm_sample(s) if grid is not None else None
        return AttentionConfig(estimate(c, wv, s, sysm, a, ranks), chunks, br)

    def axes(c: AttentionStrategy, s: int, every: bool) -> list[int]:
        out = c.layouts(s, head_parallel)
        return out if every or head_parallel else [a for a in out if a <= w.heads] or out[:1]

    by_name = {c.name: c for c in strategies}
    by_scale: dict[int, list[AttentionConfig]] = {}
    all_scales = sorted(set(scales or range(1, world_size + 1)))
    for s in all_scales:
        found = []
        for c in strategies if s > 1 else strategies[:1]:  # one rank: every strategy alike
            for a in axes(c, s, not refine):
                vs = variants(c, w, s, vary)
                for chunks, br in vs if not refine else vs[:1]:
                    got = price(c, s, a, chunks, br, None)
                    if got is not None:
                        found.append(got)
                if refine and not any(f.est.strategy == c.name and f.head_parallel == a
                                      for f in found):
                    for chunks, br in vs[1:]:  # the base did not fit
                        got = price(c, s, a, chunks, br, None)
                        if got is not None:
                            found.append(got)
        by_scale[s] = found

    def with_3d(s: int, k: int | None) -> None:
        """gps: the 3D path under the k leading attention configurations of scale s (its cost
        is the GCN path's, whatever attention runs beside it)."""
        if not (w.gcn and gcn_grid_at is not None and s > 1 and by_scale[s]):
            return
        grid = gcn_grid_at(s)
        ranked = sorted(by_scale[s], key=lambda x: x.est.time_s)
        for x in ranked[:k]:
            got = price(by_name[x.strategy], s, x.head_parallel, x.ring_chunks,
                        x.block_rows, grid)
            if got is not None:
                by_scale[s].append(got)

    if refine:  # gps: the 3D path at spread scales, so they can lead into the second stage
        for s in set(thin(all_scales, SAMPLE_3D)) | {1 << i for i in range(31)}:
            if s in by_scale:
                with_3d(s, 1)

    def eligible(x: AttentionConfig) -> bool:
        return not only_3d or x.gcn_grid is not None or x.scale == 1

    def leaders() -> list[AttentionConfig]:
        out = []
        for v in by_scale.values():
            ok = [x for x in v if eligible(x)] or (v if refine else [])  # stage 1: 1D stands in
            if ok:
                out.append(min(ok, key=lambda x: x.est.time_s))
        return out

    lead = leaders()
    front = [lead[i] for i in frontier(lead, lambda x: x.est.time_s,
                                       lambda x: x.memory_bytes)]
    keep = {x.scale for x in thin(front, REFINE_SCALES)}
    keep |= {x.scale for x in sorted(lead, key=lambda x: x.est.time_s)[:REFINE_SCALES]}
    for s in all_scales if not refine else sorted(keep):
        for c in strategies if s > 1 else strategies[:1]:
            for a in axes(c, s, True):
                for chunks, br in variants(c, w, s, vary):
                    got = price(c, s, a, chunks, br, None)
                    if got is not None:
                        by_scale[s].append(got)
        with_3d(s, REFINE_3D if refine else None)
    best = [x for x in leaders() if eligible(x)]
    chosen, front = chosen_and_frontier(best, lambda x: x.est.time_s,
                                        lambda x: x.memory_bytes, lambda x: x.scale)
    return AttentionSearch(best, chosen, front, priced, pruned, time.perf_counter() - t0, least)
