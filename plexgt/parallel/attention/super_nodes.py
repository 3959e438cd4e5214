"""Super rows over a node partition: each rank's partial softmax state, merged by all-reduce.

Shapes on rank r of p: qs, ks, vs [S, h, d'] replicated (from the replicated super states);
k, v [n_r, h, d'] the rank's real rows (node partition, every head) -> ys [S, h, d'] on every
rank, equal to :func:`plexgt.ops.super_nodes.super_attention` over all N real and S super keys.

    shift [h, S] = max over ranks of the row maxima       all-reduce MAX (no gradient: the
                                                           softmax does not depend on it)
    (l, o) = Σ exp(s - shift)·(1, v) over the rank's keys   rank 0 adds the S super keys
    (L, O) = Σ_ranks (l, o)                               one all-reduce SUM of [h·S·(d'+1)]
    ys = O / L

The sum's adjoint is an all-reduce of the gradients (each rank's backward holds the part of
dY_s its own rows caused), so a layer's super rows cost three all-reduces of a few KB whatever
N is: the state of S rows, never their N scores. The super keys count once, on rank 0.

Every strategy runs this on the node partition it starts from, before any exchange, so one
function serves them all; the real rows' S extra columns are the strategies' own business.
"""

from __future__ import annotations

import torch

from plexgt.distributed.collectives import Comm, CommOp, all_reduce, all_reduce_, all_reduce_bytes
from plexgt.ops.precision import LOW_PRECISION
from plexgt.ops.super_nodes import partial_state, row_max
from plexgt.parallel.attention.strategy import AttentionProblem

Tensor = torch.Tensor


def super_rows(qs: Tensor, ks: Tensor, vs: Tensor, k: Tensor, v: Tensor, comm: Comm,
               scale: float) -> Tensor:
    """qs, ks, vs [S, h, d'] replicated, k, v [n_r, h, d'] real rows of this rank ->
    ys [S, h, d'] replicated (see the module doc). Low precision is computed in float32."""
    dt = torch.float32 if qs.dtype in LOW_PRECISION else qs.dtype
    qs, ks, vs, k, v = (t.to(dt) for t in (qs, ks, vs, k, v))
    s, h, dh = qs.shape
    shift = torch.maximum(row_max(qs, k, scale), row_max(qs, ks, scale))
    all_reduce_(shift, comm, op="max")
    l, o = partial_state(qs, k, v, scale, shift)
    if comm.rank == 0:
        ls, os_ = partial_state(qs, ks, vs, scale, shift)
        l, o = l + ls, o + os_
    packed = all_reduce(torch.cat([l.reshape(-1), o.reshape(-1)]), comm)
    total, out = packed[:h * s].view(h, s), packed[h * s:].view(s, h, dh)
    return out / total.t().unsqueeze(-1)


def super_comm(problem: AttentionProblem, p: int) -> list[CommOp]:
    """The super rows' all-reduces of one block: MAX of [h, S] and SUM of [h·S·(d'+1)]
    forward, the SUM's adjoint backward (float32 at least); none without super nodes."""
    if p == 1 or problem.super_nodes == 0:
        return []
    esize = max(problem.esize, 4)
    hs = problem.heads * problem.super_nodes
    mx = all_reduce_bytes(hs * esize, p)
    sm = all_reduce_bytes(hs * (problem.head_dim + 1) * esize, p)
    return [CommOp("all_reduce", mx, mx), CommOp("all_reduce", sm, sm),
            CommOp("all_reduce", sm, sm, "backward")]
