"""Counter-based dropout on GPUs in one Triton pass: the bits of :mod:`plexgt.ops.rng`.

Shapes: x [n, m] (any strides) with the row keys [n] and column keys [m] that
:class:`~plexgt.ops.rng.CounterRNG` derives (int64 holding 32-bit values; [n] + [m] work, done
in torch) -> x · (1/(1-p) where lowbias32(row_key ^ col_key) >= cut, else 0) [n, m]; or the
multipliers alone. For a sparse matrix's stored entries: values [E] at (row_index, cols) ->
the same decisions :meth:`CounterRNG.keep_pairs` makes.

Why: the tensor form of the hash is ~20 int64 passes over [n, m] per dropout site (every
multiplication split into 16-bit halves so int64 never overflows), and ``x * multipliers``
keeps the [n, m] multipliers for backward. Here one program hashes a [BLOCK_N, BLOCK_M] tile in
uint32 lanes (multiplication mod 2³² is what the hash means), so a site reads x once and writes
the output once, and the backward recomputes the same bits from the keys (nothing of size
[n, m] kept). The products equal torch's ``x * multipliers`` bit for bit: the multiplier is the
scale rounded to x's dtype, and the product is taken in float32 (float64 for float64) and
rounded once, as torch's elementwise kernels do for half dtypes.
"""

from __future__ import annotations

import torch

from plexgt.ops import attention_triton
from plexgt.ops.attention_kernels import tl, triton

Tensor = torch.Tensor

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
"""Dtypes the kernels take."""
BLOCK_N, BLOCK_M = 16, 256
"""The [n, m] tile of one program (4096 elements)."""
BLOCK_E = 4096
"""Stored entries per program of the sparse form."""


def serves(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether dropout on ``device`` in ``dtype`` takes the Triton kernel: Triton present, a
    device the fused kernels serve (:data:`attention_triton.GPU_TYPES`, the one device check
    every GPU path asks) and a dtype the kernel takes. CPU tensors keep the compiled C++ pass
    (a CPU declared a GPU type runs the kernel under Triton's interpreter, as the tests do)."""
    return (triton is not None and dtype in DTYPES
            and device.type in attention_triton.GPU_TYPES
            and (device.type != "cpu" or attention_triton.interpreted()))


if triton is not None:

    @triton.jit
    def _mix32(x):
        """lowbias32 of uint32 lanes (products wrap mod 2³², which is the hash's definition)."""
        x ^= x >> 16
        x = x * tl.full(x.shape, 0x7FEB352D, tl.uint32)
        x ^= x >> 15
        x = x * tl.full(x.shape, 0x846CA68B, tl.uint32)
        return x ^ (x >> 16)

    @triton.jit
    def _cast_out(val, out, BF16: tl.constexpr):
        """val in the out pointer's dtype, rounded to nearest even. bfloat16 by hand on the bits
        (what CUDA's __float2bfloat16_rn and torch do): Triton's interpreter truncates a
        float32 -> bfloat16 cast, which would not give torch's bits under the tests."""
        if BF16:
            bits = val.to(tl.uint32, bitcast=True)
            r = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            r = tl.where(val != val, 0x7FC0, r)  # NaN: torch's canonical quiet NaN
            return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return val.to(out.dtype.element_ty)

    @triton.jit
    def _dropout_kernel(x, out, rkeys, ckeys, scale_ptr, cut, n, m, sx0, sx1, so0, so1,
                        HAS_X: tl.constexpr, ACC: tl.constexpr, BF16: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
        # one program: a [BLOCK_N, BLOCK_M] tile; keep = mix32(row_key ^ col_key) >= cut
        ri = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        cj = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask, cmask = ri < n, cj < m
        rk = tl.load(rkeys + ri, mask=rmask, other=0).to(tl.uint32)
        ck = tl.load(ckeys + cj, mask=cmask, other=0).to(tl.uint32)
        h = _mix32(rk[:, None] ^ ck[None, :])
        keep = h.to(tl.int64) >= cut
        s = tl.load(scale_ptr)  # the scale rounded to the output dtype, as torch's multiplier
        mask = rmask[:, None] & cmask[None, :]
        val = tl.where(keep, s.to(ACC), 0.0).to(ACC)  # the multipliers (exact in ACC)
        if HAS_X:
            xv = tl.load(x + ri[:, None] * sx0 + cj[None, :] * sx1, mask=mask, other=0.0)
            val = xv.to(ACC) * val
        tl.store(out + ri[:, None] * so0 + cj[None, :] * so1, _cast_out(val, out, BF16),
                 mask=mask)

    @triton.jit
    def _pairs_kernel(values, out, rkeys, row_index, cols, scale_ptr, ckey, cut, num,
                      ACC: tl.constexpr, BF16: tl.constexpr, BLOCK: tl.constexpr):
        # stored entries e: keep = mix32(row_key[row_index[e]] ^ mix32(cols[e] ^ ckey)) >= cut
        e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        emask = e < num
        r = tl.load(row_index + e, mask=emask, other=0).to(tl.int64)
        rk = tl.load(rkeys + r, mask=emask, other=0).to(tl.uint32)
        c = tl.load(cols + e, mask=emask, other=0).to(tl.uint32)
        hc = _mix32(c ^ ckey.to(tl.uint32))
        keep = _mix32(rk ^ hc).to(tl.int64) >= cut
        s = tl.load(scale_ptr)
        xv = tl.load(values + e, mask=emask, other=0.0).to(ACC)
        tl.store(out + e, _cast_out(xv * tl.where(keep, s.to(ACC), 0.0).to(ACC), out, BF16),
                 mask=emask)


def _scale(p: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.full((1,), 1.0 / (1.0 - p), dtype=dtype, device=device)


def _acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


@torch.library.custom_op("plexgt::counter_dropout", mutates_args=())
def _dropout_op(x: Tensor, row_keys: Tensor, col_keys: Tensor, cut: int, p: float,
                apply: bool) -> Tensor:
    n, m = row_keys.shape[0], col_keys.shape[0]
    out = torch.empty(n, m, dtype=x.dtype, device=x.device)
    if n == 0 or m == 0:
        return out
    sx = (x.stride(0), x.stride(1)) if apply else (0, 0)
    _dropout_kernel[(triton.cdiv(n, BLOCK_N), triton.cdiv(m, BLOCK_M))](
        x, out, row_keys, col_keys, _scale(p, x.dtype, x.device), cut, n, m, *sx,
        out.stride(0), out.stride(1), HAS_X=apply, ACC=_acc(x.dtype),
        BF16=x.dtype == torch.bfloat16,        BLOCK_N=BLOCK_N, BLOCK_M=BLOCK_M)
    return out


@_dropout_op.register_fake
def _(x, row_keys, col_keys, cut, p, apply):
    return x.new_empty(row_keys.shape[0], col_keys.shape[0])


@torch.library.custom_op("plexgt::counter_dropout_pairs", mutates_args=())
def _pairs_op(values: Tensor, row_keys: Tensor, row_index: Tensor, cols: Tensor, ckey: int,
              cut: int, p: float) -> Tensor:
    out = torch.empty_like(values)
    num = values.shape[0]
    if num:
        _pairs_kernel[(triton.cdiv(num, BLOCK_E),)](
            values, out, row_keys, row_index, cols, _scale(p, values.dtype, values.device),
            ckey, cut, num, ACC=_acc(values.dtype),
            BF16=values.dtype == torch.bfloat16, BLOCK=BLOCK_E)
    return out


class _Dropout(torch.autograd.Function):
    """x · multipliers with the multipliers recomputed in backward (dx = dy · multipliers,
    the same bits as autograd of ``x * multipliers``)."""

    @staticmethod
    def forward(ctx, x: Tensor, row_keys: Tensor, col_keys: Tensor, cut: int, p: float
                ) -> Tensor:
        ctx.save_for_backward(row_keys, col_keys)
        ctx.cut, ctx.p = cut, p
        return _dropout_op(x, row_keys, col_keys, cut, p, True)

    @staticmethod
    def backward(ctx, grad: Tensor):
        row_keys, col_keys = ctx.saved_tensors
        dx = _dropout_op(grad, row_keys, col_keys, ctx.cut, ctx.p, True) \
            if ctx.needs_input_grad[0] else None
        return dx, None, None, None, None


class _PairsDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: Tensor, row_keys: Tensor, row_index: Tensor, cols: Tensor,
                ckey: int, cut: int, p: float) -> Tensor:
        ctx.save_for_backward(row_keys, row_index, cols)
        ctx.args = (ckey, cut, p)
        return _pairs_op(values, row_keys, row_index, cols, ckey, cut, p)

    @staticmethod
    def backward(ctx, grad: Tensor):
        rk, ri, cols = ctx.saved_tensors
        dv = _pairs_op(grad.contiguous(), rk, ri, cols, *ctx.args) \
            if ctx.needs_input_grad[0] else None
        return dv, None, None, None, None, None, None


def dropout(x: Tensor, row_keys: Tensor, col_keys: Tensor, cut: int, p: float) -> Tensor:
    """Inverted dropout of x [n, m] (any strides) with the rows' and columns' mixed keys
    (contiguous int64 [n], [m]) and the 32-bit ``cut`` (0 <= cut <= 2³², p < 1), differentiable."""
    return _Dropout.apply(x, row_keys, col_keys, cut, p)


def multipliers(row_keys: Tensor, col_keys: Tensor, cut: int, p: float, dtype: torch.dtype
                ) -> Tensor:
    """[n, m] of 1/(1-p) (rounded to ``dtype``) where the entry is kept, else 0."""
    like = torch.empty(0, 0, dtype=dtype, device=row_keys.device)
    return _dropout_op(like, row_keys, col_keys, cut, p, False)


def dropout_pairs(values: Tensor, row_keys: Tensor, row_index: Tensor, cols: Tensor,
                  col_key: int, cut: int, p: float) -> Tensor:
    """Inverted dropout of a sparse matrix's stored ``values`` [E] (contiguous) at
    (row_index, cols) [E] (any integer dtype; columns < 2³²), with the rows' mixed keys [n] and
    the site's column key, differentiable."""
    return _PairsDropout.apply(values.contiguous(), row_keys, row_index.contiguous(),
                               cols.contiguous(), col_key, cut, p)
