"""Bytes per rank of a node-sequence (hgt) pipeline stage on a dp x pp x cp mesh with K
micro-batches (issue 38's Model, memory half; :mod:`plexgt.plan.batch_cost` is the time).

:func:`stage_memory`: a stage's parameters with their gradients and AdamW moments
(``state_bytes`` a parameter), everything its blocks save for backward for ALL G/P_dp
sequences of the replica (GPipe runs every forward before the first backward, so at the
peak all K micro-batches are alive), the hop codes of those sequences, stage 0's saved input
rows and the last stage's head inputs, and the transient of one micro-batch: the attention's
score workspace, the backward's gradients, the ring's in-flight blocks, the p2p buffers.
The profile's measured scale and base turn the counted bytes into a rank's peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from plexgt.plan.batch_fits import ATTENTION_WORKSPACE, BatchProfile
from plexgt.plan.batch_shape import BatchMesh, BatchShape, micro_rows

# -- counts (one block unless said) -------------------------------------------------------
SAVED_ROWS = 7
"""[R, d] tensors a pre-norm block saves: its input (LN1's), LN1's output (the QKV GEMM's),
q, k, v (attention's), the attention output (Wo's and attention's), LN2's input."""
SAVED_FFN = 2
"""[R, m·d] tensors its FFN saves: the GELU's input and the second GEMM's input."""
LN_STATS = 4
"""float32 per row saved by the two LayerNorms (mean and rstd each)."""
DROPOUT_SITES = 2
"""[R, d] dropout sites a block has (after Wo, after the FFN)."""
BACKWARD_ROWS, BACKWARD_FFN = 6, 1
"""[B, R, d] and [B, R, m·d] gradients alive at once in a block's backward."""
RING_BUFFERS = 8
"""[B, Rk, d] blocks the ring holds in flight (K, V, dK, dV; the current and the next)."""
CODE_SCRATCH = 4
"""Bytes of construction workspace per hop code entry (the BFS frontier / reachability)."""
CODE_BYTES = 1
"""int8 hop codes."""


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
        """Bytes of a stage of ``layers`` blocks at ``pos``
        (:func:`~plexgt.plan.batch_shape.position`), by part."""
        first, last = pos in (0, 3), pos in (2, 3)
        return {"states": layers * self.block_states + first * self.first_states
                + last * self.last_states,
                "activations": layers * self.block_saved + first * self.first_saved
                + last * self.last_saved,
                "codes": self.codes,
                "transient": max(self.transient, self.build if first else 0),
                "p2p": self.p2p}


def memory_parts(shape: BatchShape, mesh: BatchMesh, score_copies: float = ATTENTION_WORKSPACE
                 ) -> MemoryParts:
    """The counted parts of :func:`stage_memory` at ``mesh`` (see the module doc), with
    ``score_copies`` score blocks in a block's backward
    (:attr:`~plexgt.plan.batch_fits.BatchProfile.score_copies`)."""
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


def stage_memory(shape: BatchShape, prof: BatchProfile, mesh: BatchMesh, layers: int, pos: int
                 ) -> int:
    """Peak bytes per rank of a stage of ``layers`` blocks at position ``pos``: the
    profile's scale times :class:`MemoryParts`' sum, plus its base."""
    parts = memory_parts(shape, mesh, prof.score_copies).stage(layers, pos)
    return int(prof.memory_scale * sum(parts.values()) + prof.memory_base_bytes)
