"""The node-sequence (batch layout) models' cost model: bytes per rank of each pipeline
stage and the step's seconds on a dp x pp x cp mesh (issue 38's Profile -> Model;
:mod:`plexgt.plan.batch_search` is the Search).

A step on the mesh: replica r of P_dp takes G/P_dp of the step's G sequences and
splits them into K GPipe micro-batches of B = G/(P_dp·K); each of the P_pp stages holds a
contiguous run of blocks; each sequence's N' rows are split over the P_cp ranks of a stage,
every cp rank also holding the N_s global rows (replicated, their K/V never sent). So on one
rank of a stage, per sequence: R = N'/P_cp + N_s query rows, S = N' + N_s key columns, and
its own key block Rk = N'/P_cp rows travels around the cp ring.

Time (:func:`step_seconds`): GPipe's critical path, Σ_s t_s + (K - 1)·max_s t_s (t_s a
stage's forward + backward of one micro-batch: the first micro-batch walks every stage, the
other K - 1 queue behind the slowest; the bubble is the sum's excess over max_s t_s), then
every stage group (its P_dp·P_cp ranks) all-reduces its gradients and steps AdamW; the step
ends with the stage of most parameters. (K + P_pp - 1)·max_s t_s, the even pipeline's form,
counts a full slot for every light stage: an uneven pp2 K2 [1,3] measured 0.45 s here and
that form priced it 0.86 s. A stage's micro-batch time is its blocks' (each its computation at this
P_cp from the profile's fit, plus 3·(P_cp - 1) ring exchanges of 2·B·Rk·d elements: K/V
forward; K/V again and dK/dV backward), times the profile's piecewise-linear depth term,
plus stage 0's embedding, the last stage's head, and one activation send each way when
P_pp > 1 (forward h [B, R, d], backward dh; every rank builds its own hop codes). On shared
CPU cores a stage's compute is slowed by the ranks computing at once during GPipe
(:func:`pipeline_ranks`), not by the whole world. Before the pipeline every rank builds its
replica's sequences (:attr:`BatchProfile.sample`).

Memory (:func:`stage_memory`): a stage's parameters with their gradients and AdamW moments
(``state_bytes`` a parameter), everything its blocks save for backward for ALL G/P_dp
sequences of the replica (GPipe runs every forward before the first backward, so at the
peak all K micro-batches are alive), the hop codes of those sequences, stage 0's saved input
rows and the last stage's head inputs, and the transient of one micro-batch: the attention's
score workspace, the backward's gradients, the ring's in-flight blocks, the p2p buffers.

Every count is written next to its constant; :class:`BatchProfile` holds what is measured.
:func:`default_profile` derives one from FLOP and pass counts priced by a
:class:`~plexgt.plan.agp.SystemModel` (a machine description's or a measured system profile's
coefficients) until a profile of the model itself exists:
:func:`plexgt.plan.batch_profile.measure_batch_profile` measures one (``plexgt profile``
stores it as the profile file's ``batch`` table, :mod:`plexgt.plan.batch_table`, which plan
and train read back); perf/validate_batch_plan.py scores it against measured steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from plexgt.config import TrainConfig
from plexgt.distributed.collectives import all_reduce_bytes
from plexgt.plan.agp import ELEMENTWISE_PER_NODE_DIM, RING_MERGE_PASSES, SystemModel
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
SAVED_ROWS = 7
"""[R, d] tensors a pre-norm block saves: its input (LN1's), LN1's output (the QKV GEMM's),
q, k, v (attention's), the attention output (Wo's and attention's), LN2's input."""
SAVED_FFN = 2
"""[R, m·d] tensors its FFN saves: the GELU's input and the second GEMM's input."""
LN_STATS = 4
"""float32 per row saved by the two LayerNorms (mean and rstd each)."""
DROPOUT_SITES = 2
"""[R, d] dropout sites a block has (after Wo, after the FFN)."""
ATTENTION_WORKSPACE = 3
"""float32 [B, h, R, Rk + N_s] score blocks alive in a block's backward (scores,
probabilities, their gradient) on the largest key block (the rank's own plus the global
columns)."""
BACKWARD_ROWS, BACKWARD_FFN = 6, 1
"""[B, R, d] and [B, R, m·d] gradients alive at once in a block's backward."""
RING_BUFFERS = 8
"""[B, Rk, d] blocks the ring holds in flight (K, V, dK, dV; the current and the next)."""
RING_MESSAGES = 3
"""Exchanges of 2·B·Rk·d elements per ring step: K/V forward; K/V and dK/dV backward."""
CODE_SCRATCH = 4
"""Bytes of construction workspace per hop code entry (the BFS frontier / reachability)."""
CODE_PASSES = 4
"""Elementwise passes per hop code entry building a sequence's codes."""
OPTIMIZER_PASSES = 16
"""AdamW reads and writes ~16 parameter-sized float32 arrays a step."""
CODE_BYTES = 1
"""int8 hop codes."""


@dataclass(frozen=True)
class BatchShape:
    """One node-sequence training step's sizes (model, batch and graph)."""

    layers: int
    """Blocks L."""
    hidden: int
    """Width d."""
    heads: int
    """Heads h (d' = d / h)."""
    size: int
    """Sequence length N' (``batch.size``); P_cp divides it."""
    sequences: int
    """Sequences per step G over all replicas (``batch.sequences``); P_dp divides it."""
    features: int
    """Input width F."""
    classes: int
    """Classes C."""
    ffn_mult: int = 2
    """FFN width in units of d."""
    global_nodes: int = 1
    """Learned global nodes N_s (replicated on every cp rank)."""
    targets: int = 256
    """Targets per sequence (its first rows; the head reads only them)."""
    nodes: int = 0
    """|V|: rows of the node-embedding table (0 with no table)."""
    embed_dim: int = 0
    """D: the table's width (``model.node_embedding``; 0: none)."""
    esize: int = 4
    """Bytes per activation element."""
    state_bytes: int = 16
    """Bytes per parameter: AdamW float32 = the parameter, its gradient, 2 moments."""
    grad_bytes: int = 4
    """Bytes per parameter's gradient (what the stage group all-reduces)."""
    mask_bytes: int = 0
    """Bytes a dropout site saves per element: 0 where the counter-based mask is recomputed
    in backward (the Triton kernel, GPUs), the element size where torch multiplies by a saved
    multiplier tensor (CPU)."""

    def __post_init__(self) -> None:
        for k in ("layers", "hidden", "heads", "size", "sequences", "features", "classes",
                  "ffn_mult", "esize", "state_bytes"):
            if getattr(self, k) < 1:
                raise ValueError(f"node-sequence shape: {k} = {getattr(self, k)} must be >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"node-sequence shape: hidden {self.hidden} is not divisible by "
                             f"{self.heads} heads")

    @classmethod
    def from_config(cls, cfg: TrainConfig, nodes: int, features: int, classes: int) -> BatchShape:
        """The shape a config trains on a graph of ``nodes`` nodes, ``features`` input
        columns and ``classes`` classes (float32 state; masks saved on a CPU's torch path
        are the caller's to set)."""
        m, b = cfg.model, cfg.batch
        return cls(m.layers, m.hidden, m.heads, b.size, b.sequences, features, classes,
                   m.ffn_mult, b.global_nodes, b.targets, nodes if m.node_embedding else 0,
                   m.node_embedding, cfg.esize)

    @property
    def block_params(self) -> int:
        """One block: LN1, QKV, Wo, LN2, FFN (biased Linears), the [5, h] bias table."""
        d, m = self.hidden, self.ffn_mult
        return (4 + 2 * m) * d * d + (9 + m) * d + 5 * self.heads

    @property
    def embed_params(self) -> int:
        """Stage 0's own: the input Linear (F + D) -> d, the [|V|, D] table, [N_s, d]."""
        d = self.hidden
        return (self.features + self.embed_dim) * d + d + self.nodes * self.embed_dim \
            + self.global_nodes * d

    @property
    def head_params(self) -> int:
        """The last stage's own: final LayerNorm and Linear d -> C."""
        return 2 * self.hidden + self.hidden * self.classes + self.classes

    @property
    def params(self) -> int:
        return self.layers * self.block_params + self.embed_params + self.head_params


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

    def compute_factor(self, p: int) -> float:
        """A profiled compute time's factor on each of p ranks computing at once: the κ(p)
        measured with this profile (never below the cores' time-sharing), else the host's
        (this profile's sizes merged into its κ, which it extrapolates)."""
        if p in self.contention:
            return max(1.0, self.host.oversubscription(p), self.contention[p]) \
                * self.host.thread_factor(p)
        if not self.contention:
            return self.host.compute_factor(p)
        return replace(self.host, contention={**self.host.contention, **self.contention}
                       ).compute_factor(p)

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
                "contention": {str(k): v for k, v in self.contention.items()}}

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
                   {int(k): float(v) for k, v in raw.get("contention", {}).items()})


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


# -- one configuration's stage costs ----------------------------------------------------
@dataclass(frozen=True)
class Mesh:
    """(dp, pp, cp, K) of a step, and the world the ranks share a node in."""

    dp: int
    pp: int
    cp: int
    micro_batches: int

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.cp


def check_mesh(shape: BatchShape, mesh: Mesh) -> None:
    """ValueError (one line) unless the mesh divides the step as the design requires."""
    g, k = shape.sequences, mesh.micro_batches
    if min(mesh.dp, mesh.pp, mesh.cp, k) < 1:
        raise ValueError(f"node-sequence mesh {mesh}: every factor must be >= 1")
    if g % mesh.dp:
        raise ValueError(f"parallel.dp = {mesh.dp} does not divide batch.sequences = {g}")
    if (g // mesh.dp) % k:
        raise ValueError(f"parallel.micro_batches = {k} does not divide the {g // mesh.dp} "
                         f"sequences of a replica")
    if shape.size % mesh.cp:
        raise ValueError(f"parallel.cp = {mesh.cp} does not divide batch.size = {shape.size}")
    if mesh.pp > shape.layers:
        raise ValueError(f"parallel.pp = {mesh.pp} is more stages than the {shape.layers} "
                         f"layers")


@dataclass(frozen=True)
class StageCosts:
    """A configuration's per-stage terms, each O(1) in a stage's block count n: a stage
    costs ``n`` blocks (``depth``-adjusted for time) plus its position's extras (0 first,
    1 middle, 2 last, 3 the only stage)."""

    block_s: float
    """One block's forward + backward of a micro-batch, its ring exchanges included."""
    extra_s: tuple[float, float, float, float]
    """Embed (first), head (last), p2p (each stage when P_pp > 1), by position."""
    block_bytes: float
    """States and saved activations of one block (unscaled)."""
    extra_bytes: tuple[float, float, float, float]
    """Embedding/head states and saved inputs, codes, transient, p2p buffers (unscaled)."""
    block_params: int
    extra_params: tuple[int, int, int, int]
    memory_scale: float
    memory_base: int
    profile: BatchProfile

    def time(self, n: Any, pos: int) -> Any:
        return self.profile.depth_blocks(n) * self.block_s + self.extra_s[pos]

    def memory(self, n: Any, pos: int) -> Any:
        return self.memory_scale * (np.asarray(n) * self.block_bytes + self.extra_bytes[pos]) \
            + self.memory_base

    def params(self, n: Any, pos: int) -> Any:
        return np.asarray(n) * self.block_params + self.extra_params[pos]


def pipeline_ranks(mesh: Mesh) -> int:
    """Ranks computing at once while GPipe runs: every replica's and cp rank's, of at most
    min(K, P_pp) stages (a stage waiting in a bubble sleeps in its receive). On shared CPU
    cores this, not the world, sets the slowdown of a stage's compute: measured here, a
    4-stage K = 1 pipeline on 2 cores ran 0.26 s a step where κ(4) priced 0.72 s."""
    return mesh.dp * mesh.cp * min(mesh.pp, mesh.micro_batches)


def position(i: int, pp: int) -> int:
    """Stage i's position code: 3 the only stage, 0 first, 2 last, 1 middle."""
    return 3 if pp == 1 else 0 if i == 0 else 2 if i == pp - 1 else 1


def ring_exchanges(shape: BatchShape, cp: int, b: int) -> tuple[int, int]:
    """(exchanges, bytes each) one block's ring makes for a micro-batch of b sequences:
    RING_MESSAGES·(P_cp - 1) of K and V of the rank's N'/P_cp rows, 2·b·(N'/P_cp)·d elements
    (the global nodes' K/V are replicated, never sent; the issue's S = N'/P_cp + N_s counts
    them, HGT_DESIGN does not)."""
    if cp <= 1:
        return 0, 0
    return RING_MESSAGES * (cp - 1), 2 * b * (shape.size // cp) * shape.hidden * shape.esize


def micro_rows(shape: BatchShape, cp: int) -> tuple[int, int, int]:
    """(R, Rk, S): query rows a rank holds per sequence (its N'/P_cp and the N_s global
    rows), its own key rows (N'/P_cp, what travels), and the key columns (N' + N_s)."""
    rk = shape.size // cp
    return rk + shape.global_nodes, rk, shape.size + shape.global_nodes


def stage_costs(shape: BatchShape, prof: BatchProfile, mesh: Mesh) -> StageCosts:
    """The per-stage terms of :func:`stage_seconds` and :func:`stage_memory` at ``mesh``."""
    pp, cp = mesh.pp, mesh.cp
    b = shape.sequences // (mesh.dp * mesh.micro_batches)  # sequences of a micro-batch
    d, e = shape.hidden, shape.esize
    r, rk, s = micro_rows(shape, cp)
    cf = prof.compute_factor(pipeline_ranks(mesh))
    n_ex, ex_bytes = ring_exchanges(shape, cp, b)
    block_s = prof.block_fit(cp).time(b, r, s, cp) * cf + n_ex * (
        prof.ring.time(ex_bytes) if n_ex else 0.0)
    tgt = min(shape.targets, rk)
    embed_s = prof.embed.time(b, rk, shape.size) * cf
    head_s = prof.head.time(b, tgt) * cf
    p2p_s = 0.0
    if pp > 1:  # h forward, dh backward (every rank builds its own hop codes: none sent)
        p2p_s = 2 * prof.p2p.time(b * r * d * e)
    mp = memory_parts(shape, mesh, prof.score_copies)
    fixed = [float(sum(mp.stage(0, pos).values())) for pos in range(4)]
    return StageCosts(
        block_s, (embed_s + p2p_s, p2p_s, head_s + p2p_s, embed_s + head_s),
        mp.block_states + mp.block_saved, (fixed[0], fixed[1], fixed[2], fixed[3]),
        shape.block_params,
        (shape.embed_params, 0, shape.head_params, shape.embed_params + shape.head_params),
        prof.memory_scale, prof.memory_base_bytes, prof)


@dataclass(frozen=True)
class MemoryParts:
    """The counted bytes per rank of a configuration's stages (before the profile's scale
    and base): what a block adds, what every stage holds, and the first's and last's own."""

    block_states: int
    """One block's parameters, gradients and AdamW moments."""
    block_saved: int
    """What one block saves for backward, for every sequence alive (G/P_dp)."""
    codes: int
    """The alive sequences' hop codes [Rk, N'] int8 (every stage's bias reads them)."""
    transient: int
    """One micro-batch's backward through a block: score workspace, gradients, ring blocks."""
    p2p: int
    """Send and receive buffers of one micro-batch (P_pp > 1)."""
    first_states: int
    """Stage 0: input projection, node-embedding table, global nodes (states)."""
    first_saved: int
    """Stage 0: the alive sequences' input rows [Rk, F + D] (and masks) and ids."""
    build: int
    """Stage 0: building one micro-batch's codes; replaces the transient when larger (the
    construction runs in forward, the transient in backward)."""
    last_states: int
    """Last stage: the head's states."""
    last_saved: int
    """Last stage: the head's saved inputs (LN in/out at the targets) and logits."""

    def stage(self, layers: int, pos: int) -> dict[str, int]:
        """Bytes of a stage of ``layers`` blocks at ``pos`` (:func:`position`), by part."""
        first, last = pos in (0, 3), pos in (2, 3)
        return {"states": layers * self.block_states + first * self.first_states
                + last * self.last_states,
                "activations": layers * self.block_saved + first * self.first_saved
                + last * self.last_saved,
                "codes": self.codes,
                "transient": max(self.transient, self.build if first else 0),
                "p2p": self.p2p}


def memory_parts(shape: BatchShape, mesh: Mesh, score_copies: float = ATTENTION_WORKSPACE
                 ) -> MemoryParts:
    """The counted parts of :func:`stage_memory` at ``mesh`` (see the module doc), with
    ``score_copies`` score blocks in a block's backward (:attr:`BatchProfile.score_copies`)."""
    live = shape.sequences // mesh.dp  # GPipe: every micro-batch alive at the peak
    b = live // mesh.micro_batches
    d, m, h, e = shape.hidden, shape.ffn_mult, shape.heads, shape.esize
    r, rk, _ = micro_rows(shape, mesh.cp)
    saved = r * d * e * (SAVED_ROWS + SAVED_FFN * m) + 4 * r * (h + LN_STATS) \
        + DROPOUT_SITES * r * d * shape.mask_bytes
    transient = (int(score_copies * b * h * r * (rk + shape.global_nodes) * 4)
                 + b * r * d * e * (BACKWARD_ROWS + BACKWARD_FFN * m)
                 + (RING_BUFFERS * b * rk * d * e if mesh.cp > 1 else 0))
    fin = shape.features + shape.embed_dim
    tgt = min(shape.targets, rk)
    return MemoryParts(
        block_states=shape.block_params * shape.state_bytes, block_saved=live * saved,
        codes=live * rk * shape.size * CODE_BYTES, transient=transient,
        p2p=2 * b * r * d * e if mesh.pp > 1 else 0,
        first_states=shape.embed_params * shape.state_bytes,
        first_saved=live * rk * (fin * (e + shape.mask_bytes) + 8),
        build=b * rk * shape.size * CODE_SCRATCH,
        last_states=shape.head_params * shape.state_bytes,
        last_saved=live * tgt * (2 * d * e + 4 * shape.classes))


def sample_seconds(prof: BatchProfile, shape: BatchShape, mesh: Mesh) -> float:
    """Before the pipeline: every rank builds its replica's G/P_dp sequences whole."""
    return (shape.sequences // mesh.dp) * prof.sample.time(1, shape.size, shape.size) \
        * prof.compute_factor(mesh.world)


def tail_seconds(prof: BatchProfile, shape: BatchShape, mesh: Mesh, params: float) -> float:
    """Outside the pipeline: the sequences built before it (:func:`sample_seconds`), then a
    stage group's (P_dp·P_cp ranks) gradient all-reduce and AdamW over ``params`` parameters
    (the step waits for the stage holding the most)."""
    return sample_seconds(prof, shape, mesh) \
        + prof.allreduce_time(mesh.dp * mesh.cp, params * shape.grad_bytes) \
        + prof.optimizer_s_per_param * params * prof.compute_factor(mesh.world)


@dataclass(frozen=True)
class StepCost:
    """One step's predicted seconds and its parts."""

    slot_s: float
    """The slowest stage's micro-batch (forward + backward, p2p included)."""
    pipeline_s: float
    """GPipe's critical path: Σ_s t_s + (K - 1)·slot_s (:func:`pipeline_seconds`)."""
    tail_s: float
    """Gradient all-reduce and optimizer of the stage with most parameters."""
    stage_s: tuple[float, ...]

    @property
    def step_s(self) -> float:
        return self.pipeline_s + self.tail_s


def check_stages(shape: BatchShape, stages: Sequence[int]) -> None:
    if any(n < 1 for n in stages):
        raise ValueError(f"parallel.stages = {','.join(map(str, stages))}: every stage needs "
                         f"at least one layer")
    if sum(stages) != shape.layers:
        raise ValueError(f"parallel.stages = {','.join(map(str, stages))} sums to "
                         f"{sum(stages)}, not model.layers = {shape.layers}")


def step_seconds(shape: BatchShape, prof: BatchProfile, mesh: Mesh, stages: Sequence[int]
                 ) -> StepCost:
    """A step's seconds at ``mesh`` with ``stages`` blocks per stage (len = P_pp)."""
    check_mesh(shape, mesh)
    check_stages(shape, stages)
    if len(stages) != mesh.pp:
        raise ValueError(f"{len(stages)} stages for parallel.pp = {mesh.pp}")
    c = stage_costs(shape, prof, mesh)
    per = tuple(float(c.time(n, position(i, mesh.pp))) for i, n in enumerate(stages))
    params = max(int(c.params(n, position(i, mesh.pp))) for i, n in enumerate(stages))
    pipe = pipeline_seconds(per, mesh.micro_batches)
    return StepCost(max(per), pipe, tail_seconds(prof, shape, mesh, params), per)


def pipeline_seconds(stage_s: Sequence[float], micro_batches: int) -> float:
    """GPipe's critical path over stages of ``stage_s`` seconds a micro-batch (forward +
    backward): Σ_s t_s + (K - 1)·max_s t_s. Per phase the first micro-batch passes every
    stage once and each of the other K - 1 leaves the slowest one t_max after the previous;
    summing the two phases into t_s keeps that exact where every stage's forward/backward
    ratio is the same (blocks dominate; the edges' embed and head shift it a little)."""
    return float(sum(stage_s)) + (micro_batches - 1) * float(max(stage_s))


def stage_seconds(shape: BatchShape, prof: BatchProfile, mesh: Mesh, layers: int, pos: int
                  ) -> float:
    """A stage of ``layers`` blocks at position ``pos`` (:func:`position`): its forward +
    backward of one micro-batch."""
    return float(stage_costs(shape, prof, mesh).time(layers, pos))


def stage_memory(shape: BatchShape, prof: BatchProfile, mesh: Mesh, layers: int, pos: int
                 ) -> int:
    """Peak bytes per rank of a stage of ``layers`` blocks at position ``pos``: the
    profile's scale times :class:`MemoryParts`' sum, plus its base."""
    parts = memory_parts(shape, mesh, prof.score_copies).stage(layers, pos)
    return int(prof.memory_scale * sum(parts.values()) + prof.memory_base_bytes)
