"""The node-sequence (hgt) models' time model: the step's seconds on a dp x pp x cp mesh
(issue 38's Profile -> Model; :mod:`plexgt.plan.batch_search` is the Search). The step's
sizes are :mod:`plexgt.plan.batch_shape`'s, what prices them :mod:`plexgt.plan.batch_fits`'
:class:`~plexgt.plan.batch_fits.BatchProfile`, the bytes per rank :mod:`plexgt.plan.batch_memory`'s.

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
replica's sequences (:attr:`~plexgt.plan.batch_fits.BatchProfile.sample`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from plexgt.plan.batch_fits import BatchProfile
from plexgt.plan.batch_memory import memory_parts
from plexgt.plan.batch_shape import (
    BatchMesh,
    BatchShape,
    check_mesh,
    check_stages,
    micro_rows,
    position,
)

# -- counts ---------------------------------------------------------------------------------
RING_MESSAGES = 3
"""Exchanges of 2·B·Rk·d elements per ring step: K/V forward; K/V and dK/dV backward."""


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


def pipeline_ranks(mesh: BatchMesh) -> int:
    """Ranks computing at once while GPipe runs: every replica's and cp rank's, of at most
    min(K, P_pp) stages (a stage waiting in a bubble sleeps in its receive). On shared CPU
    cores this, not the world, sets the slowdown of a stage's compute: measured here, a
    4-stage K = 1 pipeline on 2 cores ran 0.26 s a step where κ(4) priced 0.72 s."""
    return mesh.dp * mesh.cp * min(mesh.pp, mesh.micro_batches)


def ring_exchanges(shape: BatchShape, cp: int, b: int) -> tuple[int, int]:
    """(exchanges, bytes each) one block's ring makes for a micro-batch of b sequences:
    RING_MESSAGES·(P_cp - 1) of K and V of the rank's N'/P_cp rows, 2·b·(N'/P_cp)·d elements
    (the global nodes' K/V are replicated, never sent; the issue's S = N'/P_cp + N_s counts
    them, HGT_DESIGN does not)."""
    if cp <= 1:
        return 0, 0
    return RING_MESSAGES * (cp - 1), 2 * b * (shape.size // cp) * shape.hidden * shape.esize


def stage_costs(shape: BatchShape, prof: BatchProfile, mesh: BatchMesh) -> StageCosts:
    """The per-stage terms of :func:`stage_seconds` and
    :func:`~plexgt.plan.batch_memory.stage_memory` at ``mesh``."""
    pp, cp = mesh.pp, mesh.cp
    b = shape.sequences // (mesh.dp * mesh.micro_batches)  # sequences of a micro-batch
    d, e = shape.hidden, shape.esize
    r, rk, s = micro_rows(shape, cp)
    cf = prof.compute_factor(pipeline_ranks(mesh), mesh.world)
    n_ex, ex_bytes = ring_exchanges(shape, cp, b)
    block_s = prof.block_seconds(cp, b, r, s) * cf + n_ex * (
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


def sample_seconds(prof: BatchProfile, shape: BatchShape, mesh: BatchMesh) -> float:
    """Before the pipeline: every rank builds its replica's G/P_dp sequences whole."""
    return (shape.sequences // mesh.dp) * prof.sample.time(1, shape.size, shape.size) \
        * prof.compute_factor(mesh.world)


def tail_seconds(prof: BatchProfile, shape: BatchShape, mesh: BatchMesh, params: float) -> float:
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


def step_seconds(shape: BatchShape, prof: BatchProfile, mesh: BatchMesh, stages: Sequence[int]
                 ) -> StepCost:
    """A step's seconds at ``mesh`` with ``stages`` blocks per stage (len = P_pp)."""
    check_mesh(shape, mesh)
    check_stages(shape, stages, mesh.pp)
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


def stage_seconds(shape: BatchShape, prof: BatchProfile, mesh: BatchMesh, layers: int, pos: int
                  ) -> float:
    """A stage of ``layers`` blocks at position ``pos``
    (:func:`~plexgt.plan.batch_shape.position`): its forward + backward of one micro-batch."""
    return float(stage_costs(shape, prof, mesh).time(layers, pos))

