"""One stage of the registry's node-sequence model on synthetic micro-batches: what the
profile step (:mod:`plexgt.plan.batch_profile`) times and measures.

Apart from the measurement because it is the model's side of it (how a stage is built from
a :class:`~plexgt.plan.batch_shape.BatchShape` and run on one cp member's rows, its attention
on a real or loopback ring), which the timing, ring, contention and memory measurements all
share.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.models.registry import default_registry
from plexgt.models.sequence import Rows
from plexgt.parallel.ga_cp import GACPAttention
from plexgt.plan.batch_shape import BatchShape


def batch_model() -> type:
    """The model registry's batch-layout model class (the one node-sequence model)."""
    return next(s.reference for s in default_registry() if s.layout == "batch")


def fastest_time(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` calls after a warm-up: on shared cores other work only adds
    time (this VM's load swung between 5 and 48 while the first profiles were taken, and
    their medians priced a block 2.5x its time in a quiet step)."""
    fn()  # warm-up: workspaces, the allocator's first touch
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(min(times))


def stage_model(shape: BatchShape, blocks: int, first: bool, last: bool, dropout: float
           ) -> torch.nn.Module:
    ref = batch_model()
    return ref(in_dim=shape.features, hidden=shape.hidden, out_dim=shape.classes,
               num_layers=max(1, blocks), heads=shape.heads, dropout=dropout,
               ffn_mult=shape.ffn_mult, global_nodes=shape.global_nodes,
               num_nodes=max(1, shape.nodes), node_embedding=shape.embed_dim,
               blocks=range(blocks), embed=first, head=last)


class StageInputs:
    """Synthetic micro-batch of b sequences as cp member ``member`` of P_cp holds it; its
    attention on ``comm`` (a real cp group), else on a loopback ring of P_cp."""

    def __init__(self, shape: BatchShape, b: int, size: int, cp: int, seed: int = 0,
                 comm: Comm | None = None) -> None:
        g = torch.Generator().manual_seed(seed)
        n = size // cp
        self.n, self.b = n, b
        lo = n * (comm.rank if comm is not None else 0)
        self.rows = Rows.full(torch.arange(b), size, shape.global_nodes).part(lo, lo + n)
        self.codes = torch.randint(0, 4, (b, n, size), generator=g).to(torch.int8)
        self.x = torch.randn(b, n, shape.features, generator=g)
        self.ids = torch.randint(0, max(1, shape.nodes), (b, n), generator=g)
        self.h = torch.randn(b, n + shape.global_nodes, shape.hidden, generator=g)
        t = min(shape.targets, n)
        self.targets = torch.full((b,), t, dtype=torch.int64)
        self.labels = torch.randint(0, shape.classes, (b * t,), generator=g)
        self.attend = GACPAttention(comm or Comm.loopback(cp, "cp", CommLedger()))


def run_stage(model: Any, inp: StageInputs, step: int, backward: bool = True) -> Any:
    """One micro-batch through a stage: embed (first), blocks, head + loss (last); backward
    from the loss, or from a unit gradient of the stage's output (a middle stage's)."""
    h = model.embed_rows(inp.x, inp.ids if model.embed.table is not None else None,
                         inp.rows, step) if model.embed is not None \
        else inp.h.clone().requires_grad_(True)
    h = model.run_blocks(h, inp.codes, inp.rows, step, inp.attend)
    if model.head is not None:
        out = F.cross_entropy(model.head_logits(h, inp.rows, inp.targets), inp.labels,
                              reduction="sum")
        if backward:
            out.backward()
        return out
    if backward:
        h.backward(torch.ones_like(h))
    return h
