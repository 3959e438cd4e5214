"""Sparse multi-head attention over a :class:`CSRGraph`: SDDMM -> row softmax -> SpMM.

Shapes: q [Nr, h, d'], k and v [Nc, h, d'], graph [Nr, Nc] (rows = destinations) ->
y [Nr, h, d'], with ``y[r] = sum_{c in N(r)} softmax_c(q[r]·k[c] * scale) v[c]``.

Why it is written this way:

* Nothing of size [E, h, d'] is ever created (the gather/scatter formulation of PyG's
  TransformerConv does create three of them, plus their gradients). Only [h, E] scores /
  probabilities exist; the SDDMM and SpMM are torch's sparse-CSR kernels (MKL / cuSPARSE).
* Each head is one sampled_addmm and one CSR x dense product, and layouts are chosen per
  operand from measurements (1M edges, 8 heads, 2 cores): the SDDMM reads the strided
  per-head views x[:, i] of [N, h, d'] tensors as fast as contiguous ones; the SpMM's dense
  input must be head-major ([h, N, d'] contiguous; strided is 2.5x slower) but its output may
  be written strided straight into a [N, h, d'] tensor at no cost. So y, dq, dk, dv come out
  as plain [N, h, d'] tensors (reshape to [N, h*d'] is free) and the only layout copies are
  the SpMM inputs: v (forward), dy, k, q (backward). Scores / probabilities are [h, E], one
  contiguous CSR value array per head.
* The backward is hand-written: 1 SDDMM (dP = dY·Vᵀ on the pattern), 3 SpMM (dV = Pᵀ dY,
  dQ = dS K, dK = dSᵀ Q), using the graph's cached transpose for the two ``ᵀ`` products.
* ``block_rows`` trades one extra SDDMM in backward for memory: per-row log-sum-exp [h, Nr]
  is kept instead of P [h, E], and scores are rebuilt block by block (as FlashAttention does),
  so the peak is [h, E_block] whatever the graph size.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from plexgt.ops import attention_triton, native
from plexgt.ops.csr import CSRGraph
from plexgt.ops.precision import LOW_PRECISION, full_precision

Tensor = torch.Tensor

NO_SAMPLED_ADDMM = ("ROCm builds of torch have no GPU torch.sparse.sampled_addmm ('requires "
                    "compiling PyTorch with CUDA 11.2.1+')")
"""Why torch's SDDMM (and so every path through :func:`sddmm`) cannot run on a ROCm GPU."""


def sampled_addmm_available(device: torch.device | str) -> bool:
    """Whether torch's sparse SDDMM (``torch.sparse.sampled_addmm``, :func:`sddmm`) runs on
    ``device``: everywhere but the GPUs of a ROCm build (``torch.version.hip`` set; ROCm
    devices are ``cuda`` to torch), where only the fused kernel computes attention scores."""
    return not (torch.version.hip and torch.device(device).type == "cuda")


def torch_kernels_reason(head_dim: int) -> str:
    """Why :func:`sparse_attention` with ``kernel='auto'`` on a GPU takes torch's kernels (and so
    :func:`sddmm`) rather than the fused one, '' when the fused one serves: the configured
    sizes alone decide it (Triton installed, d' at most :data:`attention_triton.MAX_HEAD_DIM`;
    an edge bias and a ring's column blocks are the fused kernel's too), so a run can be
    refused before anything is built."""
    if head_dim > attention_triton.MAX_HEAD_DIM:
        return (f"d' = {head_dim} is wider than the fused kernel's "
                f"{attention_triton.MAX_HEAD_DIM}")
    if attention_triton.triton is None:
        return "Triton is not installed, so the fused kernel is unavailable"
    return ""


# --------------------------------------------------------------------------- primitive kernels
def sddmm(graph: CSRGraph, a: Tensor, b: Tensor, alpha: float = 1.0) -> Tensor:
    """[Nr, h, d] x [Nc, h, d] -> [h, E]: ``alpha * a[r, i]·b[c, i]`` on every edge (r, c).

    One sampled_addmm per head on the strided view a[:, i], writing straight into the output
    rows (beta=0 still reads the buffer, hence zeros rather than empty). On a ROCm GPU, which
    has no sampled_addmm, a ValueError in one line (runs are refused before they get here:
    :func:`sampled_addmm_available`).
    """
    if not sampled_addmm_available(a.device):
        raise ValueError(f"sparse attention scores on {a.device}: {NO_SAMPLED_ADDMM}; only "
                         "the fused kernel runs there")
    h = a.shape[1]
    out = torch.zeros(h, graph.num_edges, dtype=a.dtype, device=a.device)
    if graph.num_edges == 0:
        return out
    for i in range(h):
        m = graph.csr_tensor(out[i])
        torch.sparse.sampled_addmm(m, a[:, i], b[:, i].t(), beta=0.0, alpha=alpha, out=m)
    return out


def spmm(graph: CSRGraph, vals: Tensor, x: Tensor, out: Tensor | None = None,
         accumulate: bool = False) -> Tensor:
    """[h, E] values on ``graph`` times head-major [h, Nc, d] -> node-major [Nr, h, d]
    (``out +=`` if accumulate)."""
    h, _, d = x.shape
    if out is None:
        out = torch.zeros(graph.num_rows, h, d, dtype=x.dtype, device=x.device)
        accumulate = False
    if graph.num_edges == 0:
        if not accumulate:
            out.zero_()
        return out
    # torch.mm(sparse, out=) zero-fills a scratch matrix and copies it into out before the
    # product; addmm with beta=0 into out itself skips both passes (MKL does not read C when
    # beta=0: checked against NaN-filled outputs in the tests). cuSPARSE keeps torch.mm.
    overwrite_in_place = x.device.type == "cpu"
    for i in range(h):
        m = graph.csr_tensor(vals[i])
        o = out[:, i]
        if accumulate:
            torch.addmm(o, m, x[i], out=o)
        elif overwrite_in_place:
            torch.addmm(o, m, x[i], beta=0.0, out=o)
        else:
            torch.mm(m, x[i], out=o)
    return out


def _offsets(graph: CSRGraph, h: int) -> Tensor:
    return graph.indptr.unsqueeze(0).expand(h, -1)


def segment_max(graph: CSRGraph, s: Tensor) -> Tensor:
    """[h, E] -> [h, Nr] row maxima (-inf for rows without entries)."""
    return torch.segment_reduce(s, "max", offsets=_offsets(graph, s.shape[0]), axis=1,
                                unsafe=True)


def segment_sum(graph: CSRGraph, s: Tensor) -> Tensor:
    """[h, E] -> [h, Nr] row sums (0 for rows without entries)."""
    return torch.segment_reduce(s, "sum", offsets=_offsets(graph, s.shape[0]), axis=1,
                                unsafe=True)


def row_softmax_(graph: CSRGraph, s: Tensor) -> tuple[Tensor, Tensor]:
    """In place: [h, E] scores -> probabilities normalised over each row's edges.

    Returns (p, lse) with lse [h, Nr] = rowmax + log(rowsum), the only thing a recomputing
    backward needs. Exact: the row max is subtracted before exp, so every row's largest term is
    exp(0) = 1 and the sum is >= 1 — no clamping or epsilon is needed.
    """
    row = graph.row
    m = segment_max(graph, s)
    s.sub_(m.index_select(1, row)).exp_()
    z = segment_sum(graph, s)
    s.div_(z.index_select(1, row))
    return s, m + torch.log(z)


def probs_from_lse(graph: CSRGraph, s: Tensor, lse: Tensor) -> Tensor:
    """In place: [h, E] scores -> probabilities, given the saved [h, Nr] log-sum-exp."""
    return s.sub_(lse.index_select(1, graph.row)).exp_()


def softmax_backward(graph: CSRGraph, p: Tensor, dp: Tensor, scale: float) -> Tensor:
    """dS = scale * P ⊙ (dP - rowsum(P ⊙ dP)), all [h, E]; overwrites ``dp``."""
    dp.mul_(p)
    delta = segment_sum(graph, dp)
    dp.sub_(p * delta.index_select(1, graph.row))
    if scale != 1.0:
        dp.mul_(scale)
    return dp


def _head_major(x: Tensor) -> Tensor:
    """[N, h, d] -> contiguous [h, N, d] (the SpMM's dense operand); free when x is already a
    view of head-major memory."""
    return x.transpose(0, 1).contiguous()


def _unit_stride(x: Tensor) -> Tensor:
    """[N, h, d] with stride 1 along d, all the SDDMM and the saved state need."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _native_kernels(q: Tensor, block_rows: int | None, num_rows: int) -> Any | None:
    """The compiled kernels (:mod:`plexgt.ops.native`) when they serve this call: CPU, a
    compiled head width, unblocked (the blocked mode keeps torch's kernels)."""
    if (q.device.type != "cpu" or q.shape[-1] not in native.WIDTHS
            or (block_rows is not None and block_rows < num_rows)):
        return None
    return native.load()


# --------------------------------------------------------------------------- autograd function
class SparseAttentionFunction(torch.autograd.Function):
    """y = softmax_rows((Q Kᵀ ⊙ A) * scale) V with a hand-written sparse backward."""

    @staticmethod
    def forward(ctx, residual: Tensor | None, graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor,
                scale: float, block_rows: int | None, bias: Tensor | None = None) -> Tensor:
        # residual [Nr, h*d'] (or None) comes first: should it ever be a view, autograd replays
        # the in-place update through CopySlices, which takes the first gradient as its own
        ctx.graph = graph
        ctx.has_residual = residual is not None
        out = None if residual is None else residual.view(q.shape[0], *v.shape[1:])
        ctx.scale = scale
        # the compiled kernels fuse scores and softmax: a bias between them takes torch's
        nat = None if bias is not None else _native_kernels(q, block_rows, graph.num_rows)
        ctx.native = nat
        ctx.blocked = None
        ctx.has_bias = bias is not None
        if nat is not None:
            # head-major copies are made once here and saved: the backward's transposed
            # products need them in that layout too
            qh, kh, vh = _head_major(q), _head_major(k), _head_major(v)
            ip, ix = graph.compact_index()
            p, _ = nat.scores(ip, ix, qh, kh, scale)
            y = nat.spmm(ip, ix, None, p, vh, out)
            ctx.save_for_backward(qh, kh, vh, p)
        else:
            y = SparseAttentionFunction._torch_forward(ctx, graph, q, k, v, scale, block_rows,
                                                       out, bias)
        if residual is not None:
            ctx.mark_dirty(residual)
            return residual
        return y

    @staticmethod
    def _torch_forward(ctx, graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor, scale: float,
                       block_rows: int | None, out: Tensor | None, bias: Tensor | None
                       ) -> Tensor:
        """torch's per-head kernels; the blocked mode keeps [h, Nr] log-sum-exps only.
        ``bias`` [h, E] is added to the scaled scores of its edges before the softmax."""
        q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
        vh = _head_major(v)
        _, h, d = v.shape
        y = torch.empty(graph.num_rows, h, d, dtype=v.dtype, device=v.device) if out is None \
            else out
        acc = out is not None
        if block_rows is None or block_rows >= graph.num_rows:
            p = _biased(sddmm(graph, q, k, scale), bias, 0)
            row_softmax_(graph, p)
            spmm(graph, p, vh, out=y, accumulate=acc)
            ctx.save_for_backward(q, k, v, p, bias)
        else:
            lse = torch.empty(h, graph.num_rows, dtype=v.dtype, device=v.device)
            e0 = 0
            for r0, r1, blk in graph.row_blocks(block_rows):
                s = _biased(sddmm(blk, q[r0:r1], k, scale), bias, e0)
                _, lse[:, r0:r1] = row_softmax_(blk, s)
                spmm(blk, s, vh, out=y[r0:r1], accumulate=acc)
                e0 += blk.num_edges
                del s
            ctx.save_for_backward(q, k, v, lse, bias)
            ctx.blocked = block_rows
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        # with a residual the output is [Nr, h*d'] and its gradient is also the residual's
        d_res = grad if ctx.has_residual and ctx.needs_input_grad[0] else None
        if ctx.native is not None:
            return (d_res, *SparseAttentionFunction._native_backward(ctx, grad))
        q, k, v, saved, bias = ctx.saved_tensors
        dy = grad.view(q.shape[0], *v.shape[1:]) if ctx.has_residual else grad
        graph: CSRGraph = ctx.graph
        scale: float = ctx.scale
        need_q, need_k, need_v = ctx.needs_input_grad[2:5]
        need_b = ctx.has_bias and ctx.needs_input_grad[7]
        dbias = torch.empty_like(bias) if need_b else None
        dy = _unit_stride(dy)
        blocks = ([(0, graph.num_rows, graph)] if ctx.blocked is None
                  else graph.row_blocks(ctx.blocked))
        # Head-major copies of the SpMM dense operands are made just in time and, with one
        # block, dropped right after their product, so at most one is alive at a time.
        keep = len(blocks) > 1
        dyh = kh = qh = None
        dq = torch.empty_like(q) if need_q else None
        dk = torch.empty_like(k) if need_k else None
        dv = torch.empty_like(v) if need_v else None
        e0 = 0  # the block's first edge (a host count: no device sync)
        for b, (r0, r1, blk) in enumerate(blocks):
            acc = b > 0  # dK, dV sum over row blocks; the first block initialises them
            if ctx.blocked is None:
                p = saved
            else:
                s = _biased(sddmm(blk, q[r0:r1], k, scale), bias, e0)
                p = probs_from_lse(blk, s, saved[:, r0:r1])
            perm = blk.transpose_perm if (need_k or need_v) else None
            if need_v:
                dyh = _head_major(dy) if dyh is None else dyh
                spmm(blk.transpose(), p.index_select(1, perm), dyh[:, r0:r1], out=dv,
                     accumulate=acc)
                dyh = dyh if keep else None
            if need_q or need_k or need_b:
                # the bias's gradient is the logits' (unscaled); Q and K see it times scale
                ds = softmax_backward(blk, p, sddmm(blk, dy[r0:r1], v), 1.0)
                del p
                if dbias is not None:
                    dbias[:, e0:e0 + blk.num_edges] = ds
                if scale != 1.0:
                    ds.mul_(scale)
                if need_q:
                    kh = _head_major(k) if kh is None else kh
                    spmm(blk, ds, kh, out=dq[r0:r1])
                    kh = kh if keep else None
                if need_k:
                    qh = _head_major(q) if qh is None else qh
                    spmm(blk.transpose(), ds.index_select(1, perm), qh[:, r0:r1], out=dk,
                         accumulate=acc)
                    qh = qh if keep else None
                del ds
            e0 += blk.num_edges
        return d_res, None, dq, dk, dv, None, None, dbias

    @staticmethod
    def _native_backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        """dV = Pᵀ dY and dK = dSᵀ Q over the transposed graph, reading P and dS through the
        edge permutation in place; dS by the fused softmax backward; dQ = dS K."""
        nat, graph, scale = ctx.native, ctx.graph, ctx.scale
        qh, kh, vh, p = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[2:5]
        dy = grad.view(qh.shape[1], kh.shape[0], kh.shape[2]) if ctx.has_residual else grad
        ip, ix = graph.compact_index()
        dyh = _head_major(dy)
        dq = dk = dv = None
        if need_k or need_v:
            tip, tix = graph.transpose().compact_index()
            perm = graph.compact_transpose_perm()
        if need_v:
            dv = nat.spmm(tip, tix, perm, p, dyh, None)
        if need_q or need_k:
            ds = nat.score_grad(ip, ix, vh, p, dyh, scale)
            del dyh
            if need_q:
                dq = nat.spmm(ip, ix, None, ds, kh, None)
            if need_k:
                dk = nat.spmm(tip, tix, perm, ds, qh, None)
        return None, dq, dk, dv, None, None, None


def _biased(s: Tensor, bias: Tensor | None, e0: int) -> Tensor:
    """Scores [h, E_block] of a row block whose first edge is e0, plus their edges' bias (in
    place). e0 is counted on the host from the blocks' edge counts: reading it from the
    graph's row pointers was a device-to-host sync per block and call on a GPU."""
    if bias is None:
        return s
    return s.add_(bias[:, e0:e0 + s.shape[1]])


KERNELS = ("auto", "fused", "torch")
"""``sparse_attention``'s kernels: 'fused' the Triton kernel (:mod:`plexgt.ops.attention_triton`),
'torch' torch's sparse kernels (the compiled CPU kernels where they serve), 'auto' fused on GPUs
when Triton is present, torch otherwise."""


def sparse_attention(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor,
                     scale: float | None = None, block_rows: int | None = None,
                     residual: Tensor | None = None, kernel: str = "auto",
                     bias: Tensor | None = None) -> Tensor:
    """Multi-head attention restricted to the edges of ``graph``.

    q [Nr, h, d'], k and v [Nc, h, d'] on graph [Nr, Nc] -> y [Nr, h, d'] (contiguous).
    ``scale`` defaults to 1/sqrt(d'). Rows with no neighbours give zeros.
    ``block_rows`` bounds the per-call temporaries to [h, E of block_rows rows] and keeps only
    [h, Nr] between forward and backward (one more SDDMM per block in backward).
    ``residual`` [Nr, h*d'] (contiguous, needed by nothing else) is returned with y added to it
    in place, so a layer's X W_o + attention costs no pass of its own.
    ``kernel``: one of :data:`KERNELS`. The fused kernel is always blocked (it keeps [h, Nr]
    only), so ``block_rows`` does not apply to it.
    ``bias`` [h, E] (graph's edge order, any strides): added to each edge's scaled score
    before the softmax (an edge encoding), with its gradient. The fused kernel reads it in
    place; on the CPU a biased call takes torch's sparse kernels (the compiled CPU kernels
    fuse scores and softmax and have no bias input), an unbiased one keeps the compiled
    kernels.
    """
    if q.dim() != 3 or k.shape != v.shape or q.shape[1:] != k.shape[1:]:
        raise ValueError(f"expected q [Nr,h,d], k/v [Nc,h,d]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[0] != graph.num_rows or k.shape[0] != graph.num_cols:
        raise ValueError(f"graph is {graph.num_rows}x{graph.num_cols} but q has {q.shape[0]} "
                         f"rows and k has {k.shape[0]}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    want = (q.shape[0], v.shape[1] * v.shape[2])
    if residual is not None and (residual.shape != want or not residual.is_contiguous()
                                 or residual.dtype != v.dtype):
        raise ValueError(f"residual must be a contiguous {want} tensor of v's dtype; got "
                         f"{tuple(residual.shape)}")
    if kernel not in KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}; known: {', '.join(KERNELS)}")
    if bias is not None:
        if bias.shape != (q.shape[1], graph.num_edges):
            raise ValueError(f"bias must be [heads, edges] = [{q.shape[1]}, {graph.num_edges}]"
                             f"; got {tuple(bias.shape)}")
    if kernel == "torch" and not sampled_addmm_available(q.device):
        raise ValueError(f"attention kernel 'torch' on {q.device}: {NO_SAMPLED_ADDMM}; use "
                         "'fused' or 'auto'")
    if kernel == "fused" or (kernel == "auto" and attention_triton.gpu_default(q)):
        return attention_triton.fused_attention(graph, q, k, v, float(scale), residual, bias)
    if q.dtype in LOW_PRECISION:
        # torch's sparse kernels (and the compiled ones) have no half types on the CPU, and
        # cuSPARSE's would sum in half: the reference computes in float32, rounds once
        with full_precision(q.device):  # or autocast's mm would cast back to half
            y = SparseAttentionFunction.apply(
                None, graph, q.float(), k.float(), v.float(), float(scale), block_rows,
                None if bias is None else bias.float()).to(q.dtype)
        return y if residual is None else residual + y.reshape(residual.shape)
    return SparseAttentionFunction.apply(residual, graph, q, k, v, float(scale), block_rows,
                                         bias)


def dense_attention_reference(graph: CSRGraph, q: Tensor, k: Tensor, v: Tensor,
                              scale: float | None = None, bias: Tensor | None = None) -> Tensor:
    """The same function via a dense masked softmax ([h, Nr, Nc]; tests and tiny graphs only)."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    mask = graph.to_dense(torch.float32) > 0
    s = torch.einsum("rhd,chd->hrc", q, k) * scale
    if bias is not None:
        dense = torch.zeros_like(s)
        dense[:, graph.row, graph.indices] = bias
        s = s + dense
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows without neighbours -> all zeros
    return torch.einsum("hrc,chd->rhd", p, v)
