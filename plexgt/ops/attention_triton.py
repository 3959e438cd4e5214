"""Fused sparse attention in Triton: SDDMM -> online softmax -> SpMM in one pass per row block.

Shapes: q [Nr, h, d'], k and v [Nc, h, d'] on a CSR pattern [Nr, Nc] -> y [Nr, h, d'] and the
per-row log-sum-exp [h, Nr] (float32, or float64 for float64 inputs). Same function as
:func:`plexgt.ops.attention.sparse_attention`, which stays the reference and the fallback.

Why a kernel of its own: the torch path materialises scores and probabilities as [h, E] arrays
(cuSPARSE SDDMM, a segment softmax, a CSR SpMM: four passes over E·h values, and the [h, E]
probabilities held until backward), and ROCm builds of torch have no GPU ``sampled_addmm`` at
all. Here a program owns ``BLOCK_R`` rows of one head, walks their edges ``BLOCK_E`` at a time,
gathers the K and V rows those edges name, and keeps FlashAttention's running (max, sum, acc)
per row in registers, so nothing of size E leaves the chip in forward and only [h, Nr]
log-sum-exps are kept for backward. Triton compiles the same source for CUDA and ROCm.

Backward recomputes scores from the saved log-sum-exp, in two kernels so no gradient needs
atomics (deterministic, as FlashAttention-2 does):

* rows (the CSR pattern): delta_r = sum_e P·dP (one pass), then dQ_r = sum_e dS K_c;
* columns (the cached transpose, CSC): dV_c = sum_e P dY_r and dK_c = sum_e dS Q_r.

Arithmetic is float32 for float32, bfloat16 and float16 inputs (float64 for float64): scores,
softmax statistics and every reduction; only loads and the final stores use the input dtype.
Index arrays are int32 when E fits (:meth:`CSRGraph.compact_index`); addresses are computed in
int64 so N·h·d' beyond 2^31 is safe.

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
    mean degree (16..64), and as many rows as fill :data:`TILE_ELEMS`."""
    block_d = triton.next_power_of_2(max(head_dim, 1))
    mean = num_edges / max(num_rows, 1)
    block_e = min(64, max(16, triton.next_power_of_2(max(1, math.ceil(mean)))))
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
        """Step j of every segment: [BLOCK_R, BLOCK_E] neighbour ids (int64) and their mask."""
        eo = start[:, None] + j + tl.arange(0, BLOCK_E)[None, :]
        emask = eo < end[:, None]
        return tl.load(indices + eo, mask=emask, other=0).to(tl.int64), emask

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
    def _row_step(indices, start, end, j, k, v, qt, gt, ls, hd, sk0, sk1, sv0, sv1, dd, dmask,
                  scale, BLOCK_E: tl.constexpr):
        """Step j of the backward's row passes: P (from the saved log-sum-exp), dP = dY·V
        ([BLOCK_R, BLOCK_E], 0 off the pattern) and the gathered K tile."""
        col, emask = _edges(indices, start, end, j, BLOCK_E)
        tmask = emask[:, :, None] & dmask[None, None, :]
        kt = _gather(k, col, hd, sk0, sk1, dd, tmask, scale.dtype)
        vt = _gather(v, col, hd, sv0, sv1, dd, tmask, scale.dtype)
        p = tl.exp(tl.sum(qt[:, None, :] * kt, axis=2) * scale - ls[:, None])
        return tl.where(emask, p, 0.0), tl.sum(gt[:, None, :] * vt, axis=2), kt

    @triton.jit
    def _fwd_kernel(indptr, indices, q, k, v, y, lse, scale_ptr, n_rows,
                    sq0, sq1, sk0, sk1, sv0, sv1, sy0, sy1,
                    D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
                    BLOCK_D: tl.constexpr, ACCUMULATE: tl.constexpr):
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
            col, emask = _edges(indices, start, end, j, BLOCK_E)
            tmask = emask[:, :, None] & dmask[None, None, :]
            kt = _gather(k, col, hd, sk0, sk1, dd, tmask, scale.dtype)
            s = tl.where(emask, tl.sum(qt[:, None, :] * kt, axis=2) * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no edge yet
            alpha = tl.exp(m - m_safe)
            p = tl.exp(s - m_safe[:, None])
            el = el * alpha + tl.sum(p, axis=1)
            vt = _gather(v, col, hd, sv0, sv1, dd, tmask, scale.dtype)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * vt, axis=1)
            m = m_new
        out = acc / tl.where(el == 0.0, 1.0, el)[:, None]  # rows without edges give zeros
        yp = y + rows[:, None] * sy0 + hd * sy1 + dd[None, :]
        if ACCUMULATE:
            out += tl.load(yp, mask=rdmask, other=0.0).to(scale.dtype)
        tl.store(yp, out.to(y.dtype.element_ty), mask=rdmask)
        tl.store(lse + hd * n_rows + rows, m + tl.log(tl.where(el == 0.0, 1.0, el)), mask=rmask)

    @triton.jit
    def _bwd_rows_kernel(indptr, indices, q, k, v, dy, lse, delta, dq, scale_ptr, n_rows,
                         sq0, sq1, sk0, sk1, sv0, sv1, sg0, sg1, sdq0, sdq1,
                         D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
                         BLOCK_D: tl.constexpr, NEED_DQ: tl.constexpr):
        # delta_r = sum_e P dP (pass 1); dQ_r = sum_e dS K_c with dS = scale P (dP - delta_r)
        hd = tl.program_id(1).to(tl.int64)
        rows, rmask, start, end = _segments(indptr, n_rows, BLOCK_R)
        dd = tl.arange(0, BLOCK_D)
        dmask = dd < D
        scale = tl.load(scale_ptr)
        rdmask = rmask[:, None] & dmask[None, :]
        qt = _rows(q, rows, hd, sq0, sq1, dd, rdmask, scale.dtype)
        gt = _rows(dy, rows, hd, sg0, sg1, dd, rdmask, scale.dtype)
        ls = tl.load(lse + hd * n_rows + rows, mask=rmask, other=0.0)
        longest = tl.max(end - start, axis=0)
        dl = tl.zeros([BLOCK_R], scale.dtype)
        for j in range(0, longest, BLOCK_E):
            p, dp, kt = _row_step(indices, start, end, j, k, v, qt, gt, ls, hd, sk0, sk1, sv0,
                                  sv1, dd, dmask, scale, BLOCK_E)
            dl += tl.sum(p * dp, axis=1)
        tl.store(delta + hd * n_rows + rows, dl, mask=rmask)
        if NEED_DQ:
            acc = tl.zeros([BLOCK_R, BLOCK_D], scale.dtype)
            for j in range(0, longest, BLOCK_E):
                p, dp, kt = _row_step(indices, start, end, j, k, v, qt, gt, ls, hd, sk0, sk1,
                                      sv0, sv1, dd, dmask, scale, BLOCK_E)
                acc += tl.sum((p * (dp - dl[:, None]) * scale)[:, :, None] * kt, axis=1)
            tl.store(dq + rows[:, None] * sdq0 + hd * sdq1 + dd[None, :],
                     acc.to(dq.dtype.element_ty), mask=rdmask)

    @triton.jit
    def _bwd_cols_kernel(tindptr, tindices, q, k, v, dy, lse, delta, dk, dv, scale_ptr,
                         n_rows, n_cols, sq0, sq1, sk0, sk1, sv0, sv1, sg0, sg1,
                         sdk0, sdk1, sdv0, sdv1,
                         D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
                         BLOCK_D: tl.constexpr, NEED_DK: tl.constexpr, NEED_DV: tl.constexpr):
        # over the transpose: a program owns BLOCK_R columns c and walks the rows r naming them;
        # dV_c = sum P dY_r, dK_c = sum dS Q_r, with P and dS recomputed from lse_r, delta_r
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
            row, emask = _edges(tindices, start, end, j, BLOCK_E)
            tmask = emask[:, :, None] & dmask[None, None, :]
            qt = _gather(q, row, hd, sq0, sq1, dd, tmask, scale.dtype)
            gt = _gather(dy, row, hd, sg0, sg1, dd, tmask, scale.dtype)
            ls = tl.load(lse + hd * n_rows + row, mask=emask, other=0.0)
            p = tl.exp(tl.sum(kc[:, None, :] * qt, axis=2) * scale - ls)
            p = tl.where(emask, p, 0.0)
            if NEED_DV:
                dv_acc += tl.sum(p[:, :, None] * gt, axis=1)
            if NEED_DK:
                dl = tl.load(delta + hd * n_rows + row, mask=emask, other=0.0)
                ds = p * (tl.sum(vc[:, None, :] * gt, axis=2) - dl) * scale
                dk_acc += tl.sum(ds[:, :, None] * qt, axis=1)
        if NEED_DK:
            tl.store(dk + cols[:, None] * sdk0 + hd * sdk1 + dd[None, :],
                     dk_acc.to(dk.dtype.element_ty), mask=cdmask)
        if NEED_DV:
            tl.store(dv + cols[:, None] * sdv0 + hd * sdv1 + dd[None, :],
                     dv_acc.to(dv.dtype.element_ty), mask=cdmask)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _unit_last(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


# The launches are torch custom operators, so the dispatcher sees one op per kernel call: device
# checks (and the test suite's device audit) apply to them like to any aten op, and torch.compile
# could trace around them. Optional outputs come back as empty tensors (an op returns tensors).
@torch.library.custom_op("plexgt::fused_attention_forward", mutates_args=("y",))
def _forward_op(indptr: Tensor, indices: Tensor, q: Tensor, k: Tensor, v: Tensor, y: Tensor,
                scale: float, accumulate: bool) -> Tensor:
    nr, h, d = q.shape
    acc_dt = _acc_dtype(q.dtype)
    lse = torch.empty(h, nr, dtype=acc_dt, device=q.device)
    if nr == 0 or h == 0:
        return lse
    br, be, bd = blocks(nr, indices.numel(), d)
    sc = torch.full((1,), scale, dtype=acc_dt, device=q.device)
    _fwd_kernel[(triton.cdiv(nr, br), h)](
        indptr, indices, q, k, v, y, lse, sc, nr,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        y.stride(0), y.stride(1),
        D=d, BLOCK_R=br, BLOCK_E=be, BLOCK_D=bd, ACCUMULATE=accumulate)
    return lse


@torch.library.custom_op("plexgt::fused_attention_backward", mutates_args=())
def _backward_op(indptr: Tensor, indices: Tensor, tindptr: Tensor, tindices: Tensor, q: Tensor,
                 k: Tensor, v: Tensor, lse: Tensor, dy: Tensor, scale: float, need_q: bool,
                 need_k: bool, need_v: bool) -> tuple[Tensor, Tensor, Tensor]:
    nr, h, d = q.shape
    nc = k.shape[0]
    acc_dt = _acc_dtype(q.dtype)
    none = q.new_empty(0)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if need_q else none
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device) if need_k else none.clone()
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device) if need_v else none.clone()
    if h == 0:
        return dq, dk, dv
    sc = torch.full((1,), scale, dtype=acc_dt, device=q.device)
    delta = torch.empty(h, nr, dtype=acc_dt, device=q.device)
    br, be, bd = blocks(nr, indices.numel(), d)
    if nr:
        dq_arg = dq if need_q else q  # never written when NEED_DQ is off
        _bwd_rows_kernel[(triton.cdiv(nr, br), h)](
            indptr, indices, q, k, v, dy, lse, delta, dq_arg, sc, nr,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dy.stride(0), dy.stride(1), dq_arg.stride(0), dq_arg.stride(1),
            D=d, BLOCK_R=br, BLOCK_E=be, BLOCK_D=bd, NEED_DQ=need_q)
    if (need_k or need_v) and nc:
        cr, ce, _ = blocks(nc, indices.numel(), d)
        dk_arg = dk if need_k else k
        dv_arg = dv if need_v else v
        _bwd_cols_kernel[(triton.cdiv(nc, cr), h)](
            tindptr, tindices, q, k, v, dy, lse, delta, dk_arg, dv_arg, sc, nr, nc,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            dy.stride(0), dy.stride(1), dk_arg.stride(0), dk_arg.stride(1),
            dv_arg.stride(0), dv_arg.stride(1),
            D=d, BLOCK_R=cr, BLOCK_E=ce, BLOCK_D=bd, NEED_DK=need_k, NEED_DV=need_v)
    return dq, dk, dv


def fused_forward(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor, scale: float,
                  out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """q [Nr, h, d'], k, v [Nc, h, d'] -> (y [Nr, h, d'], lse [h, Nr] in the accumulation
    dtype). With ``out`` [Nr, h, d'] (any strides, unit last), y is added into it in place."""
    y = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    ip, ix = graph.compact_index()
    return y, _forward_op(ip, ix, q, k, v, y, scale, out is not None)


def fused_backward(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor, lse: Tensor, dy: Tensor,
                   scale: float, need: tuple[bool, bool, bool]
                   ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(dq, dk, dv) for dy [Nr, h, d'] (each None unless asked for in ``need``)."""
    ip, ix = graph.compact_index()
    tip, tix = graph.transpose().compact_index() if (need[1] or need[2]) else (ip, ix)
    grads = _backward_op(ip, ix, tip, tix, q, k, v, lse, dy, scale, *need)
    return tuple(g if n else None for g, n in zip(grads, need))


class FusedSparseAttention(torch.autograd.Function):
    """y = softmax_rows((Q Kᵀ ⊙ A) * scale) V, forward and backward by the fused kernels;
    saves q, k, v and the [h, Nr] log-sum-exp only."""

    @staticmethod
    def forward(ctx, residual: Tensor | None, graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor,
                scale: float) -> Tensor:
        q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
        out = None if residual is None else residual.view(q.shape[0], *v.shape[1:])
        y, lse = fused_forward(graph, q, k, v, scale, out)
        ctx.graph, ctx.scale, ctx.has_residual = graph, scale, residual is not None
        ctx.save_for_backward(q, k, v, lse)
        if residual is not None:
            ctx.mark_dirty(residual)
            return residual
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        q, k, v, lse = ctx.saved_tensors
        d_res = grad if ctx.has_residual and ctx.needs_input_grad[0] else None
        dy = grad.view(q.shape[0], *v.shape[1:]) if ctx.has_residual else grad
        dq, dk, dv = fused_backward(ctx.graph, q, k, v, lse, _unit_last(dy), ctx.scale,
                                    tuple(ctx.needs_input_grad[2:5]))
        return d_res, None, dq, dk, dv, None


def fused_attention(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor, scale: float,
                    residual: Tensor | None = None) -> Tensor:
    """The fused kernel behind :func:`plexgt.ops.attention.sparse_attention` (which checks
    shapes and picks it); callable directly by benchmarks and tests."""
    if not supports(q):
        raise RuntimeError(f"the fused Triton attention cannot serve a {q.dtype} tensor on "
                           f"{q.device} (triton {'missing' if triton is None else 'present'}, "
                           f"interpreter {'on' if interpreted() else 'off'})")
    return FusedSparseAttention.apply(residual, graph, q, k, v, float(scale))
