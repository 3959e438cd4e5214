"""How the ranks of one node share it: the part of a machine model both planners price.

A GPU per rank shares nothing, so on GPUs every factor here is 1. CPU ranks share the node's
cores, caches and memory bandwidth, and a rank's speed depends on how many of them run at
once and with how many threads each:

* fewer ranks than cores: each rank runs ``cores // ranks`` threads (what ``plexgt train``
  sets when ``OMP_NUM_THREADS`` is unset, and what a sensible CPU launch does), at the
  profiled speedup of that many threads over one (:meth:`Host.thread_factor`);
* ranks that fit the cores slow each other through shared caches and memory (κ, measured);
* more rank threads than cores: the cores are time-shared (κ >= ranks·threads / cores), and
  what a collective moves competes with the peers' compute (:meth:`Host.oversubscription`).

Both :class:`plexgt.plan.agp.SystemModel` (attention) and :class:`plexgt.plan.plexus_cost.
Coefficients` (3D GCN) hold one, so the two models price the same node the same way.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


def by_group_size(sizes: Iterable[int], p: int, at: Callable[[int], float],
                  outside: Callable[[int], float]) -> float:
    """A quantity profiled at some group sizes, at p ranks: ``at(p)`` where p was profiled,
    linear between the two profiled neighbours, and ``outside(q)`` below the smallest or
    beyond the largest, q that size (each quantity has its own extrapolation)."""
    sizes = sorted(sizes)
    if p in sizes:
        return at(p)
    if p < sizes[0] or p > sizes[-1]:
        return outside(sizes[0] if p < sizes[0] else sizes[-1])
    i = bisect.bisect(sizes, p)
    lo, hi = sizes[i - 1], sizes[i]
    w = (p - lo) / (hi - lo)
    return at(lo) * (1 - w) + at(hi) * w


def across_group_sizes(sizes: Iterable[int], g: int, t: Callable[[int], float],
                       per_call: Callable[[int], float]) -> float:
    """A collective's time (or one of its parts) over g ranks from ``t(q)`` profiled at group
    sizes q in ``sizes``: linear between them, the smallest's below, and beyond the largest
    its time plus ``per_call(q)`` for each extra step of a ring over g ranks. One rule for
    both planners' collectives: the attention model's measured curves and the 3D model's
    latency and bandwidth fits."""
    def outside(q: int) -> float:
        extra = (g - 1) / max(1, q - 1) - 1 if g > q else 0.0
        return t(q) + per_call(q) * extra

    return by_group_size(sizes, g, t, outside)


@dataclass(frozen=True)
class Host:
    """One node's sharing, from a system profile (defaults: nothing shared)."""

    device: str = "unspecified"
    """'cpu' (ranks share cores), 'cuda', or 'unspecified' (priced as a GPU per rank)."""
    cores: int = 1
    """Cores of the node the CPU ranks share."""
    threads: int = 1
    """Threads per rank in the profiled runs (what the kernel coefficients were measured
    with)."""
    contention: dict[int, float] = field(default_factory=dict)
    """Ranks running at once -> κ, their measured slowdown against one rank alone."""
    sync: dict[int, float] = field(default_factory=dict)
    """Group size -> extra seconds per collective call when the ranks compute between calls
    (the profile's "loaded" measurement)."""
    thread_speedup: dict[int, float] = field(default_factory=dict)
    """Threads t -> how much faster one rank alone runs a training step with t threads than
    with ``threads`` (the profile's ``thread_speedup``; 1 where not measured)."""
    rocm: bool = False
    """The GPUs run a ROCm build of torch (the profile's ``hardware.rocm``, a machine
    description's ``runtime = "rocm"``): no GPU ``torch.sparse.sampled_addmm``, so the
    strategies whose kernels need it are never planned there."""

    @classmethod
    def from_profile(cls, prof: dict[str, Any] | None) -> Host:
        """A system profile's node: its hardware, threads, loaded contention and sync costs,
        and thread speedups (those not in it keep the defaults)."""
        if not prof:
            return cls()
        hw = prof.get("hardware", {})
        cont = {int(s): float(v) for s, v in prof.get("contention", {}).items()}
        sync = {}
        for s, v in (prof.get("loaded") or {}).items():
            # sustained (back-to-back) contention prices a step's long compute better than
            # the fastest of a few short calls
            cont[int(s)] = float(v["contention"])
            sync[int(s)] = float(v["sync_s"])
        speed = {int(t): float(v) for t, v in (prof.get("thread_speedup") or {}).items()}
        return cls(str(hw.get("device", "cpu")), int(hw.get("cores") or 1),
                   int(prof.get("software", {}).get("threads_per_rank") or 1), cont, sync,
                   speed, bool(hw.get("rocm", False)))

    def full(self) -> int:
        """Ranks of the profiled thread count that fill the cores."""
        return max(1, self.cores // max(1, self.threads))

    def rank_threads(self, p: int) -> int:
        """Threads each of p CPU ranks on the node runs: the cores shared out when the ranks
        are fewer, else the profiled count."""
        if self.device != "cpu":
            return self.threads
        return max(self.threads, self.cores // max(1, p))

    def thread_factor(self, p: int) -> float:
        """Compute time of a rank among p against the profiled thread count (<= 1 when the
        ranks are fewer than the cores and the profile measured the speedup of the threads
        each then gets: the measured speedup at the largest profiled count up to them)."""
        t = self.rank_threads(p)
        known = [k for k in self.thread_speedup if k <= t]
        if t <= self.threads or not known:
            return 1.0
        return 1.0 / max(1.0, self.thread_speedup[max(known)])

    def sharing(self, p: int) -> int:
        """Ranks of p whose arrays share one cache hierarchy at a time: on CPUs those running
        at once (p, up to the cores); a GPU per rank shares nothing."""
        if self.device != "cpu":
            return 1
        return max(1, min(p, self.full()))

    def oversubscription(self, p: int) -> float:
        """p·threads/cores where the threads of p CPU ranks outnumber the cores, else 1 (the
        ranks on one node, as :meth:`slowdown` assumes: a CPU profile prices one node).

        What a collective moves, it moves with CPU work (copies, reductions, the socket
        stack) that, inside a step, competes with the peers' compute for time-shared cores;
        the profile's fastest call, ranks in lock-step and mostly waiting on each other, did
        not. Measured on 2 cores, 4 ranks: a collective looped back to back takes 2-2.6x its
        fastest call (all-gather, reduce-scatter, all-to-all alike).
        """
        if self.device != "cpu":
            return 1.0
        return max(1.0, p * self.threads / max(1, self.cores))

    def slowdown(self, p: int) -> float:
        """κ(p): how much slower each of p busy ranks computes than one rank alone.

        On CPUs, ranks that fit the cores (p·threads <= cores) slow each other through shared
        caches and memory: the profiled κ(p). Beyond, the cores are time-shared: p ranks get at
        most full/p of the throughput of the ``full`` ranks that fill the cores, each of those
        already at κ(full), so κ(p) >= κ(full)·p/full whatever a short kernel mix, which one
        scheduler slice can cover, measured at p. Between and beyond profiled sizes κ grows
        with the rank count once cores are shared. 1 on GPUs unless measured.
        """
        if self.device != "cpu":
            return max(1.0, self.contention.get(p, 1.0))
        full = self.full()
        bound = self.oversubscription(p)
        if p > full:
            at_full = [s for s in self.contention if s <= full]
            k_full = self.contention[max(at_full)] if at_full else 1.0
            bound = max(bound, k_full * p / full)
        if p in self.contention:
            return max(1.0, bound, self.contention[p])
        below = [s for s in self.contention if s < p]
        if below:
            s0 = max(below)
            if self.contention[s0] > 1.0:  # already sharing cores: grows with the rank count
                bound = max(bound, self.contention[s0] * p / s0)
        return max(1.0, bound)

    def call_group(self, g: int, p: int) -> int:
        """The group size whose per-call costs (latency, the loaded wait) a collective over g
        of a job's p ranks pays: g, or, on a CPU node whose p ranks' threads outnumber the
        cores, p. A call waits until every peer is scheduled, and with time-shared cores
        that is a wait on all p ranks, not on the g the profile timed while the others
        slept (measured: gp_2d's and the 3D grids' groups of 2 in a 4-rank job on 2 cores
        cost what 4-rank calls do)."""
        if self.device == "cpu" and p > g and self.oversubscription(p) > 1.0:
            return p
        return g

    def per_call_time(self, latency: Callable[[int], float], g: int, p: int) -> float:
        """Seconds a collective over g of a job's p ranks pays per call, ``latency(q)`` its
        profiled latency over q ranks: both the latency and the loaded wait at
        :meth:`call_group`."""
        q = self.call_group(g, p)
        return latency(q) + self.sync_time(q)

    def collective_time(self, t: Callable[[int, float], float], g: int, p: int,
                        sent: float) -> float:
        """Seconds of one collective over g of a job's p ranks sending ``sent`` bytes each,
        ``t(q, bytes)`` its profiled time over q ranks: :meth:`per_call_time`, and the bytes'
        part at g, t(g, sent) - t(g, 0), time-shared by :meth:`oversubscription`."""
        share, q = self.oversubscription(p), self.call_group(g, p)
        if share == 1.0 and q == g:  # GPUs, and CPU ranks that fit the cores: as profiled
            return t(g, sent) + self.sync_time(g)  # (one lookup: a search prices ~10^5)
        return self.per_call_time(lambda q: t(q, 0.0), g, p) + self.bytes_time(
            t(g, sent) - t(g, 0.0), p)

    def bytes_time(self, seconds: float, p: int) -> float:
        """What ``seconds`` of a collective's bytes, as profiled with the peers idle, take in a
        step of p ranks: time-shared by :meth:`oversubscription` (the one rule both the
        attention and the 3D grid planners price bytes by)."""
        return self.oversubscription(p) * seconds

    def compute_factor(self, p: int, world: int | None = None) -> float:
        """What a kernel's profiled time becomes on each of p ranks computing at once: κ(p)
        times the thread factor of a job of ``world`` ranks (default p): a rank's threads are
        set once, by how many ranks share the node, not by how many compute at a time (a
        pipeline stage idle in a bubble lends its core to nobody)."""
        return self.slowdown(p) * self.thread_factor(p if world is None else world)

    def sync_time(self, p: int) -> float:
        """Extra seconds per collective call on p ranks busy between calls (interpolated in p;
        beyond the largest profiled group it grows with the p-1 peers to wait for)."""
        if p <= 1 or not self.sync:
            return 0.0
        return by_group_size(self.sync, p, self.sync.__getitem__,
                             lambda q: self.sync[q] * (p - 1) / max(1, q - 1))
