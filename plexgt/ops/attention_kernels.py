"""The Triton kernels of the fused sparse attention (:mod:`plexgt.ops.attention_triton`).

Every kernel walks *segments*: a segment is (row, first edge, end edge) of the CSR pattern (or
of its transpose, for the column backward), given by three arrays a
:class:`~plexgt.ops.attention_schedule.Schedule` builds. A program owns ``BLOCK_R`` segments of
one head (``program_id(1)``) and steps through their edges ``BLOCK_E`` at a time:

* the light launch: every row of degree <= the split length, one segment each, in
  order of falling degree (a program's rows have about the same degree, so few lanes idle);
  its outputs go to the row itself;
* the split launch (``PARTIAL``): the rows longer than the split length (hubs, super nodes)
  cut into segments of the split length, each written to a partial buffer at its slot:
  forward the unnormalised (max, sum, acc), backward its share of dQ (or dK, dV);
* the merge kernels fold a long row's partials in slot order (a fixed order, no atomics: the
  results are the same bits on every run).

The edge loops are ``tl.range(..., num_stages=STAGES)``: Triton software-pipelines a loop
without ``tl.dot`` only when asked, and without it every step pays the index load -> gather
latency in series. ``STAGES`` changes no arithmetic (the same bits at any value).

Arithmetic is in the dtype of ``scale_ptr`` (float32, float64 for float64 inputs); loads and
the final stores use the tensors' own dtypes. Addresses are computed in int64.
"""

from __future__ import annotations

try:  # Triton ships with the CUDA and ROCm wheels of torch; a CPU-only install may lack it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on installs without triton
    triton = None
    tl = None

if triton is not None:

    @triton.jit
    def _segments(seg_row, seg_start, seg_end, n_seg, BLOCK_R: tl.constexpr):
        """This program's BLOCK_R segments: slots, rows (int64), mask (row >= 0: a long
        row's slot in the light launch and an unused slot of the split launch hold -1) and
        edge ranges."""
        slot = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        row = tl.load(seg_row + slot, mask=slot < n_seg, other=-1)
        mask = row >= 0
        start = tl.load(seg_start + slot, mask=mask, other=0)
        end = tl.load(seg_end + slot, mask=mask, other=0)
        return slot.to(tl.int64), tl.where(mask, row, 0).to(tl.int64), mask, start, end

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
    def fwd_kernel(seg_row, seg_start, seg_end, n_seg, indices, q, k, v, bias, y, res, lse,
                   scale_ptr, n_out, sq0, sq1, sk0, sk1, sv0, sv1, sy0, sy1, sr0, sr1, sb0, sb1,
                   D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
                   BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr,
                   PARTIAL: tl.constexpr, STAGES: tl.constexpr):
        # running max m, sum l, accumulator acc per segment. PARTIAL: y is the [W, h, d']
        # acc buffer, lse the [h, W] max and res the [h, W] sum, all at the segment's slot
        # (n_out = W); else y, res [Nr, h, d'] and lse [h, Nr] at its row (n_out = Nr)
        hd = tl.program_id(1).to(tl.int64)  # head offsets in int64: h·Nr may pass 2^31
        slot, rows, rmask, start, end = _segments(seg_row, seg_start, seg_end, n_seg, BLOCK_R)
        dd = tl.arange(0, BLOCK_D)
        dmask = dd < D
        scale = tl.load(scale_ptr)
        rdmask = rmask[:, None] & dmask[None, :]
        qt = _rows(q, rows, hd, sq0, sq1, dd, rdmask, scale.dtype)
        m = tl.full([BLOCK_R], float("-inf"), scale.dtype)
        el = tl.zeros([BLOCK_R], scale.dtype)
        acc = tl.zeros([BLOCK_R, BLOCK_D], scale.dtype)
        for j in tl.range(0, tl.max(end - start, axis=0), BLOCK_E, num_stages=STAGES):
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
        if PARTIAL:
            tl.store(y + slot[:, None] * sy0 + hd * sy1 + dd[None, :], acc, mask=rdmask)
            tl.store(lse + hd * n_out + slot, m, mask=rmask)
            tl.store(res + hd * n_out + slot, el, mask=rmask)
        else:
            _finish(acc, m, el, rows, rmask, rdmask, hd, dd, y, res, lse, n_out, sy0, sy1,
                    sr0, sr1, scale.dtype, ACCUMULATE)

    @triton.jit
    def _finish(acc, m, el, rows, rmask, rdmask, hd, dd, y, res, lse, n_rows, sy0, sy1, sr0,
                sr1, dtype: tl.constexpr, ACCUMULATE: tl.constexpr):
        """Store y = acc / l (zeros for a row without edges), add it into the residual, and
        store lse = m + log l."""
        out = acc / tl.where(el == 0.0, 1.0, el)[:, None]
        tl.store(y + rows[:, None] * sy0 + hd * sy1 + dd[None, :], out.to(y.dtype.element_ty),
                 mask=rdmask)
        if ACCUMULATE:  # the residual gains y in place; y itself is kept for the backward
            rp = res + rows[:, None] * sr0 + hd * sr1 + dd[None, :]
            out += tl.load(rp, mask=rdmask, other=0.0).to(dtype)
            tl.store(rp, out.to(res.dtype.element_ty), mask=rdmask)
        tl.store(lse + hd * n_rows + rows, m + tl.log(tl.where(el == 0.0, 1.0, el)), mask=rmask)

    @triton.jit
    def merge_fwd_kernel(long_row, cptr, n_long, pm, pl, pacc, n_slots, y, res, lse, n_rows,
                         spa0, spa1, sy0, sy1, sr0, sr1, D: tl.constexpr, BLOCK_R: tl.constexpr,
                         BLOCK_D: tl.constexpr, ACCUMULATE: tl.constexpr):
        # a long row's partials (slots cptr[i] .. cptr[i+1]) folded in slot order by the
        # log-sum-exp rule, then stored like a light row's result
        hd = tl.program_id(1).to(tl.int64)
        i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        row = tl.load(long_row + i, mask=i < n_long, other=-1)
        rmask = row >= 0
        rows = tl.where(rmask, row, 0).to(tl.int64)
        c0 = tl.load(cptr + i, mask=rmask, other=0).to(tl.int64)
        c1 = tl.load(cptr + i + 1, mask=rmask, other=0).to(tl.int64)
        dd = tl.arange(0, BLOCK_D)
        dmask = dd < D
        rdmask = rmask[:, None] & dmask[None, :]
        dtype = pm.dtype.element_ty
        m = tl.full([BLOCK_R], float("-inf"), dtype)
        el = tl.zeros([BLOCK_R], dtype)
        acc = tl.zeros([BLOCK_R, BLOCK_D], dtype)
        for j in range(0, tl.max(c1 - c0, axis=0)):
            c = c0 + j
            cm = c < c1
            mc = tl.load(pm + hd * n_slots + c, mask=cm, other=float("-inf"))
            lc = tl.load(pl + hd * n_slots + c, mask=cm, other=0.0)
            ac = tl.load(pacc + c[:, None] * spa0 + hd * spa1 + dd[None, :],
                         mask=cm[:, None] & dmask[None, :], other=0.0)
            m_new = tl.maximum(m, mc)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha, beta = tl.exp(m - m_safe), tl.exp(mc - m_safe)
            el = el * alpha + lc * beta
            acc = acc * alpha[:, None] + ac * beta[:, None]
            m = m_new
        _finish(acc, m, el, rows, rmask, rdmask, hd, dd, y, res, lse, n_rows, sy0, sy1, sr0,
                sr1, dtype, ACCUMULATE)

    @triton.jit
    def merge_sum_kernel(long_row, cptr, n_long, part, out, sp0, sp1, so0, so1,
                         D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                         ACCUMULATE: tl.constexpr):
        # out[row] (+)= the sum of a long row's partial gradients, in slot order
        hd = tl.program_id(1).to(tl.int64)
        i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        row = tl.load(long_row + i, mask=i < n_long, other=-1)
        rmask = row >= 0
        rows = tl.where(rmask, row, 0).to(tl.int64)
        c0 = tl.load(cptr + i, mask=rmask, other=0).to(tl.int64)
        c1 = tl.load(cptr + i + 1, mask=rmask, other=0).to(tl.int64)
        dd = tl.arange(0, BLOCK_D)
        dmask = dd < D
        rdmask = rmask[:, None] & dmask[None, :]
        acc = tl.zeros([BLOCK_R, BLOCK_D], part.dtype.element_ty)
        for j in range(0, tl.max(c1 - c0, axis=0)):
            c = c0 + j
            acc += tl.load(part + c[:, None] * sp0 + hd * sp1 + dd[None, :],
                           mask=(c < c1)[:, None] & dmask[None, :], other=0.0)
        op = out + rows[:, None] * so0 + hd * so1 + dd[None, :]
        if ACCUMULATE:
            acc += tl.load(op, mask=rdmask, other=0.0).to(acc.dtype)
        tl.store(op, acc.to(out.dtype.element_ty), mask=rdmask)

    @triton.jit
    def bwd_rows_kernel(seg_row, seg_start, seg_end, n_seg, indices, q, k, v, bias, dy, lse,
                        delta, dq, dbias, scale_ptr, n_rows, sq0, sq1, sk0, sk1, sv0, sv1, sg0,
                        sg1, sdq0, sdq1, sb0, sb1, sdb0, sdb1,
                        D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
                        BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, NEED_DQ: tl.constexpr,
                        NEED_DB: tl.constexpr, PARTIAL: tl.constexpr, STAGES: tl.constexpr):
        # one walk over the segment's edges: dS = P (dP - delta_r) with delta_r = rowsum(dY∘Y)
        # given; dBias_e = dS (the logits' gradient), dQ_r = sum_e scale dS K_c (PARTIAL: the
        # segment's share, stored at its slot of the [W, h, d'] buffer dq)
        hd = tl.program_id(1).to(tl.int64)
        slot, rows, rmask, start, end = _segments(seg_row, seg_start, seg_end, n_seg, BLOCK_R)
        dd = tl.arange(0, BLOCK_D)
        dmask = dd < D
        scale = tl.load(scale_ptr)
        rdmask = rmask[:, None] & dmask[None, :]
        qt = _rows(q, rows, hd, sq0, sq1, dd, rdmask, scale.dtype)
        gt = _rows(dy, rows, hd, sg0, sg1, dd, rdmask, scale.dtype)
        ls = tl.load(lse + hd * n_rows + rows, mask=rmask, other=0.0)
        dl = tl.load(delta + hd * n_rows + rows, mask=rmask, other=0.0)
        acc = tl.zeros([BLOCK_R, BLOCK_D], scale.dtype)
        for j in tl.range(0, tl.max(end - start, axis=0), BLOCK_E, num_stages=STAGES):
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
            at = slot if PARTIAL else rows
            tl.store(dq + at[:, None] * sdq0 + hd * sdq1 + dd[None, :],
                     acc.to(dq.dtype.element_ty), mask=rdmask)

    @triton.jit
    def bwd_cols_kernel(seg_col, seg_start, seg_end, n_seg, tindices, tperm, q, k, v, bias,
                        dy, lse, delta, dk, dv, scale_ptr, n_rows, sq0, sq1, sk0, sk1, sv0, sv1,
                        sg0, sg1, sdk0, sdk1, sdv0, sdv1, sb0, sb1,
                        D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
                        BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, NEED_DK: tl.constexpr,
                        NEED_DV: tl.constexpr, ACCUMULATE: tl.constexpr, PARTIAL: tl.constexpr,
                        STAGES: tl.constexpr):
        # over the transpose: a segment is (column c, a range of the rows r naming it);
        # dV_c = sum P dY_r, dK_c = sum scale dS Q_r, with P and dS recomputed from lse_r,
        # delta_r (and the bias, read at the CSR position tperm gives each transposed edge).
        # PARTIAL: the segment's shares, at its slot of the [W, h, d'] buffers dk, dv
        hd = tl.program_id(1).to(tl.int64)
        slot, cols, cmask, start, end = _segments(seg_col, seg_start, seg_end, n_seg, BLOCK_R)
        dd = tl.arange(0, BLOCK_D)
        dmask = dd < D
        scale = tl.load(scale_ptr)
        cdmask = cmask[:, None] & dmask[None, :]
        kc = _rows(k, cols, hd, sk0, sk1, dd, cdmask, scale.dtype)
        vc = _rows(v, cols, hd, sv0, sv1, dd, cdmask, scale.dtype)
        dk_acc = tl.zeros([BLOCK_R, BLOCK_D], scale.dtype)
        dv_acc = tl.zeros([BLOCK_R, BLOCK_D], scale.dtype)
        for j in tl.range(0, tl.max(end - start, axis=0), BLOCK_E, num_stages=STAGES):
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
        at = slot if PARTIAL else cols
        if NEED_DK:
            dkp = dk + at[:, None] * sdk0 + hd * sdk1 + dd[None, :]
            if ACCUMULATE:
                dk_acc += tl.load(dkp, mask=cdmask, other=0.0).to(scale.dtype)
            tl.store(dkp, dk_acc.to(dk.dtype.element_ty), mask=cdmask)
        if NEED_DV:
            dvp = dv + at[:, None] * sdv0 + hd * sdv1 + dd[None, :]
            if ACCUMULATE:
                dv_acc += tl.load(dvp, mask=cdmask, other=0.0).to(scale.dtype)
            tl.store(dvp, dv_acc.to(dv.dtype.element_ty), mask=cdmask)
