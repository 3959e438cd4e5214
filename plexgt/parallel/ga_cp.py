"""Graph-aware context parallelism (GA-CP): dense biased attention over a sequence split on a ring.

A sequence of N' node rows plus N_s global rows (at its end: positions N' .. N'+N_s-1) is split
over the P_cp members of ``comm``; member c holds n = N'/P_cp sequence rows (rows c·n .. c·n+n-1)
and every global row::

    q, k, v [B, h, n + N_s, d']   its n sequence rows, then the N_s global rows (the same
                                  values on every member)
    codes   [B, n, N'] int8       its rows' hop codes against all N' sequence columns
    bias_weight [5, h]            the layer's Embedding(5, h) weight (the same everywhere)
    out     [B, h, n + N_s, d']   = dense_attention.attend of the whole sequence, these rows

forward: the global K/V are here on every member (code 4 against every row), attended first,
    never sent; then the members' sequence K/V blocks [2, B, h, n, d'] travel around the
    ring P_cp - 1 times (member c sends to c+1 while it computes on the block it holds) and
    each arriving block j is attended with the codes' columns of block j,
    ``codes[:, :, j·n:(j+1)·n]`` (bias sliced to the block that has just arrived: a ring that
    kept the columns of its own block would bias every rotated block wrongly), its output
    merged into the running (out, lse) by the log-sum-exp rule. The global query rows (past
    the codes' n rows: code 4) see every block too, so every member computes their output,
    identically.
backward: the same rotation of K/V again, probabilities recomputed from the saved lse;
    dQ accumulates here, each block's dK/dV accumulator travels one step behind its K/V and
    is home after P_cp - 1 steps (as in :mod:`plexgt.parallel.attention.ring`).

Replicated global rows and their gradients: no collective here sums them. The loss is the sum
over members of each member's own terms (its targets), so the gradient that reaches a
member's copy of a replicated value (the global rows' output, K/V, and before them the
global-row activations and the parameters) is that member's share, and backward, being
linear in the incoming gradient, keeps every downstream gradient a share whose sum over the
members is the single process's: the global rows' dK/dV that a member computes from its share
go into the travelling accumulators like any other row's. So each contribution is summed once,
where the parameters' gradients are summed over the cp members (with the stage's other
replicas); an input of replicated rows that has no parameter above it sums its shares there
too. A term of the loss on a global row is counted on one member only.

Why: per member, the layer keeps n + N_s rows of q, k, v and the output instead of N' + N_s,
and the scores it ever holds are [B, h, n + N_s, block], so activation memory falls ~P_cp-fold
at the price of P_cp - 1 K/V exchanges forward and twice that backward (:func:`ga_cp_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from plexgt.distributed.collectives import Comm, CommOp, shift_async, wait
from plexgt.ops.dense_attention import (
    DEFAULT_BLOCK,
    GLOBAL_CODE,
    block_backward,
    block_forward,
    check_inputs,
    compute_dtype,
    merge_,
)
from plexgt.ops.precision import full_precision

Tensor = torch.Tensor


class GACPFunction(torch.autograd.Function):
    """The ring of the module doc; ``n`` sequence rows a member (the codes' rows)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, codes: Tensor, bias_weight: Tensor,
                comm: Comm, scale: float, block: int) -> Tensor:
        p, me, n = comm.size, comm.rank, codes.shape[1]
        dt = compute_dtype(q)
        with full_precision(q.device):
            qc = q.to(dt)
            if q.shape[2] > n:  # the global keys: on every member, code 4 against every row
                out, lse = block_forward(qc, k[:, :, n:], v[:, :, n:], GLOBAL_CODE, bias_weight,
                                         scale, block)
            else:
                out = torch.zeros_like(qc)
                lse = torch.full(q.shape[:3], -math.inf, dtype=dt, device=q.device)
            cur = torch.stack((k[:, :, :n], v[:, :, :n]))
            for t in range(p):
                handle = nxt = None
                if t + 1 < p:  # the block moves on while this member computes on it
                    nxt = torch.empty_like(cur)
                    handle = shift_async(cur, nxt, comm)
                j = (me - t) % p
                ob, lb = block_forward(qc, cur[0], cur[1], codes[:, :, j * n:(j + 1) * n],
                                       bias_weight, scale, block)
                merge_(out, lse, ob, lb)
                del ob, lb
                if nxt is not None:
                    wait(handle, comm)
                    cur = nxt
        ctx.comm, ctx.scale, ctx.block = comm, scale, block
        ctx.save_for_backward(q, k, v, codes, bias_weight, out, lse)
        return out.to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        q, k, v, codes, w, out, lse = ctx.saved_tensors
        comm: Comm = ctx.comm
        p, me, n = comm.size, comm.rank, codes.shape[1]
        scale, block, dt = ctx.scale, ctx.block, out.dtype
        with full_precision(q.device):
            dout = grad.to(dt)
            delta = (dout * out).sum(-1)
            qc = q.to(dt)
            dq = torch.zeros_like(qc)
            dk = torch.zeros(k.shape, dtype=dt, device=k.device)
            dv = torch.zeros(v.shape, dtype=dt, device=v.device)
            db = torch.zeros(w.shape, dtype=dt, device=w.device)
            if q.shape[2] > n:
                block_backward(qc, k[:, :, n:], v[:, :, n:], GLOBAL_CODE, w, scale, lse, delta,
                               dout, dq, dk[:, :, n:], dv[:, :, n:], db, block)
            cur = torch.stack((k[:, :, :n], v[:, :, :n]))
            acc = acc_in = acc_handle = None
            for t in range(p):
                handle = nxt = None
                if t + 1 < p:
                    nxt = torch.empty_like(cur)
                    handle = shift_async(cur, nxt, comm)
                j = (me - t) % p
                if t == 0:  # this member's own block: into its own gradient directly
                    tk, tv = dk[:, :, :n], dv[:, :, :n]
                else:  # the accumulator of block j, one step behind its K/V
                    if acc_handle is None:
                        acc = torch.zeros((2, *cur.shape[1:]), dtype=dt, device=k.device)
                    else:
                        wait(acc_handle, comm)
                        acc = acc_in
                    assert acc is not None
                    tk, tv = acc[0], acc[1]
                block_backward(qc, cur[0], cur[1], codes[:, :, j * n:(j + 1) * n], w, scale,
                               lse, delta, dout, dq, tk, tv, db, block)
                if t > 0:
                    assert acc is not None
                    acc_in = torch.empty_like(acc)
                    acc_handle = shift_async(acc, acc_in, comm)
                if nxt is not None:
                    wait(handle, comm)
                    cur = nxt
            if acc_handle is not None:  # the own block's accumulator, home after p-1 hops
                wait(acc_handle, comm)
                assert acc_in is not None
                dk[:, :, :n] += acc_in[0]
                dv[:, :, :n] += acc_in[1]
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, db.to(w.dtype), None, None,
                None)


def check_ga_cp(q: Tensor, k: Tensor, v: Tensor, codes: Tensor, bias_weight: Tensor,
                members: int) -> None:
    """One-line ValueErrors for a member's inputs that do not fit the module doc."""
    if not isinstance(codes, Tensor) or codes.dim() != 3:
        raise ValueError("ga_cp: codes must be a [B, n, N'] tensor of this member's rows")
    n, seq = codes.shape[1], codes.shape[2]
    check_inputs(q, k, v, codes[:, :, :n], bias_weight)  # one block's columns against k
    if seq != members * n:
        raise ValueError(f"ga_cp: codes {tuple(codes.shape)} hold {n} rows against {seq} "
                         f"columns, not N'/P_cp = N'/{members} rows of N' columns")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"ga_cp: q holds {q.shape[2]} rows and k {k.shape[2]}: both are this "
                         "member's sequence rows then the global rows")


def ga_cp_attend(q: Tensor, k: Tensor, v: Tensor, codes: Tensor, bias_weight: Tensor,
                 comm: Comm, block: int = DEFAULT_BLOCK) -> Tensor:
    """Member ``comm.rank`` of the cp ring: q, k, v [B, h, n + N_s, d'] (its n = N'/P_cp
    sequence rows, then the N_s global rows), codes [B, n, N'] -> out [B, h, n + N_s, d'],
    these rows of the whole sequence's attention (scale 1/sqrt(d')). Gradients of the
    sequence rows are the single process's; those of the global rows and of bias_weight are
    this member's shares (module doc): summed over the cp members with the parameters'."""
    check_ga_cp(q, k, v, codes, bias_weight, comm.size)
    return GACPFunction.apply(q, k, v, codes, bias_weight, comm, 1.0 / math.sqrt(q.shape[-1]),
                              block)


@dataclass(frozen=True)
class GACPAttention:
    """The model's ``attend(q, k, v, codes, bias_weight)`` on a cp member: :func:`ga_cp_attend`
    over ``comm`` (a trivial one-member Comm is the single process's attention)."""

    comm: Comm
    block: int = DEFAULT_BLOCK

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, codes: Tensor, bias_weight: Tensor
                 ) -> Tensor:
        return ga_cp_attend(q, k, v, codes, bias_weight, self.comm, self.block)


# --------------------------------------------------------------------------- cost and memory
def _rows(seq_len: int, cp: int) -> int:
    if cp < 1 or seq_len % cp:
        raise ValueError(f"ga_cp: P_cp = {cp} does not divide the sequence's {seq_len} nodes")
    return seq_len // cp


def ga_cp_comm(batch: int, seq_len: int, heads: int, head_dim: int, cp: int, esize: int
               ) -> list[CommOp]:
    """One layer's GA-CP point-to-point steps on a member (group 'cp', as the ledger's
    'send_recv' entries): forward P_cp - 1 K/V blocks of 2·B·n·h·d' elements (n = N'/P_cp;
    the global K/V never travel), backward P_cp - 1 of them again plus P_cp - 1 dK/dV
    accumulators (float32 at least, like the sums); ``esize`` the K/V element bytes."""
    n = _rows(seq_len, cp)
    if cp == 1:
        return []
    kv = 2 * batch * n * heads * head_dim * esize
    acc = 2 * batch * n * heads * head_dim * max(esize, 4)
    k = cp - 1
    return [CommOp("send_recv", kv, kv, count=k),
            CommOp("send_recv", kv, kv, "backward", count=k),
            CommOp("send_recv", acc, acc, "backward", count=k)]


def ga_cp_bytes(batch: int, seq_len: int, heads: int, head_dim: int, cp: int, esize: int
                ) -> tuple[int, int]:
    """(forward, backward) bytes one member sends, and receives, in one layer's GA-CP
    (:func:`ga_cp_comm` summed): (P_cp - 1)·2·B·n·h·d'·esize forward, and that plus the
    accumulators' (P_cp - 1)·2·B·n·h·d'·max(esize, 4) backward."""
    ops = ga_cp_comm(batch, seq_len, heads, head_dim, cp, esize)
    fwd = sum(o.total_sent for o in ops if o.phase == "forward")
    return fwd, sum(o.total_sent for o in ops) - fwd


def ga_cp_memory_elems(batch: int, seq_len: int, n_global: int, heads: int, head_dim: int,
                       cp: int, block: int = DEFAULT_BLOCK) -> tuple[int, int]:
    """(kept, transient) elements of one layer's GA-CP attention on a member (compute
    dtype), with S_r = n + N_s rows, n = N'/P_cp, c = min(block, n or N_s):

    kept until the layer's backward: q, k, v and out [B, h, S_r, d'] and lse [B, h, S_r]
    (the probabilities are never kept); transient, the backward's peak (above the
    forward's): dq, dk, dv [B, h, S_r, d'], delta [B, h, S_r], the K/V block and the
    accumulator each in flight twice (8·B·h·n·d', none on one member), and about three
    [B, h, S_r, c] score tiles (P, dS, and the bias or the one-hot codes beside them).
    The codes (int8, [B, n, N']) are the caller's. Measured on one process (B=1, N'=2048,
    h=8, d'=16, float32, block 256): 55.2 MiB peak over the inputs, this 55.1 MiB."""
    n = _rows(seq_len, cp)
    rows = n + n_global
    per = batch * heads
    cols = min(block, max(n, n_global))
    kept = per * rows * (4 * head_dim + 1)
    flight = 8 * n * head_dim if cp > 1 else 0
    transient = per * (rows * (3 * head_dim + 1) + flight + 3 * rows * cols)
    return kept, transient
