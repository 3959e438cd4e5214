"""The hierarchical graph transformer on one rank of a dp x pp x cp mesh: data, pipeline and
context parallelism, equal to the single process.

Rank (d, p, c) (:class:`~plexgt.distributed.mesh.Mesh`) holds::

    parameters     stage p's piece of the model (embed on the first stage, blocks
                   ``stages[p]`` by global index, head on the last): the single
                   process's names and initial values; copies on every (d, c) of stage p
    sequences      of each step of G = batch.sequences: replica d's share, split into K
                   equal micro-batches (:func:`~plexgt.distributed.mesh.micro_batch`)
    rows           of each sequence: sequence rows [c·n, (c+1)·n), n = N'/P_cp, then every
                   global row (replicated: each cp rank computes its own copy)
    h              [B_k, n + N_s, d] per micro-batch, sent to (d, p + 1, c)
    codes          [B_k, n, N'] int8: its rows against every sequence column (every stage)
    x, ids         [B_k, n, F], [B_k, n] (first stage); labels of its target rows (last)

A step: every rank samples its replica's sequences itself (the sampler's draws are a pure
function of (seed, epoch, index), so all of them see the single process's), runs GPipe
(:func:`~plexgt.parallel.pipeline.gpipe_step`) with the loss of its own target rows divided
by the step's total targets (a number every rank knows), then sums every parameter's
gradient over the stage group (all d and c). Why that sum is exact with replicated global
rows: the loss is the sum over cp ranks of each rank's own targets' terms; rank c's copy of
the global rows feeds only rank c's computation, so the gradient that reaches it is the
derivative of rank c's terms alone, and the sequence rows' K/V it reads from the other ranks
send their gradients home through the collective's adjoint. Each term is thus
backpropagated once, by one rank, and summing the parameters' gradients over the ranks adds
every term's contribution exactly once: no extra all-reduce of the global rows.

Context parallelism's attention is one function, :func:`cp_attend`: GA-CP's ring
(:mod:`plexgt.parallel.ga_cp`; global K/V local on every rank); :func:`cp_attend_bytes` is
its ledger formula.

Checkpoints are canonical (the single process's names and shapes on every rank):
:meth:`HGTPipeline.to_canonical` broadcasts each stage's tensors from its (d = 0, c = 0) rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from plexgt.config import BatchConfig
from plexgt.data.node_batches import EVAL_EPOCH, SPLITS
from plexgt.data.node_batches import Sequence as NodeSequence
from plexgt.distributed.collectives import (
    Comm,
    CommLedger,
    all_reduce_,
)
from plexgt.distributed.mesh import Mesh, MeshGroups, micro_batch
from plexgt.distributed.p2p import Pipe, pipeline_p2p_bytes
from plexgt.models.sequence import Attend, Rows, sequence_loss
from plexgt.parallel.ga_cp import GACPAttention, ga_cp_bytes
from plexgt.parallel.pipeline import (
    gpipe_forward,
    gpipe_step,
    gradient_bytes,
    loss_bytes,
    reduce_gradients,
)

Tensor = torch.Tensor
PREFIX = "model."
"""The stage piece's prefix in this wrapper's parameter names."""


# -- context parallelism's attention -------------------------------------------------------


def cp_attend(comm: Comm) -> Attend:
    """The :data:`~plexgt.models.sequence.Attend` of cp rank ``comm.rank``: q, k, v [B, h, n + N_s,
    d'] (its n sequence rows, then the global rows), codes [B, n, N'].

    GA-CP (:mod:`plexgt.parallel.ga_cp`): the sequence rows' K/V blocks rotate around the cp
    ring with an online softmax, the bias's columns sliced to the block that arrived, the
    global rows' K/V local on every rank; one member is the single process's blocked exact
    attention (its [h, S, S] probabilities never held whole). Bytes:
    :func:`cp_attend_bytes`."""
    return GACPAttention(comm)


def cp_attend_bytes(batch: int, rows: int, hidden: int, cp: int, esize: int
                    ) -> dict[str, int]:
    """Bytes one cp rank sends (and receives) in one layer's forward and backward of
    :func:`cp_attend` on a micro-batch of ``batch`` sequences, ``rows`` = n sequence rows per
    rank: :func:`~plexgt.parallel.ga_cp.ga_cp_bytes` (P_cp - 1 K/V blocks forward, again
    with their gradient accumulators backward), under the ledger's 'send_recv'."""
    fwd, bwd = ga_cp_bytes(batch, rows * cp, 1, hidden, cp, esize)
    return {"send_recv": fwd + bwd}


# -- the layout and this rank's data -----------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where a run puts the model: the mesh, each stage's global layer indices, and GPipe's
    micro-batches K per step."""

    mesh: Mesh
    stages: tuple[range, ...]
    micro_batches: int

    def __str__(self) -> str:
        return str(self.mesh)


class Batches(Protocol):
    """What the pipeline reads of the sampler (:class:`~plexgt.data.node_batches.NodeBatches`)."""

    batch: BatchConfig

    def sequence(self, split: str, epoch: int, index: int) -> NodeSequence: ...
    def steps(self, split: str) -> int: ...
    def step_targets(self, split: str, step: int) -> int: ...
    def count(self, split: str) -> int: ...


@dataclass(frozen=True)
class LocalBatch:
    """One micro-batch as a cp rank holds it (rows [lo, hi) of each sequence)."""

    x: Tensor
    """[B, n, F] float32 (features of its rows)."""
    ids: Tensor
    """[B, n] int64."""
    codes: Tensor
    """[B, n, N'] int8."""
    targets: Tensor
    """[B] int64: each sequence's target count (its positions 0..t-1 are targets)."""
    seq: Tensor
    """[B] int64 sequence indices (dropout keys)."""
    labels: Tensor
    """[M] int64: the labels of the target rows among [lo, hi), sequence by sequence."""


def local_batch(seqs: Sequence[NodeSequence], lo: int, hi: int, device: torch.device
                ) -> LocalBatch:
    """Rows [lo, hi) of each of ``seqs``, stacked."""
    return LocalBatch(
        torch.stack([s.features[lo:hi] for s in seqs]).to(device),
        torch.stack([s.ids[lo:hi] for s in seqs]).to(device),
        torch.stack([s.codes[lo:hi] for s in seqs]).to(device),
        torch.tensor([s.targets for s in seqs], dtype=torch.int64, device=device),
        torch.tensor([s.index for s in seqs], dtype=torch.int64, device=device),
        torch.cat([s.labels[lo:min(hi, s.targets)] for s in seqs]).to(device))


# -- the model of one rank --------------------------------------------------------------------


class HGTPipeline(nn.Module):
    """Rank (d, p, c)'s piece of the hierarchical graph transformer and its step.

    ``reference``: the single-process model's class (:class:`~plexgt.models.hgt.
    HierarchicalGT`), built with ``kwargs`` and ``blocks=layout.stages[p]``: the same names
    and values as the whole model's. ``batches``: the sequences (every rank opens its own
    sampler). Collective to construct (every rank of the world, in step)."""

    def __init__(self, reference: type, kwargs: dict[str, Any], layout: Layout,
                 groups: MeshGroups, batches: Batches, ledger: CommLedger,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64,
                 attend: Callable[[Comm], Attend] = cp_attend) -> None:
        super().__init__()
        mesh = layout.mesh
        if groups.mesh != mesh:
            raise ValueError(f"groups of mesh {groups.mesh} for layout {mesh}")
        self.layout, self.groups, self.batches = layout, groups, batches
        self.d, self.p, self.c = groups.coords
        self.device, self.dtype = torch.device(device), dtype
        self.first, self.last = groups.first, groups.last
        self.model = reference(**kwargs, blocks=layout.stages[self.p]).to(self.device, dtype)
        self.hidden = int(kwargs["hidden"])
        self.n_global = int(kwargs.get("global_nodes", 1))
        size = batches.batch.size
        self.n = size // mesh.cp
        self.lo, self.hi = self.c * self.n, (self.c + 1) * self.n
        self.ledger = ledger
        self.pipe = Pipe(groups.prev, groups.next, groups.pipe, ledger)
        self.cp = Comm.from_group(groups.cp, "cp", ledger)
        self.stage = Comm.from_group(groups.stage, "stage", ledger)
        self.world = Comm.from_group(groups.world, "world", ledger)
        self.attend = attend(self.cp)
        self.step = 0
        """Training steps taken (the dropout masks' step key; checkpointed)."""
        self.described = self._describe()

    # -- canonical state ----------------------------------------------------------------
    def _describe(self) -> list[list[tuple[str, tuple[int, ...], torch.dtype]]]:
        """Per stage: its parameters' canonical names, shapes and dtype (from every rank; one
        object all-gather at construction)."""
        mine = [(n, tuple(p.shape), p.dtype) for n, p in self.model.named_parameters()]
        if self.world.size == 1:
            return [mine]
        got: list[Any] = [None] * self.world.size
        dist.all_gather_object(got, (self.p, mine), group=self.groups.world)
        out: list[Any] = [None] * self.layout.mesh.pp
        for p, desc in got:
            out[p] = desc
        return out

    def to_canonical(self, local: dict[str, Tensor]) -> dict[str, Tensor]:
        """Parameter-shaped tensors of this rank keyed by its parameter names -> the whole
        model's, on every rank (collective over the world: stage s's from its (0, s, 0) rank,
        one broadcast of them flattened)."""
        out: dict[str, Tensor] = {}
        mesh = self.layout.mesh
        for s, desc in enumerate(self.described):
            src = mesh.rank(0, s, 0)
            dtype = desc[0][2] if desc else self.dtype
            count = sum(math.prod(shape) for _, shape, _ in desc)
            if self.groups.rank == src:
                flat = torch.cat([local[PREFIX + n].detach().reshape(-1).to(self.device, dtype)
                                  for n, _, _ in desc]) if desc else \
                    torch.zeros(0, dtype=dtype, device=self.device)
            else:
                flat = torch.empty(count, dtype=dtype, device=self.device)
            if self.world.size > 1:
                dist.broadcast(flat, src, group=self.groups.world)
            off = 0
            for n, shape, _ in desc:
                k = math.prod(shape)
                out[n] = flat[off:off + k].view(shape).cpu().clone()
                off += k
        return out

    def from_canonical(self, full: dict[str, Tensor]) -> dict[str, Tensor]:
        """This stage's tensors out of the whole model's, on the local device and dtype."""
        return {k: full[k.removeprefix(PREFIX)].to(t.device, t.dtype)
                for k, t in self.state_dict().items() if k.removeprefix(PREFIX) in full}

    def counted(self, name: str) -> bool:  # noqa: ARG002 - a stage's parameters alike
        """Whether this rank counts ``name`` in a sum over the world: the stage's (d = 0,
        c = 0) copy does (the gradients are summed over the stage group, so all are equal)."""
        return self.d == 0 and self.c == 0

    # -- data -----------------------------------------------------------------------------
    def micro_batches(self, split: str, epoch: int, step: int) -> list[LocalBatch]:
        """This rank's rows of its replica's K micro-batches of step ``step``."""
        mesh, g = self.layout.mesh, self.batches.batch.sequences
        k = self.layout.micro_batches
        out = []
        for j in range(k):
            seqs = [self.batches.sequence(split, epoch, step * g + i)
                    for i in micro_batch(g, mesh.dp, k, self.d, j)]
            out.append(local_batch(seqs, self.lo, self.hi, self.device))
        return out

    def rows(self, b: LocalBatch) -> Rows:
        """The rows this rank holds of micro-batch ``b``'s sequences."""
        return Rows.full(b.seq, self.batches.batch.size, self.n_global).part(self.lo, self.hi)

    def in_shape(self, k: int) -> tuple[int, int, int]:
        """The activation a stage receives for micro-batch k: [B_k, n + N_s, d]."""
        del k
        g, mesh = self.batches.batch.sequences, self.layout.mesh
        return (g // (mesh.dp * self.layout.micro_batches), self.n + self.n_global,
                self.hidden)

    def _stage(self, b: LocalBatch, x: Any, step: int) -> Tensor:
        """This stage's layers on micro-batch ``b``: the hidden rows after its last block."""
        rows = self.rows(b)
        h = self.model.embed_rows(b.x, b.ids, rows, step) if self.first else x
        return self.model.run_blocks(h, b.codes, rows, step, self.attend)

    # -- a training step and evaluation ---------------------------------------------------
    def train_step(self, epoch: int, i: int) -> Tensor:
        """Step ``i`` of ``epoch``: forward and backward under GPipe, gradients summed over the
        stage group, ``step`` advanced; returns the step's loss (replicated, 0-d float64).
        The optimizer step is the caller's."""
        mbs = self.micro_batches("train", epoch, i)
        total = self.batches.step_targets("train", i)
        step = self.step

        def fn(k: int, x: Any) -> Tensor:
            b = mbs[k]
            h = self._stage(b, x, step)
            if not self.last:
                return h.to(self.dtype)
            return sequence_loss(self.model.head_logits(h, self.rows(b), b.targets),
                                 b.labels, total)

        loss = gpipe_step(fn, self.pipe, self.layout.micro_batches, inputs=lambda k: mbs[k],
                          in_shape=self.in_shape, dtype=self.dtype, device=self.device,
                          loss_comm=self.world)
        reduce_gradients(self.model.parameters(), self.stage)
        self.step += 1
        return loss

    @torch.no_grad()
    def evaluate(self) -> dict[str, tuple[int, int]]:
        """{split: (correct, total)} over every target of each split (the evaluation
        sequences, in order; no dropout), summed over the world: one all-reduce."""
        was = self.training
        self.eval()
        counts = torch.zeros(len(SPLITS), dtype=torch.int64, device=self.device)
        for s, split in enumerate(SPLITS):
            for i in range(self.batches.steps(split)):
                mbs = self.micro_batches(split, EVAL_EPOCH, i)

                def fn(k: int, x: Any, mbs: list[LocalBatch] = mbs) -> Tensor:
                    b = mbs[k]
                    h = self._stage(b, x, 0)
                    if not self.last:
                        return h.to(self.dtype)
                    pred = self.model.head_logits(h, self.rows(b), b.targets).argmax(dim=1)
                    return (pred == b.labels).sum()

                outs = gpipe_forward(fn, self.pipe, self.layout.micro_batches,
                                     inputs=lambda k, mbs=mbs: mbs[k], in_shape=self.in_shape,
                                     dtype=self.dtype, device=self.device)
                for o in outs:
                    counts[s] += o.to(counts.device)
        all_reduce_(counts, self.world)
        self.train(was)
        got = counts.cpu().tolist()
        return {split: (int(got[s]), self.batches.count(split))
                for s, split in enumerate(SPLITS)}

    def forward(self, *args: Any) -> Tensor:  # noqa: ARG002
        raise TypeError("HGTPipeline runs whole steps: train_step(epoch, i), evaluate()")


def step_bytes(layout: Layout, stage: int, batch: BatchConfig, hidden: int,
               param_bytes: Sequence[int], esize: int
               ) -> dict[tuple[str, str], tuple[int, int]]:
    """(sent, received) bytes of one rank of ``stage`` in one training step, per ledger
    (group, op): the pipeline's activations and gradients ('pp'), :func:`cp_attend`'s
    collectives ('cp') over the stage's layers and micro-batches, the gradient all-reduce
    over the stage group ('stage', ``param_bytes``: the stage's parameters' bytes in order)
    and the loss's ('world'); entries of no bytes left out."""
    mesh, k = layout.mesh, layout.micro_batches
    b = batch.sequences // (mesh.dp * k)
    n = batch.size // mesh.cp
    msg = b * (n + batch.global_nodes) * hidden * esize
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for op, sr in pipeline_p2p_bytes(stage, mesh.pp, [msg] * k).items():
        out[("pp", op)] = sr
    if mesh.cp > 1:
        for op, v in cp_attend_bytes(b, n, hidden, mesh.cp, esize).items():
            total = v * k * len(layout.stages[stage])
            out[("cp", op)] = (total, total)
    grads = gradient_bytes(param_bytes, mesh.dp * mesh.cp)
    out[("stage", "all_reduce")] = (grads, grads)
    loss = loss_bytes(mesh.size) if mesh.size > 1 else 0
    out[("world", "all_reduce")] = (loss, loss)
    return {key: v for key, v in out.items() if any(v)}
