"""Fused sparse attention in Triton: SDDMM -> online softmax -> SpMM in one pass per row block.

Shapes: q [Nr, h, d'], k and v [Nc, h, d'] on a CSR pattern [Nr, Nc], optionally an edge bias
[h, E] (any strides, CSR edge order) -> y [Nr, h, d'] and the per-row log-sum-exp [h, Nr]
(float32, or float64 for float64 inputs). Same function as
:func:`plexgt.ops.attention.sparse_attention`, which stays the reference and the fallback.

Why a kernel of its own: the torch path materialises scores and probabilities as [h, E] arrays
(cuSPARSE SDDMM, a segment softmax, a CSR SpMM: four passes over E·h values, and the [h, E]
probabilities held until backward), and ROCm builds of torch have no GPU ``sampled_addmm`` at
all. Here a program owns ``BLOCK_R`` rows of one head, walks their edges ``BLOCK_E`` at a time,
gathers the K and V rows those edges name (and the bias of those edges), and keeps
FlashAttention's running (max, sum, acc) per row in registers, so nothing of size E leaves the
chip in forward and only y (in the accumulation dtype) and the [h, Nr] log-sum-exps are kept
for backward. Triton compiles the same source for CUDA and ROCm.

Backward recomputes scores from the saved log-sum-exp, in two kernels so no gradient needs
atomics (deterministic, as FlashAttention-2 does), with delta_r = rowsum(dY ∘ Y)
(:func:`row_delta`, FlashAttention-2's identity for sum_e P·dP: no edge walk of its own):

* rows (the CSR pattern), one walk: dS = P (dP - delta_r), dQ_r = sum_e scale·dS K_c, and the
  bias's gradient dS itself, stored at each edge's own position (no reduction, no atomics);
* columns (the cached transpose, CSC): dV_c = sum_e P dY_r and dK_c = sum_e scale·dS Q_r.

Lse and delta are inputs of the backward, not recomputed from the block's own edges: a ring's
column block (:func:`block_attention` forward, :func:`fused_backward` with the whole row's lse
and delta) gets exactly its share of the gradient.

Arithmetic is float32 for float32, bfloat16 and float16 inputs (float64 for float64): scores,
softmax statistics and every reduction; only loads and the final stores use the input dtype.
Index arrays are int32 when E fits, on every device (:meth:`CSRGraph.compact_index`); addresses
are computed in int64 so N·h·d' (and h·E of the bias) beyond 2^31 is safe.

On a machine without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``
set before this module is imported), which is how the test suite checks them against the
reference.
"""

from __future__ import annotations

import math
import os

import torch
from torch.autograd.function import once_differentiable

from plexgt.ops.csr import CSRGraph

try:  # Triton ships with the CUDA and ROCm wheels of torch; a CPU-only install may lack it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on installs without triton
    triton = None
    tl = None

Tensor = torch.Tensor

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""Input dtypes the kernels take."""
GPU_TYPES = ("cuda",)
"""Device types the compiled kernels serve (ROCm devices are ``cuda`` to torch)."""
MAX_HEAD_DIM = 256
"""Widest d' a program holds in registers."""
TILE_ELEMS = 4096
"""Elements of one gathered [BLOCK_R, BLOCK_E, d'] tile: sized for registers, not tuned on a
GPU yet (the blocks are chosen by :func:`blocks`)."""


def interpreted() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``). Older
    Triton releases (the 3.0 that torch 2.4 ships with) have no ``triton.knobs`` and read the
    variable itself."""
    if triton is None:
        return False
    knobs = getattr(triton, "knobs", None)
    if knobs is None:
        return os.environ.get("TRITON_INTERPRET", "0") == "1"
    return bool(knobs.runtime.interpret)


def supports(q: Tensor) -> bool:
    """Whether the fused kernel can serve ``q`` [N, h, d']: Triton present, a GPU tensor (CUDA
    or ROCm; CPU only under the interpreter), a supported dtype and width."""
    if triton is None or q.dtype not in DTYPES or q.shape[-1] > MAX_HEAD_DIM:
        return False
    return q.device.type in GPU_TYPES or (q.device.type == "cpu" and interpreted())


def blocks(num_rows: int, num_edges: int, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_E, BLOCK_D): d' rounded up to a power of two, edges per step about the
    mean degree (16..64) but no more than one row's tile of :data:`TILE_ELEMS` holds, and as
    many rows as fill it. The tile BLOCK_R·BLOCK_E·BLOCK_D never passes the cap (it did at
    d' = 256 with a mean degree over 16: one row of 64 edges, four times the cap, spilled)."""
    block_d = triton.next_power_of_2(max(head_dim, 1))
    mean = num_edges / max(num_rows, 1)
    block_e = min(64, max(16, triton.next_power_of_2(max(1, math.ceil(mean)))))
    block_e = min(block_e, max(1, TILE_ELEMS // block_d))
    block_r = max(1, min(64, TILE_ELEMS // (block_e * block_d)))
    return block_r, block_e, block_d


if triton is not None:

    @triton.jit
    def _segments(indptr, n, BLOCK_R: tl.constexpr):
        """This program's BLOCK_R segments (CSR rows, or CSC columns): ids, mask, edge range."""
        idx = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        mask = idx < n
        start = tl.load(indptr + idx, mask=mask, other=0)
        end = tl.load(indptr + idx + 1, mask=mask, other=0)
        return idx.to(tl.int64), mask, start, end

    @triton.jit
    def _edges(indices, start, end, j, BLOCK_E: tl.constexpr):
        """Step j of every segment: [BLOCK_R, BLOCK_E] edge positions, neighbour ids (int64)
        and their mask."""
        eo = start[:, None] + j + tl.arange(0, BLOCK_E)[None, :]
        emask = eo < end[:, None]
        return eo, tl.load(indices + eo, mask=emask, other=0).to(tl.int64), emask

    @triton.jit
    def _rows(x, idx, hd, s0, s1, dd, mask, dtype: tl.constexpr):
        """[BLOCK_R, BLOCK_D] rows ``idx`` of head ``hd`` of a [N, h, d'] tensor."""
        return tl.load(x + idx[:, None] * s0 + hd * s1 + dd[None, :], mask=mask,
                       other=0.0).to(dtype)

    @triton.jit
    def _gather(x, nbr, hd, s0, s1, dd, mask, dtype: tl.constexpr):
        """[BLOCK_R, BLOCK_E, BLOCK_D]: the rows ``nbr`` of head ``hd`` (the edges' ends)."""
        return tl.load(x + nbr[:, :, None] * s0 + hd * s1 + dd[None, None, :], mask=mask,
                       other=0.0).to(dtype)

    @triton.jit
    def _bias(bias, hd, sb0, sb1, edge, emask, dtype: tl.constexpr):
        """[BLOCK_R, BLOCK_E] bias of head ``hd`` at the CSR edge positions ``edge`` of an
        [h, E] tensor of any strides (the [E, h] output of the edge encoder, transposed)."""
        return tl.load(bias + hd * sb0 + edge.to(tl.int64) * sb1, mask=emask,
                       other=0.0).to(dtype)

    @triton.jit
    def _fwd_kernel(indptr, indices, q, k, v, bias, y, res, lse, scale_ptr, n_rows,
                    sq0, sq1, sk0, sk1, sv0, sv1, sy0, sy1, sr0, sr1, sb0, sb1,
                    D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
                    BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr):
        # one program: BLOCK_R rows of head `hd`; running max m, sum l, accumulator acc per row
        hd = tl.program_id(1).to(tl.int64)  # head offsets in int64: h·Nr may pass 2^31
        rows, rmask, start, end = _segments(indptr, n_rows, BLOCK_R)
        dd = tl.arange(0, BLOCK_D)
        dmask = dd < D
        scale = tl.load(scale_ptr)
        rdmask = rmask[:, None] & dmask[None, :]
        qt = _rows(q, rows, hd, sq0, sq1, dd, rdmask, scale.dtype)
        m = tl.full([BLOCK_R], float("-inf"), scale.dtype)
        el = tl.zeros([BLOCK_R], scale.dtype)
        acc = tl.zeros([BLOCK_R, BLOCK_D], scale.dtype)
        for j in range(0, tl.max(end - start, axis=0), BLOCK_E):
            eo, col, emask = _edges(indices, start, end, j, BLOCK_E)
            tmask = emask[:, :, None] & dmask[None, None, :]
            kt = _gather(k, col, hd, sk0, sk1, dd, tmask, scale.dtype)
            s = tl.sum(qt[:, None, :] * kt, axis=2) * scale
            if HAS_BIAS:
                s += _bias(bias, hd, sb0, sb1, eo, emask, scale.dtype)
            s = tl.where(emask, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no edge yet
            alpha = tl.exp(m - m_safe)
            p = tl.exp(s - m_safe[:, None])
            el = el * alpha + tl.sum(p, axis=1)
            vt = _gather(v, col, hd, sv0, sv1, dd, tmask, scale.dtype)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * vt, axis=1)
            m = m_new
        out = acc / tl.where(el == 0.0, 1.0, el)[:, None]  # rows without edges give zeros
        tl.store(y + rows[:, None] * sy0 + hd * sy1 + dd[None, :], out.to(y.dtype.element_ty),
                 mask=rdmask)
        if ACCUMULATE:  # the residual gains y in place; y itself is kept for the backward
            rp = res + rows[:, None] * sr0 + hd * sr1 + dd[None, :]
            out += tl.load(rp, mask=rdmask, other=0.0).to(scale.dtype)
            tl.store(rp, out.to(res.dtype.element_ty), mask=rdmask)
        tl.store(lse + hd * n_rows + rows, m + tl.log(tl.where(el == 0.0, 1.0, el)), mask=rmask)

    @triton.jit
    def _bwd_rows_kernel(indptr, indices, q, k, v, bias, dy, lse, delta, dq, dbias, scale_ptr,
                         n_rows, sq0, sq1, sk0, sk1, sv0, sv1, sg0, sg1, sdq0, sdq1, sb0, sb1,
                         sdb0, sdb1,
                         D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
                         BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, NEED_DQ: tl.constexpr,
                         NEED_DB: tl.constexpr):
        # one walk over the row's edges: dS = P (dP - delta_r) with delta_r = rowsum(dY∘Y)
        # given; dBias_e = dS (the logits' gradient), dQ_r = sum_e scale dS K_c
        hd = tl.program_id(1).to(tl.int64)
        rows, rmask, start, end = _segments(indptr, n_rows, BLOCK_R)
        dd = tl.arange(0, BLOCK_D)
        dmask = dd < D
        scale = tl.load(scale_ptr)
        rdmask = rmask[:, None] & dmask[None, :]
        qt = _rows(q, rows, hd, sq0, sq1, dd, rdmask, scale.dtype)
        gt = _rows(dy, rows, hd, sg0, sg1, dd, rdmask, scale.dtype)
        ls = tl.load(lse + hd * n_rows + rows, mask=rmask, other=0.0)
        dl = tl.load(delta + hd * n_rows + rows, mask=rmask, other=0.0)
        acc = tl.zeros([BLOCK_R, BLOCK_D], scale.dtype)
        for j in range(0, tl.max(end - start, axis=0), BLOCK_E):
            eo, col, emask = _edges(indices, start, end, j, BLOCK_E)
            tmask = emask[:, :, None] & dmask[None, None, :]
            kt = _gather(k, col, hd, sk0, sk1, dd, tmask, scale.dtype)
            vt = _gather(v, col, hd, sv0, sv1, dd, tmask, scale.dtype)
            s = tl.sum(qt[:, None, :] * kt, axis=2) * scale
            if HAS_BIAS:
                s += _bias(bias, hd, sb0, sb1, eo, emask, scale.dtype)
            p = tl.where(emask, tl.exp(s - ls[:, None]), 0.0)
            ds = p * (tl.sum(gt[:, None, :] * vt, axis=2) - dl[:, None])
            if NEED_DB:
                tl.store(dbias + hd * sdb0 + eo.to(tl.int64) * sdb1,
                         ds.to(dbias.dtype.element_ty), mask=emask)
            if NEED_DQ:
                acc += tl.sum((ds * scale)[:, :, None] * kt, axis=1)
        if NEED_DQ:
            tl.store(dq + rows[:, None] * sdq0 + hd * sdq1 + dd[None, :],
                     acc.to(dq.dtype.element_ty), mask=rdmask)

    @triton.jit
    def _bwd_cols_kernel(tindptr, tindices, tperm, q, k, v, bias, dy, lse, delta, dk, dv,
                         scale_ptr, n_rows, n_cols, sq0, sq1, sk0, sk1, sv0, sv1, sg0, sg1,
                         sdk0, sdk1, sdv0, sdv1, sb0, sb1,
                         D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
                         BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, NEED_DK: tl.constexpr,
                         NEED_DV: tl.constexpr, ACCUMULATE: tl.constexpr):
        # over the transpose: a program owns BLOCK_R columns c and walks the rows r naming them;
        # dV_c = sum P dY_r, dK_c = sum scale dS Q_r, with P and dS recomputed from lse_r,
        # delta_r (and the bias, read at the CSR position tperm gives each transposed edge)
        hd = tl.program_id(1).to(tl.int64)
        cols, cmask, start, end = _segments(tindptr, n_cols, BLOCK_R)
        dd = tl.arange(0, BLOCK_D)
        dmask = dd < D
        scale = tl.load(scale_ptr)
        cdmask = cmask[:, None] & dmask[None, :]
        kc = _rows(k, cols, hd, sk0, sk1, dd, cdmask, scale.dtype)
        vc = _rows(v, cols, hd, sv0, sv1, dd, cdmask, scale.dtype)
        dk_acc = tl.zeros([BLOCK_R, BLOCK_D], scale.dtype)
        dv_acc = tl.zeros([BLOCK_R, BLOCK_D], scale.dtype)
        for j in range(0, tl.max(end - start, axis=0), BLOCK_E):
            eo, row, emask = _edges(tindices, start, end, j, BLOCK_E)
            tmask = emask[:, :, None] & dmask[None, None, :]
            qt = _gather(q, row, hd, sq0, sq1, dd, tmask, scale.dtype)
            gt = _gather(dy, row, hd, sg0, sg1, dd, tmask, scale.dtype)
            ls = tl.load(lse + hd * n_rows + row, mask=emask, other=0.0)
            s = tl.sum(kc[:, None, :] * qt, axis=2) * scale
            if HAS_BIAS:
                edge = tl.load(tperm + eo, mask=emask, other=0)
                s += _bias(bias, hd, sb0, sb1, edge, emask, scale.dtype)
            p = tl.where(emask, tl.exp(s - ls), 0.0)
            if NEED_DV:
                dv_acc += tl.sum(p[:, :, None] * gt, axis=1)
            if NEED_DK:
                dl = tl.load(delta + hd * n_rows + row, mask=emask, other=0.0)
                ds = p * (tl.sum(vc[:, None, :] * gt, axis=2) - dl) * scale
                dk_acc += tl.sum(ds[:, :, None] * qt, axis=1)
        if NEED_DK:
            dkp = dk + cols[:, None] * sdk0 + hd * sdk1 + dd[None, :]
            if ACCUMULATE:
                dk_acc += tl.load(dkp, mask=cdmask, other=0.0).to(scale.dtype)
            tl.store(dkp, dk_acc.to(dk.dtype.element_ty), mask=cdmask)
        if NEED_DV:
            dvp = dv + cols[:, None] * sdv0 + hd * sdv1 + dd[None, :]
            if ACCUMULATE:
                dv_acc += tl.load(dvp, mask=cdmask, other=0.0).to(scale.dtype)
            tl.store(dvp, dv_acc.to(dv.dtype.element_ty), mask=cdmask)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _unit_last(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _strides(x: Tensor | None) -> tuple[int, int]:
    """The first two strides of x (0, 0 for an argument the kernel does not read)."""
    return (0, 0) if x is None or x.dim() < 2 else (x.stride(0), x.stride(1))


def row_delta(y: Tensor, dy: Tensor) -> Tensor:
    """[h, Nr] rowsum(dY ∘ Y) per head in the accumulation dtype: FlashAttention-2's
    delta_r = sum_e P dP, from the output instead of a second walk over the row's edges."""
    acc = _acc_dtype(y.dtype)
    return torch.einsum("nhd,nhd->hn", dy.to(acc), y.to(acc)).contiguous()


# The launches are torch custom operators, so the dispatcher sees one op per kernel call: device
# checks (and the test suite's device audit) apply to them like to any aten op, and torch.compile
# could trace around them. Optional outputs come back as empty tensors (an op returns tensors).
@torch.library.custom_op("plexgt::fused_attention_forward", mutates_args=("y", "res"))
def _forward_op(indptr: Tensor, indices: Tensor, q: Tensor, k: Tensor, v: Tensor,
                bias: Tensor | None, y: Tensor, res: Tensor | None, scale: float) -> Tensor:
    nr, h, d = q.shape
    acc_dt = _acc_dtype(q.dtype)
    lse = torch.empty(h, nr, dtype=acc_dt, device=q.device)
    if nr == 0 or h == 0:
        return lse
    br, be, bd = blocks(nr, indices.numel(), d)
    sc = torch.full((1,), scale, dtype=acc_dt, device=q.device)
    _fwd_kernel[(triton.cdiv(nr, br), h)](
        indptr, indices, q, k, v, q if bias is None else bias, y, y if res is None else res,
        lse, sc, nr, *_strides(q), *_strides(k), *_strides(v), *_strides(y), *_strides(res),
        *_strides(bias),
        D=d, BLOCK_R=br, BLOCK_E=be, BLOCK_D=bd, HAS_BIAS=bias is not None,
        ACCUMULATE=res is not None)
    return lse


@torch.library.custom_op("plexgt::fused_attention_backward_rows", mutates_args=())
def _backward_rows_op(indptr: Tensor, indices: Tensor, q: Tensor, k: Tensor, v: Tensor,
                      bias: Tensor | None, dy: Tensor, lse: Tensor, delta: Tensor, scale: float,
                      need_q: bool, need_bias: bool) -> tuple[Tensor, Tensor]:
    nr, h, d = q.shape
    none = q.new_empty(0)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if need_q else none
    db = torch.empty_like(bias) if need_bias and bias is not None else none.clone()
    if nr == 0 or h == 0 or not (need_q or db.numel()):
        return dq, db
    sc = torch.full((1,), scale, dtype=_acc_dtype(q.dtype), device=q.device)
    br, be, bd = blocks(nr, indices.numel(), d)
    dq_arg = dq if need_q else q  # never written when NEED_DQ is off
    db_arg = db if db.numel() else q
    _bwd_rows_kernel[(triton.cdiv(nr, br), h)](
        indptr, indices, q, k, v, q if bias is None else bias, dy, lse, delta, dq_arg, db_arg,
        sc, nr, *_strides(q), *_strides(k), *_strides(v), *_strides(dy), *_strides(dq_arg),
        *_strides(bias), *_strides(db if db.numel() else None),
        D=d, BLOCK_R=br, BLOCK_E=be, BLOCK_D=bd, HAS_BIAS=bias is not None, NEED_DQ=need_q,
        NEED_DB=bool(db.numel()))
    return dq, db


@torch.library.custom_op("plexgt::fused_attention_backward_cols", mutates_args=("dk", "dv"))
def _backward_cols_op(tindptr: Tensor, tindices: Tensor, tperm: Tensor, q: Tensor, k: Tensor,
                      v: Tensor, bias: Tensor | None, dy: Tensor, lse: Tensor, delta: Tensor,
                      dk: Tensor, dv: Tensor, scale: float, accumulate: bool) -> None:
    nr, h, d = q.shape
    nc = k.shape[0]
    need_k, need_v = dk.numel() > 0, dv.numel() > 0
    if nc == 0 or h == 0 or not (need_k or need_v):
        return
    sc = torch.full((1,), scale, dtype=_acc_dtype(q.dtype), device=q.device)
    cr, ce, bd = blocks(nc, tindices.numel(), d)
    dk_arg = dk if need_k else k  # never written when NEED_DK is off
    dv_arg = dv if need_v else v
    _bwd_cols_kernel[(triton.cdiv(nc, cr), h)](
        tindptr, tindices, tperm, q, k, v, q if bias is None else bias, dy, lse, delta,
        dk_arg, dv_arg, sc, nr, nc, *_strides(q), *_strides(k), *_strides(v), *_strides(dy),
        *_strides(dk_arg), *_strides(dv_arg), *_strides(bias),
        D=d, BLOCK_R=cr, BLOCK_E=ce, BLOCK_D=bd, HAS_BIAS=bias is not None, NEED_DK=need_k,
        NEED_DV=need_v, ACCUMULATE=accumulate)


def fused_forward(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor, scale: float,
                  out: Tensor | None = None, bias: Tensor | None = None
                  ) -> tuple[Tensor, Tensor]:
    """q [Nr, h, d'], k, v [Nc, h, d'] (any strides, unit last) -> (y [Nr, h, d'], lse [h, Nr]),
    both in the accumulation dtype (float32 for half inputs), no autograd. ``bias`` [h, E]
    (any strides): added to each edge's scaled score. With ``out`` [Nr, h, d'], y is also
    added into it in place (the returned y stays y alone: the backward's delta needs it, and
    in float32: delta = rowsum(dY ∘ Y) from a bfloat16 y put 3-4 % errors into dq and dk of
    a hub row, against 0.5 % from a float32 one)."""
    y = torch.empty(q.shape, dtype=_acc_dtype(q.dtype), device=q.device)
    ip, ix = graph.compact_index()
    return y, _forward_op(ip, ix, q, k, v, bias, y, out, scale)


def fused_backward(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor, lse: Tensor,
                   delta: Tensor, dy: Tensor, scale: float, need: tuple[bool, bool, bool],
                   bias: Tensor | None = None, need_bias: bool = False,
                   dkv: tuple[Tensor, Tensor] | None = None
                   ) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """(dq, dk, dv, dbias) for dy [Nr, h, d'] (each None unless asked for in ``need`` /
    ``need_bias``), P rebuilt from ``lse`` [h, Nr] and dS = P (dP - delta) from ``delta``
    [h, Nr] (:func:`row_delta`): whole-row statistics, so a column block of a row (a ring's)
    gets its share of the whole row's gradient. dbias is the logits' gradient [h, E] (in
    bias's layout). With ``dkv`` (two [Nc, h, d'] tensors, unit last), dK and dV are added
    into them instead (returned as None)."""
    ip, ix = graph.compact_index()
    dq = db = None
    if need[0] or (need_bias and bias is not None):
        dq, db = _backward_rows_op(ip, ix, q, k, v, bias, dy, lse, delta, scale, need[0],
                                   need_bias and bias is not None)
    dk = dv = None
    if need[1] or need[2]:
        none = q.new_empty(0)
        if dkv is None:
            dk = torch.empty(k.shape, dtype=k.dtype, device=k.device) if need[1] else None
            dv = torch.empty(v.shape, dtype=v.dtype, device=v.device) if need[2] else None
            outs = (none if dk is None else dk, none.clone() if dv is None else dv)
        else:
            outs = (dkv[0] if need[1] else none, dkv[1] if need[2] else none.clone())
        tip, tix = graph.transpose().compact_index()
        _backward_cols_op(tip, tix, graph.compact_transpose_perm(), q, k, v, bias, dy, lse,
                          delta, *outs, scale, dkv is not None)
    return (dq if need[0] else None, dk, dv, db if need_bias and bias is not None else None)


class FusedSparseAttention(torch.autograd.Function):
    """y = softmax_rows((Q Kᵀ ⊙ A) * scale + bias) V, forward and backward by the fused
    kernels; saves q, k, v, y (in the accumulation dtype), the bias and the [h, Nr]
    log-sum-exp (nothing of size E beyond the bias itself)."""

    @staticmethod
    def forward(ctx, residual: Tensor | None, graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor,
                scale: float, bias: Tensor | None = None) -> Tensor:
        q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
        out = None if residual is None else residual.view(q.shape[0], *v.shape[1:])
        y, lse = fused_forward(graph, q, k, v, scale, out, bias)
        ctx.graph, ctx.scale, ctx.has_residual = graph, scale, residual is not None
        ctx.save_for_backward(q, k, v, y, lse, bias)
        if residual is not None:
            ctx.mark_dirty(residual)
            return residual
        return y.to(q.dtype)  # y itself when the dtypes agree

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        q, k, v, y, lse, bias = ctx.saved_tensors
        d_res = grad if ctx.has_residual and ctx.needs_input_grad[0] else None
        dy = _unit_last(grad.view(q.shape[0], *v.shape[1:]) if ctx.has_residual else grad)
        dq, dk, dv, db = fused_backward(ctx.graph, q, k, v, lse, row_delta(y, dy), dy, ctx.scale,
                                        tuple(ctx.needs_input_grad[2:5]), bias,
                                        bias is not None and ctx.needs_input_grad[6])
        return d_res, None, dq, dk, dv, None, db


def fused_attention(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor, scale: float,
                    residual: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """The fused kernel behind :func:`plexgt.ops.attention.sparse_attention` (which checks
    shapes and picks it); callable directly by benchmarks and tests."""
    if not supports(q):
        raise RuntimeError(f"the fused Triton attention cannot serve a {q.dtype} tensor on "
                           f"{q.device} (triton {'missing' if triton is None else 'present'}, "
                           f"interpreter {'on' if interpreted() else 'off'})")
    return FusedSparseAttention.apply(residual, graph, q, k, v, float(scale), bias)


def block_attention(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor, scale: float,
                    bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One column block of a ring (no autograd): q [R, h, d'] the block's rows, k, v
    [m, h, d'] its keys (any strides, unit last: head-major views serve), ``bias`` [h, E_b]
    -> (y [R, h, d'] normalised within the block, lse [h, R]), which the caller merges
    across blocks exactly by the log-sum-exp rule."""
    return fused_forward(graph, _unit_last(q), _unit_last(k), _unit_last(v), scale, None, bias)


def gpu_default(q: Tensor) -> bool:
    """Whether 'auto' takes the fused kernel for ``q``: a GPU tensor (:data:`GPU_TYPES`) the
    kernel serves (:func:`supports`). The one device check every attention path asks."""
    return q.device.type in GPU_TYPES and supports(q)
