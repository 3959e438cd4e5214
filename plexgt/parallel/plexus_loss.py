"""Losses and metrics over the 3D grid's output shards: exact, without gathering the logits.

The last layer's logits Z are [ceil(N/Gc), C_pad/(Ga·Gb)]: rows over its role c, class (or
task) columns over the plane a·b (``plexus_comms`` names that group 'plane'). Why not
gather Z and call torch's loss: at papers100M's scale a gather of N x C logits is the largest
tensor of the step. Softmax statistics (max, exp-sum, target logit) are reduced over the plane
per row instead, and the loss sum and count over the row axis; the backward is local.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from plexgt.distributed.collectives import Comm, all_reduce_
from plexgt.distributed.layout3d import LayerLayout
from plexgt.parallel.rows1d import gather_scores


class _ParallelCrossEntropy(torch.autograd.Function):
    """Mean softmax cross-entropy over class shards held by the ranks of one plane.

    Forward reduces row maxima, exp-sums and target logits over the plane and the loss sum over
    the row axis; backward is local: (softmax - onehot) / n for this rank's class columns.
    """

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                col0: int, n_classes: int, plane: Comm, rows: Comm) -> torch.Tensor:
        cols = torch.arange(col0, col0 + z.shape[1], device=z.device)
        valid = cols < n_classes
        zm = z.masked_fill(~valid, float("-inf"))
        m = zm.max(dim=1).values if z.shape[1] else torch.full(
            (z.shape[0],), float("-inf"), dtype=z.dtype, device=z.device)
        all_reduce_(m, plane, "max")
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(zm - m[:, None])
        s = e.sum(dim=1)
        local = (target[:, None] == cols[None, :]) & valid
        zt = (z * local).sum(dim=1)
        stats = torch.stack([s, zt], dim=1)
        all_reduce_(stats, plane)
        s, zt = stats[:, 0], stats[:, 1]
        maskf = mask.to(z.dtype)
        tot = torch.stack([((torch.log(s) + m - zt) * maskf).sum(), maskf.sum()])
        all_reduce_(tot, rows)
        n = tot[1].clamp(min=1)
        ctx.save_for_backward(e / s[:, None], local, maskf, n)
        return tot[0] / n

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        p, local, maskf, n = ctx.saved_tensors
        dz = (p - local.to(p.dtype)) * (maskf / n)[:, None] * g
        return dz, None, None, None, None, None, None


def parallel_cross_entropy(z: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                           lay: LayerLayout, comms: dict[str, Comm]) -> torch.Tensor:
    """Mean cross-entropy over ``mask``ed rows of the last layer's logits shard.

    z: [ceil(N/Gc), C_pad/(Ga·Gb)] (rows over c, classes over a·b); target, mask: [ceil(N/Gc)].
    Returns the global mean (the same scalar on every rank).
    """
    return _ParallelCrossEntropy.apply(
        z, target, mask, lay.out_cols[0], lay.d_out_true, comms["plane"], comms[lay.roles[2]]
    )


@torch.no_grad()
def parallel_correct(z: torch.Tensor, target: torch.Tensor, masks: dict[str, torch.Tensor],
                     lay: LayerLayout, comms: dict[str, Comm]) -> dict[str, tuple[int, int]]:
    """(correct, total) per split, argmax over the class shards (ties: lowest class id)."""
    cols = torch.arange(lay.out_cols[0], lay.out_cols[1], device=z.device)
    zm = z.masked_fill(cols[None, :] >= lay.d_out_true, float("-inf"))
    if z.shape[1]:
        best, arg = zm.max(dim=1)
    else:
        best = torch.full((z.shape[0],), float("-inf"), dtype=z.dtype, device=z.device)
        arg = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
    gbest = best.clone()
    all_reduce_(gbest, comms["plane"], "max")
    big = torch.iinfo(torch.int64).max
    cand = torch.where(best == gbest, arg + lay.out_cols[0], torch.full_like(arg, big))
    all_reduce_(cand, comms["plane"], "min")
    # collectives take tensors on the group's device (an NCCL group has no CPU backend)
    counts = torch.stack([torch.stack([((cand == target) & m).sum(), m.sum()])
                          for m in masks.values()]).to(torch.int64)
    all_reduce_(counts, comms[lay.roles[2]])
    return {k: (c[0], c[1]) for k, c in zip(masks, counts.cpu().tolist())}


class _ParallelBinaryCrossEntropy(torch.autograd.Function):
    """Multi-label tasks: mean per-task binary cross-entropy over task shards of one plane.

    Elementwise, so nothing but the (sum, count) pair crosses ranks: reduced over the plane
    (task columns) and the row axis. Backward is local: (sigmoid - y) · w / n.
    """

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                col0: int, plane: Comm, rows: Comm) -> torch.Tensor:
        y = _task_columns(target, col0, z.shape[1])
        w = ((y >= 0) & mask[:, None]).to(z.dtype)
        y = y.clamp(min=0).to(z.dtype)
        per = F.binary_cross_entropy_with_logits(z, y, reduction="none") * w
        tot = torch.stack([per.sum(), w.sum()])
        all_reduce_(tot, plane)
        all_reduce_(tot, rows)
        n = tot[1].clamp(min=1)
        ctx.save_for_backward(torch.sigmoid(z), y, w, n)
        return tot[0] / n

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        sig, y, w, n = ctx.saved_tensors
        return (sig - y) * (w / n) * g, None, None, None, None, None


def _task_columns(target: torch.Tensor, col0: int, width: int) -> torch.Tensor:
    """[rows, width] of the [rows, T] task labels for columns col0.. (-1 past T: padding)."""
    out = torch.full((target.shape[0], width), -1, dtype=target.dtype, device=target.device)
    have = max(0, min(width, target.shape[1] - col0))
    out[:, :have] = target[:, col0:col0 + have]
    return out


def parallel_binary_cross_entropy(z: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                                  lay: LayerLayout, comms: dict[str, Comm]) -> torch.Tensor:
    """Multi-label tasks: mean binary cross-entropy over the labelled (node, task) pairs of
    ``mask``ed rows. z: [ceil(N/Gc), T_pad/(Ga·Gb)] (rows over c, tasks over a·b); target:
    [ceil(N/Gc), T] (every task; -1 unlabelled), mask: [ceil(N/Gc)]. The global mean on every
    rank."""
    return _ParallelBinaryCrossEntropy.apply(z, target, mask, lay.out_cols[0], comms["plane"],
                                             comms[lay.roles[2]])


@torch.no_grad()
def parallel_scores(z: torch.Tensor, target: torch.Tensor, masks: dict[str, torch.Tensor],
                    lay: LayerLayout, comms: dict[str, Comm]
                    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(score, label) of every labelled node of each split on every rank of the row axis.
    The class (task) columns are split over the plane: each rank adds its columns' share, the
    plane sums; rows are gathered over the last axis, as :func:`parallel_correct` sums its
    counts. Binary tasks (target [rows]): score [k] = logit_1 - logit_0. Multi-label (target
    [rows, T]): scores and labels [k, T]."""
    c0, c1 = lay.out_cols
    multi = target.ndim == 2
    if multi:  # each rank's task columns placed in a [rows, T] zero frame
        t = target.shape[1]
        score = torch.zeros(z.shape[0], t, dtype=torch.float64, device=z.device)
        hi = max(c0, min(c1, t))
        score[:, c0:hi] = z[:, :hi - c0].double()
    else:
        cols = torch.arange(c0, c1, device=z.device)
        sign = (cols == 1).to(torch.float64) - (cols == 0).to(torch.float64)
        score = ((z.double() * sign[None, :]).sum(dim=1) if z.shape[1] else
                 torch.zeros(z.shape[0], dtype=torch.float64, device=z.device))[:, None]
    all_reduce_(score, comms["plane"])
    return gather_scores(score, target, masks, comms[lay.roles[2]])
