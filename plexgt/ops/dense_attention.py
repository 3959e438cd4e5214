"""Exact dense multi-head attention with a per-head structural bias, in column blocks.

Shapes (B sequences, h heads, head width d')::

    q [B, h, Sq, d']   k, v [B, h, Sk, d']   codes int [B, Rc, Cc] (Rc <= Sq, Cc <= Sk)
    bias_weight [5, h] (a layer's Embedding(5, h) weight)
    out[b, h, i] = sum_j softmax_j(q_i . k_j * scale + bias_weight[code(b, i, j), h]) v_j

``code(b, i, j)`` is ``codes[b, i, j]`` inside the codes' extent and :data:`GLOBAL_CODE` (4)
outside it: the rows past Rc and the columns past Cc are the global nodes, which sit at the
end of the model's sequence, so a caller passes the [B, N', N'] hop codes of a sequence of
N' + N_s rows as they are, without a padded [S, S] copy. An integer ``codes`` is one code for
every pair (a block of global keys).

Why blocks: the forward keeps only the output and the rows' log-sum-exp (lse [B, h, Sq]), never
the [Sq, Sk] probabilities; K/V are visited ``block`` columns at a time with an online
softmax, so the transient memory is O(B·h·Sq·block) and the kept memory O(B·h·Sq·d'). The
backward recomputes each block's probabilities from the saved lse (P = exp(S - lse)) and uses
FlashAttention's identity dS = P ⊙ (dP - delta), delta = rowsum(dO ⊙ O), so no row needs to be
whole; the bias's gradient is dS summed per (code, head).

The block-level pieces (:func:`block_forward`, :func:`merge_`, :func:`block_backward`) are
what a ring (:mod:`plexgt.parallel.ga_cp`) runs on K/V blocks that arrive one at a time:
a block's output is normalised within the block and carries its own lse, merged by the
log-sum-exp rule; the backward of a block takes the whole rows' lse and delta.
Low-precision inputs are computed on, and accumulated, in float32.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from plexgt.ops.precision import LOW_PRECISION, full_precision

Tensor = torch.Tensor
Codes = Tensor | int

NUM_CODES = 5
"""Hop codes 0 (same node), 1, 2, 3 (3 or more / unreachable) and 4 (a global node)."""
GLOBAL_CODE = 4
"""The code of every pair that involves a global node (rows or columns past the codes)."""
DEFAULT_BLOCK = 256
"""K/V columns per step of the online softmax."""
_CODE_RANGE = torch.arange(NUM_CODES)


def compute_dtype(x: Tensor) -> torch.dtype:
    """float32 for half-precision inputs (their sums need it), else x's dtype."""
    return torch.float32 if x.dtype in LOW_PRECISION else x.dtype


# --------------------------------------------------------------------------- the bias
def _code_cols(codes: Codes, c0: int, c1: int) -> tuple[Tensor | None, int]:
    """The codes of columns [c0, c1) that lie inside the codes' extent ([B, Rc, c] or None),
    and c (the rest, up to c1, are global columns)."""
    if isinstance(codes, int):
        return None, 0
    e = max(c0, min(c1, codes.shape[2]))
    if e == c0:
        return None, 0
    return codes[:, :, c0:e], e - c0


def _add_bias_(s: Tensor, codes: Codes, w: Tensor, c0: int) -> None:
    """s [B, h, Sq, c] += the bias of columns [c0, c0 + c) (module doc's ``code``)."""
    h = w.shape[1]
    if isinstance(codes, int):
        s.add_(w[codes].view(1, h, 1, 1))
        return
    tile, c = _code_cols(codes, c0, c0 + s.shape[3])
    g = w[GLOBAL_CODE].view(1, h, 1, 1)
    r = codes.shape[1]
    if tile is not None:
        s[:, :, :r, :c].add_(F.embedding(tile.int(), w).permute(0, 3, 1, 2))
    s[:, :, :r, c:].add_(g)
    s[:, :, r:].add_(g)


def _add_bias_grad_(db: Tensor, ds: Tensor, codes: Codes, c0: int) -> None:
    """db [5, h] += ds [B, h, Sq, c] summed over the pairs of each code (columns from c0).

    One GEMM per sequence against the pairs' one-hot codes [Rc·c, 5]: as fast as one
    index_add_ pass on the CPU (which is 3.5x slower with int32 indices and needs an int64
    index tile), and on a GPU no atomics into 5·h addresses, so the same bits every run."""
    B, h = ds.shape[:2]
    if isinstance(codes, int):
        db[codes] += ds.sum((0, 2, 3))
        return
    tile, c = _code_cols(codes, c0, c0 + ds.shape[3])
    r = codes.shape[1]
    db[GLOBAL_CODE] += ds[:, :, :r, c:].sum((0, 2, 3)) + ds[:, :, r:].sum((0, 2, 3))
    if tile is None:
        return
    part = ds[:, :, :r, :c].reshape(B, h, r * c)
    onehot = (tile.unsqueeze(-1) == _CODE_RANGE.to(tile.device, tile.dtype)).to(ds.dtype)
    db += torch.bmm(part, onehot.reshape(B, r * c, NUM_CODES)).sum(0).t()


# --------------------------------------------------------------------------- block pieces
def _col_chunks(sk: int, block: int) -> range:
    return range(0, sk, max(1, block))


def block_forward(q: Tensor, k: Tensor, v: Tensor, codes: Codes, bias_weight: Tensor,
                  scale: float, block: int = DEFAULT_BLOCK) -> tuple[Tensor, Tensor]:
    """q [B, h, Sq, d'] against one K/V block k, v [B, h, Sk, d'] (codes: this block's
    columns, module doc) -> (out [B, h, Sq, d'] softmax-normalised within the block,
    lse [B, h, Sq]), both in q's dtype (the caller's compute dtype). Visits the block
    ``block`` columns at a time with an online softmax (running max m, sum l, unnormalised
    accumulator), so the scores held are [B, h, Sq, block]."""
    B, h, sq, d = q.shape
    m = torch.full((B, h, sq, 1), -math.inf, dtype=q.dtype, device=q.device)
    l_ = torch.zeros((B, h, sq, 1), dtype=q.dtype, device=q.device)
    acc = torch.zeros((B, h, sq, d), dtype=q.dtype, device=q.device)
    w = bias_weight.to(q.dtype)
    for c0 in _col_chunks(k.shape[2], block):
        c1 = min(k.shape[2], c0 + block)
        s = torch.matmul(q, k[:, :, c0:c1].to(q.dtype).transpose(-1, -2)).mul_(scale)
        _add_bias_(s, codes, w, c0)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        s.sub_(m_new).exp_()
        alpha = torch.exp(m - m_new)  # 0 on the first chunk (m = -inf, m_new finite)
        l_.mul_(alpha).add_(s.sum(-1, keepdim=True))
        acc.mul_(alpha).add_(torch.matmul(s, v[:, :, c0:c1].to(q.dtype)))
        m = m_new
    return acc.div_(l_), (m + torch.log(l_)).squeeze(-1)


def merge_(out: Tensor, lse: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """The softmax over two column sets from each one's normalised output [B, h, Sq, d'] and
    lse [B, h, Sq]: written into (out, lse) and returned. Rows whose lse is -inf (nothing
    seen yet, out = 0) take the block's."""
    new = torch.logaddexp(lse, lse_b)
    w_old = torch.exp(lse - new).nan_to_num_(0.0).unsqueeze(-1)
    w_new = torch.exp(lse_b - new).nan_to_num_(0.0).unsqueeze(-1)
    out.mul_(w_old).add_(out_b * w_new)
    lse.copy_(new)
    return out, lse


def block_backward(q: Tensor, k: Tensor, v: Tensor, codes: Codes, bias_weight: Tensor,
                   scale: float, lse: Tensor, delta: Tensor, dout: Tensor, dq: Tensor,
                   dk: Tensor, dv: Tensor, dbias: Tensor | None,
                   block: int = DEFAULT_BLOCK) -> None:
    """One K/V block's gradients, accumulated in place: dq [B, h, Sq, d'] += dS K·scale,
    dk, dv [B, h, Sk, d'] += dSᵀ Q·scale, Pᵀ dO, and dbias [5, h] += dS summed per code
    (None: not wanted). ``lse``, ``delta`` [B, h, Sq] are the whole rows' (over every
    block), so P = exp(S - lse) is this block's share of the row's softmax."""
    w = bias_weight.to(q.dtype)
    lse_, delta_ = lse.unsqueeze(-1), delta.unsqueeze(-1)
    for c0 in _col_chunks(k.shape[2], block):
        c1 = min(k.shape[2], c0 + block)
        kb, vb = k[:, :, c0:c1].to(q.dtype), v[:, :, c0:c1].to(q.dtype)
        p = torch.matmul(q, kb.transpose(-1, -2)).mul_(scale)
        _add_bias_(p, codes, w, c0)
        p.sub_(lse_).exp_()
        dv[:, :, c0:c1] += torch.matmul(p.transpose(-1, -2), dout)
        ds = torch.matmul(dout, vb.transpose(-1, -2)).sub_(delta_).mul_(p)
        del p
        if dbias is not None:
            _add_bias_grad_(dbias, ds, codes, c0)
        ds.mul_(scale)
        dq += torch.matmul(ds, kb)
        dk[:, :, c0:c1] += torch.matmul(ds.transpose(-1, -2), q)


def check_inputs(q: Tensor, k: Tensor, v: Tensor, codes: Codes, bias_weight: Tensor) -> None:
    """One-line ValueErrors for shapes that do not fit the module doc's contract."""
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4:
        raise ValueError(f"dense attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v "
                         f"{tuple(v.shape)} are not [B, h, S, d'] with k and v alike")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"dense attention: q {tuple(q.shape)} and k {tuple(k.shape)} differ "
                         "in batch, heads or head width")
    if tuple(bias_weight.shape) != (NUM_CODES, q.shape[1]):
        raise ValueError(f"dense attention: bias_weight {tuple(bias_weight.shape)} is not "
                         f"[{NUM_CODES}, {q.shape[1]}]")
    if isinstance(codes, int):
        if not 0 <= codes < NUM_CODES:
            raise ValueError(f"dense attention: code {codes} is not in 0..{NUM_CODES - 1}")
        return
    if (codes.dim() != 3 or codes.shape[0] != q.shape[0] or codes.shape[1] > q.shape[2]
            or codes.shape[2] > k.shape[2]):
        raise ValueError(f"dense attention: codes {tuple(codes.shape)} do not fit q "
                         f"{tuple(q.shape)} and k {tuple(k.shape)} ([B, <= Sq, <= Sk])")
    if codes.is_floating_point() or codes.is_complex():
        raise ValueError(f"dense attention: codes are {codes.dtype}, not an integer type")


class DenseBiasAttention(torch.autograd.Function):
    """out = softmax(q kᵀ·scale + bias) v, saving (q, k, v, out, lse): module doc."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, codes: Codes, bias_weight: Tensor,
                scale: float, block: int) -> Tensor:
        dt = compute_dtype(q)
        with full_precision(q.device):
            out, lse = block_forward(q.to(dt), k, v, codes, bias_weight, scale, block)
        ctx.scale, ctx.block = scale, block
        ctx.codes = codes if isinstance(codes, int) else None
        saved_codes = codes if not isinstance(codes, int) else None
        ctx.save_for_backward(q, k, v, saved_codes, bias_weight, out, lse)
        return out.to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        q, k, v, saved_codes, w, out, lse = ctx.saved_tensors
        codes = ctx.codes if saved_codes is None else saved_codes
        dt = out.dtype
        with full_precision(q.device):
            dout = grad.to(dt)
            delta = (dout * out).sum(-1)
            qc = q.to(dt)
            dq = torch.zeros_like(qc)
            dk = torch.zeros(k.shape, dtype=dt, device=k.device)
            dv = torch.zeros(v.shape, dtype=dt, device=v.device)
            want_db = ctx.needs_input_grad[4]
            db = torch.zeros(w.shape, dtype=dt, device=w.device) if want_db else None
            block_backward(qc, k, v, codes, w, ctx.scale, lse, delta, dout, dq, dk, dv, db,
                           ctx.block)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None,
                None if db is None else db.to(w.dtype), None, None)


def attend(q: Tensor, k: Tensor, v: Tensor, codes: Codes, bias_weight: Tensor,
           block: int = DEFAULT_BLOCK) -> Tensor:
    """q [B, h, Sq, d'], k, v [B, h, Sk, d'], codes [B, Rc <= Sq, Cc <= Sk] (int8; the pairs
    past them are global, code 4) or one int code, bias_weight [5, h] -> out [B, h, Sq, d']
    (scale 1/sqrt(d')); gradients for q, k, v and bias_weight. The single process's
    attention of the hierarchical graph transformer (module doc)."""
    check_inputs(q, k, v, codes, bias_weight)
    return DenseBiasAttention.apply(q, k, v, codes, bias_weight, 1.0 / math.sqrt(q.shape[-1]),
                                    block)


def attend_reference(q: Tensor, k: Tensor, v: Tensor, codes: Codes, bias_weight: Tensor
                     ) -> Tensor:
    """The same function with torch's softmax on the whole [B, h, Sq, Sk] scores (tests and
    small sizes only: autograd keeps the probabilities)."""
    check_inputs(q, k, v, codes, bias_weight)
    B, h, sq, _ = q.shape
    full = torch.full((B, sq, k.shape[2]), GLOBAL_CODE, dtype=torch.long, device=q.device)
    if isinstance(codes, int):
        full.fill_(codes)
    else:
        full[:, :codes.shape[1], :codes.shape[2]] = codes.long()
    bias = F.embedding(full, bias_weight).permute(0, 3, 1, 2)
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + bias
    return torch.matmul(torch.softmax(s, dim=-1), v)
