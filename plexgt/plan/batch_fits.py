"""What the node-sequence (hgt) cost model prices a step with: :class:`BatchProfile`, each
piece of work's seconds as a fit (:class:`BlockFit`, :class:`Fit`) and the memory model's
measured scale.

:func:`default_profile` derives one from FLOP and pass counts priced by a
:class:`~plexgt.plan.agp.SystemModel` (a machine description's or a measured system profile's
coefficients) until a profile of the model itself exists:
:func:`plexgt.plan.batch_profile.measure_batch_profile` measures one (``plexgt profile``
stores it as the profile file's ``batch`` table, :mod:`plexgt.plan.batch_table`, which plan
and train read back); perf/validate_batch_plan.py scores it against measured steps. Every
count is written next to its constant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from plexgt.distributed.collectives import all_reduce_bytes
from plexgt.plan.agp import ELEMENTWISE_PER_NODE_DIM, RING_MERGE_PASSES, SystemModel
from plexgt.plan.batch_shape import BatchShape
from plexgt.plan.host import Host, across_group_sizes

# -- counts (forward + backward of one block unless said) ---------------------------------
GEMM_FMAS = 3
"""A Linear's forward and its two backward products."""
ATTENTION_FMAS = 7
"""Per score and head dim: Q·Kᵀ and P·V forward; backward from the saved lse rebuilds Q·Kᵀ,
then dV, dP, dQ, dK (FlashAttention's backward)."""
SCORE_PASSES = 10
"""Elementwise passes over the [h, R, S] scores a step: bias gather and add, scale, max,
exp, sum, normalise forward; exp again, dP·P, the row sums and dS backward."""
ROW_PASSES = ELEMENTWISE_PER_NODE_DIM["gt"]
"""Elementwise passes over [R, d] a block (LayerNorms, residuals, GELU, dropout, bias adds)."""
ATTENTION_WORKSPACE = 3
"""float32 [B, h, R, Rk + N_s] score blocks alive in a block's backward (scores,
probabilities, their gradient) on the largest key block (the rank's own plus the global
columns)."""
CODE_PASSES = 4
"""Elementwise passes per hop code entry building a sequence's codes."""
OPTIMIZER_PASSES = 16
"""AdamW reads and writes ~16 parameter-sized float32 arrays a step."""


@dataclass(frozen=True)
class Fit:
    """Seconds = latency_s + s_per_byte · bytes."""

    latency_s: float
    s_per_byte: float

    def time(self, nbytes: float) -> float:
        return self.latency_s + self.s_per_byte * nbytes


@dataclass(frozen=True)
class BlockFit:
    """Seconds of a piece of work on one rank for a micro-batch of b sequences of ``rows``
    rows each (and ``cols`` columns where it has a rows x columns part):
    ``per_call_s + b·rows·(per_row_s + per_score_s·cols + per_merge_s·(blocks - 1))``
    (``blocks``: the ring's key blocks, P_cp; each beyond the first is merged into the
    running output). A fit measured at one P_cp folds its merges into ``per_row_s``."""

    per_call_s: float = 0.0
    per_row_s: float = 0.0
    per_score_s: float = 0.0
    per_merge_s: float = 0.0

    def time(self, b: float, rows: float, cols: float = 0.0, blocks: int = 1) -> float:
        return self.per_call_s + b * rows * (self.per_row_s + self.per_score_s * cols
                                             + self.per_merge_s * (blocks - 1))


@dataclass(frozen=True)
class BatchProfile:
    """What the model prices a step with (measured, or :func:`default_profile`'s counts)."""

    block: dict[int, BlockFit]
    """P_cp -> one block's forward + backward computation (ring exchanges not included);
    key 0 serves every P_cp not measured."""
    embed: BlockFit
    """Stage 0 per micro-batch: rows = the rank's N'/P_cp sequence rows (table gather, input
    projection, forward and backward); the sequences' construction is :attr:`sample`."""
    head: BlockFit
    """Last stage per micro-batch: rows = the targets on the busiest cp rank."""
    p2p: Fit
    """One stage-to-stage send/recv."""
    ring: Fit
    """One neighbour exchange of the cp ring."""
    allreduce: dict[int, Fit]
    """Group size -> all-reduce of a buffer of that many bytes (latency, seconds per buffer
    byte); other sizes interpolated (:func:`~plexgt.plan.host.across_group_sizes`)."""
    optimizer_s_per_param: float = 0.0
    depth: tuple[tuple[int, float], ...] = ()
    """Piecewise-linear depth term: (blocks on a stage, multiplier) breaks, ascending: the
    i-th block of a stage (0-based) costs the block time times the multiplier of the last
    break <= i (MegaGraph fits a break near 8 layers); () = linear."""
    score_copies: float = ATTENTION_WORKSPACE
    """float32 [B, h, R, Rk + N_s] score blocks a block's backward holds at once: 3 for a
    kernel that materialises them (scores, probabilities, their gradient), ~0 for a tiled
    (FlashAttention-style) one; the measured peak decides."""
    memory_scale: float = 1.0
    """Measured over counted bytes (allocator rounding, what the counts miss)."""
    memory_base_bytes: int = 0
    """Bytes a rank holds whatever the plan (CUDA context, NCCL, the sampler's cache)."""
    host: Host = field(default_factory=Host)
    """CPU ranks' sharing of a node (κ, threads); nothing shared on GPUs."""
    source: str = "counted"
    sample: BlockFit = BlockFit()
    """Building one sequence (b = 1, rows = cols = N': its draws, feature rows and hop codes
    [N', N']), which every rank does for each of its replica's G/P_dp sequences before the
    pipeline starts: every stage and every cp rank samples the whole sequences it holds rows
    of (measured on Computers: 18 ms a 256-node sequence, a quarter of a 4-sequence step)."""
    contention: dict[int, float] = field(default_factory=dict)
    """Ranks computing at once -> κ measured in this profile's own run; where present it
    replaces :attr:`host`'s, which the quick calibration cached under another load."""
    block_samples: dict[tuple[int, int, int, int], float] = field(default_factory=dict)
    """(P_cp, B, R, S) -> one block's forward + backward measured at exactly that micro-batch
    (R query rows, S key columns a sequence), used there in place of :attr:`block`'s fit.
    Why: the fit is linear in B, and a micro-batch's working set is not: measured on Amazon
    Computers, 4 sequences of 512 nodes took 6 % more than the fit of 1, 2 and 4 (the 4-layer
    model priced K = 1 and K = 2 within 1.5 % where K = 1 ran 10-15 % slower). A table of
    another width, heads or FFN (:func:`~plexgt.plan.batch_table.from_table` scales the
    fits) keeps none."""

    def compute_factor(self, p: int, world: int | None = None) -> float:
        """A profiled compute time's factor on each of p ranks computing at once in a job of
        ``world`` ranks (default p; their count sets each rank's threads): the κ(p) measured
        with this profile (never below the cores' time-sharing), else the host's (this
        profile's sizes merged into its κ, which it extrapolates)."""
        w = p if world is None else world
        if p in self.contention:
            return max(1.0, self.host.oversubscription(p), self.contention[p]) \
                * self.host.thread_factor(w)
        if not self.contention:
            return self.host.compute_factor(p, w)
        return replace(self.host, contention={**self.host.contention, **self.contention}
                       ).compute_factor(p, w)

    def block_seconds(self, cp: int, b: int, rows: int, cols: int) -> float:
        """One block's forward + backward of b sequences of ``rows`` query rows against
        ``cols`` key columns at P_cp = ``cp``: measured where sampled, else the fit."""
        t = self.block_samples.get((cp, b, rows, cols))
        return t if t is not None else self.block_fit(cp).time(b, rows, cols, cp)

    def block_fit(self, cp: int) -> BlockFit:
        fit = self.block.get(cp) or self.block.get(0)
        if fit is None:
            near = min(self.block, key=lambda k: (abs(k - cp), k))
            fit = self.block[near]
        return fit

    def allreduce_time(self, group: int, nbytes: float) -> float:
        if group <= 1 or nbytes <= 0:
            return 0.0
        fits = self.allreduce
        return across_group_sizes(fits, group, lambda q: fits[q].time(nbytes),
                                  lambda q: fits[q].latency_s)

    def depth_blocks(self, n: int | np.ndarray) -> Any:
        """Effective blocks of a stage of n blocks: n, or more past the depth breaks."""
        out = np.asarray(n, dtype=np.float64)
        base = out.copy()
        prev = 1.0
        for at, mult in self.depth:  # blocks at index >= at cost mult
            out = out + (mult - prev) * np.maximum(0.0, base - at)
            prev = mult
        return out if out.ndim else float(out)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (for a profile file's ``batch`` table)."""
        def bf(f: BlockFit) -> dict[str, float]:
            return dict(vars(f))
        return {"block": {str(k): bf(v) for k, v in self.block.items()},
                "embed": bf(self.embed), "head": bf(self.head),
                "p2p": dict(vars(self.p2p)), "ring": dict(vars(self.ring)),
                "allreduce": {str(k): dict(vars(v)) for k, v in self.allreduce.items()},
                "optimizer_s_per_param": self.optimizer_s_per_param,
                "depth": [list(x) for x in self.depth], "score_copies": self.score_copies,
                "memory_scale": self.memory_scale,
                "memory_base_bytes": self.memory_base_bytes, "source": self.source,
                "sample": bf(self.sample),
                "contention": {str(k): v for k, v in self.contention.items()},
                "block_samples": [[*k, t] for k, t in sorted(self.block_samples.items())]}

    @classmethod
    def from_dict(cls, raw: dict[str, Any], host: Host | None = None) -> BatchProfile:
        return cls({int(k): BlockFit(**v) for k, v in raw["block"].items()},
                   BlockFit(**raw["embed"]), BlockFit(**raw["head"]), Fit(**raw["p2p"]),
                   Fit(**raw["ring"]),
                   {int(k): Fit(**v) for k, v in raw["allreduce"].items()},
                   float(raw.get("optimizer_s_per_param", 0.0)),
                   tuple((int(a), float(m)) for a, m in raw.get("depth", ())),
                   float(raw.get("score_copies", ATTENTION_WORKSPACE)),
                   float(raw.get("memory_scale", 1.0)), int(raw.get("memory_base_bytes", 0)),
                   host or Host(), str(raw.get("source", "file")),
                   BlockFit(**raw["sample"]) if "sample" in raw else BlockFit(),
                   {int(k): float(v) for k, v in raw.get("contention", {}).items()},
                   {(int(c), int(b), int(r), int(s)): float(t)
                    for c, b, r, s, t in raw.get("block_samples", ())})


def _linear(t: Callable[[float], float], x: float = float(2**24)) -> Fit:
    lat = t(0.0)
    return Fit(lat, max(0.0, (t(x) - lat) / x))


def default_profile(shape: BatchShape, sysm: SystemModel | None = None,
                    max_group: int = 4096) -> BatchProfile:
    """A profile counted from ``shape``'s FLOPs and passes, priced by ``sysm``'s kernel
    rates (GEMM per FMA, elementwise per element, copy per element, its whole-step
    calibration) and collectives (send_recv for p2p and the ring, all_reduce per group size
    up to ``max_group``); :class:`SystemModel`'s defaults without one. Not a measurement:
    the dense attention's passes are counted as materialised scores, which a fused GPU
    kernel does not pay."""
    sysm = sysm or SystemModel()
    k, sc = sysm.kernels, sysm.compute_scale
    gemm, elem, copy = k["gemm_s_per_fma"], k["elementwise_s_per_elem"], k["copy_s_per_elem"]
    d, m, h = shape.hidden, shape.ffn_mult, shape.heads
    block = BlockFit(
        per_call_s=(k["dense_s_per_block"] + 2 * h * k["attention_s_per_head"]) * sc,
        per_row_s=sc * (GEMM_FMAS * (4 + 2 * m) * d * d * gemm + ROW_PASSES * d * elem),
        per_score_s=sc * (ATTENTION_FMAS * d * gemm + SCORE_PASSES * h * elem),
        per_merge_s=sc * RING_MERGE_PASSES * d * elem)
    fin = shape.features + shape.embed_dim
    embed = BlockFit(per_row_s=sc * (fin * copy + GEMM_FMAS * fin * d * gemm + 4 * fin * elem))
    head = BlockFit(per_row_s=sc * (GEMM_FMAS * d * shape.classes * gemm + 20 * d * elem))
    send = _linear(lambda b: sysm.collective_time("send_recv", 2, int(b)))
    sizes = [2 ** i for i in range(1, max(2, max_group).bit_length())]
    ar = {g: _linear(lambda b, g=g: sysm.collective_time("all_reduce", g,
                                                          all_reduce_bytes(int(b), g)))
          for g in sizes}
    sample = BlockFit(per_row_s=sc * fin * copy, per_score_s=sc * CODE_PASSES * elem)
    return BatchProfile({0: block}, embed, head, send, send, ar,
                        OPTIMIZER_PASSES * elem * sc, host=sysm.host,
                        source=f"counted ({sysm.name})", sample=sample)

