"""The Triton kernels of the fused sparse attention (:mod:`plexgt.ops.attention_triton`).

Every kernel walks *segments*: a segment is (row, first edge, end edge) of the CSR pattern (or
of its transpose, for the column backward), given by three arrays a
:class:`~plexgt.ops.attention_schedule.Schedule` builds. A program owns ``BLOCK_R`` segments
and a group of ``HG`` heads (``program_id(1)`` is the group: heads ``g·HG .. g·HG + HG - 1``,
all of them where h·d' fits the tile) and steps through its segments' edges ``BLOCK_E`` at a
time. K/V are node-major [N, h, d']: one edge is one gather of the HG·d' contiguous elements
of its row (not HG gathers of d', one per head), and one index load serves all HG heads. The
gathered tile is [BLOCK_R, BLOCK_E, HG, BLOCK_D]; scores are per head, the sum over its last
axis. HG and BLOCK_D are powers of two (Triton's block shapes must be): heads past h and
lanes past d' are masked.

* the light launch: every row of degree <= the split length, one segment each, in
  order of falling degree (a program's rows have about the same degree, so few lanes idle);
  its outputs go to the row itself;
* the split launch (``PARTIAL``): the rows longer than the split length (hubs, super nodes)
  cut into segments of the split length, each written to a partial buffer at its slot:
  forward the unnormalised (max, sum, acc), backward its share of dQ (or dK, dV);
* the merge kernels fold a long row's partials in slot order (a fixed order, no atomics: the
  results are the same bits on every run).

Per-(row, head) statistics (lse, delta, the partial max and sum) are [h, N] views of any
strides (node-major storage, [N, h] transposed, so the column backward reads a gathered row's
HG values in one load). The edge loops are ``tl.range(..., num_stages=STAGES)``: Triton
software-pipelines a loop without ``tl.dot`` only when asked. ``STAGES``, ``BLOCK_R`` and
``HG`` change no arithmetic (the same bits at any value); ``BLOCK_E`` only the order in which
a row's edge steps are folded (float reassociation).

``deg`` (the launch's degree bucket) is read by no kernel: it keys the autotuned launches'
configuration (:mod:`plexgt.ops.attention_triton`).

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
    def _heads(h, D, HG: tl.constexpr, BLOCK_D: tl.constexpr):
        """This program's head group: heads [HG] (int64: h·N may pass 2^31), lanes [BLOCK_D]
        and the [HG, BLOCK_D] mask of real heads and lanes."""
        hh = tl.program_id(1) * HG + tl.arange(0, HG)
        dd = tl.arange(0, BLOCK_D)
        hmask = hh < h
        return hh.to(tl.int64), hmask, dd, hmask[:, None] & (dd < D)[None, :]

    @triton.jit
    def _edges(indices, start, end, j, BLOCK_E: tl.constexpr):
        """Step j of every segment: [BLOCK_R, BLOCK_E] edge positions, neighbour ids (int64)
        and their mask."""
        eo = start[:, None] + j + tl.arange(0, BLOCK_E)[None, :]
        emask = eo < end[:, None]
        return eo, tl.load(indices + eo, mask=emask, other=0).to(tl.int64), emask

    @triton.jit
    def _rows(x, idx, hh, s0, s1, dd, mask, dtype: tl.constexpr):
        """[BLOCK_R, HG, BLOCK_D]: heads ``hh`` of rows ``idx`` of an [N, h, d'] tensor."""
        return tl.load(x + idx[:, None, None] * s0 + hh[None, :, None] * s1
                       + dd[None, None, :], mask=mask, other=0.0).to(dtype)

    @triton.jit
    def _gather(x, nbr, hh, s0, s1, dd, mask, dtype: tl.constexpr):
        """[BLOCK_R, BLOCK_E, HG, BLOCK_D]: heads ``hh`` of the rows ``nbr`` (the edges'
        ends); for a node-major tensor one contiguous run of HG·d' per edge."""
        return tl.load(x + nbr[:, :, None, None] * s0 + hh[None, None, :, None] * s1
                       + dd[None, None, None, :], mask=mask, other=0.0).to(dtype)

    @triton.jit
    def _stat(x, hh, sh, sn, idx, mask, other):
        """[BLOCK_R, HG]: per-(row, head) values of an [h, N] view at rows ``idx``."""
        return tl.load(x + hh[None, :] * sh + idx[:, None] * sn, mask=mask, other=other)

    @triton.jit
    def _stat_edges(x, hh, sh, sn, idx, mask):
        """[BLOCK_R, BLOCK_E, HG]: per-(row, head) values of an [h, N] view at the edges'
        rows ``idx`` [BLOCK_R, BLOCK_E] (node-major storage: one load of HG per edge)."""
        return tl.load(x + hh[None, None, :] * sh + idx[:, :, None] * sn, mask=mask, other=0.0)

    @triton.jit
    def _bias(bias, hh, sb0, sb1, edge, mask, dtype: tl.constexpr):
        """[BLOCK_R, BLOCK_E, HG] bias of heads ``hh`` at the CSR edge positions ``edge`` of
        an [h, E] tensor of any strides (the [E, h] output of the edge encoder, transposed)."""
        return tl.load(bias + hh[None, None, :] * sb0 + edge.to(tl.int64)[:, :, None] * sb1,
                       mask=mask, other=0.0).to(dtype)

    @triton.jit
    def fwd_kernel(seg_row, seg_start, seg_end, n_seg, indices, q, k, v, bias, y, res, lse,
                   scale_ptr, h, deg, sq0, sq1, sk0, sk1, sv0, sv1, sy0, sy1, sr0, sr1, sb0, sb1,
                   sl0, sl1, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
                   HG: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr,
                   ACCUMULATE: tl.constexpr, PARTIAL: tl.constexpr, STAGES: tl.constexpr):
        # running max m, sum l [BLOCK_R, HG], accumulator acc [BLOCK_R, HG, BLOCK_D] per
        # segment. PARTIAL: y is the [W, h, d'] acc buffer, lse the [h, W] max and res the
        # [h, W] sum (strides sl0, sl1 both), all at the segment's slot; else y, res
        # [Nr, h, d'] and lse [h, Nr] (strides sl0, sl1) at its row
        slot, rows, rmask, start, end = _segments(seg_row, seg_start, seg_end, n_seg, BLOCK_R)
        hh, hmask, dd, hdmask = _heads(h, D, HG, BLOCK_D)
        scale = tl.load(scale_ptr)
        rh = rmask[:, None] & hmask[None, :]
        rhd = rmask[:, None, None] & hdmask[None, :, :]
        qt = _rows(q, rows, hh, sq0, sq1, dd, rhd, scale.dtype)
        m = tl.full([BLOCK_R, HG], float("-inf"), scale.dtype)
        el = tl.zeros([BLOCK_R, HG], scale.dtype)
        acc = tl.zeros([BLOCK_R, HG, BLOCK_D], scale.dtype)
        for j in tl.range(0, tl.max(end - start, axis=0), BLOCK_E, num_stages=STAGES):
            eo, col, emask = _edges(indices, start, end, j, BLOCK_E)
            tmask = emask[:, :, None, None] & hdmask[None, None, :, :]
            kt = _gather(k, col, hh, sk0, sk1, dd, tmask, scale.dtype)
            s = tl.sum(qt[:, None, :, :] * kt, axis=3) * scale
            if HAS_BIAS:
                s += _bias(bias, hh, sb0, sb1, eo, emask[:, :, None] & hmask[None, None, :],
                           scale.dtype)
            s = tl.where(emask[:, :, None], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no edge yet
            alpha = tl.exp(m - m_safe)
            p = tl.exp(s - m_safe[:, None, :])
            el = el * alpha + tl.sum(p, axis=1)
            vt = _gather(v, col, hh, sv0, sv1, dd, tmask, scale.dtype)
            acc = acc * alpha[:, :, None] + tl.sum(p[:, :, :, None] * vt, axis=1)
            m = m_new
        if PARTIAL:
            tl.store(y + slot[:, None, None] * sy0 + hh[None, :, None] * sy1
                     + dd[None, None, :], acc, mask=rhd)
            tl.store(lse + hh[None, :] * sl0 + slot[:, None] * sl1, m, mask=rh)
            tl.store(res + hh[None, :] * sl0 + slot[:, None] * sl1, el, mask=rh)
        else:
            _finish(acc, m, el, rows, rh, rhd, hh, dd, y, res, lse, sy0, sy1, sr0, sr1, sl0,
                    sl1, scale.dtype, ACCUMULATE)

    @triton.jit
    def _finish(acc, m, el, rows, rh, rhd, hh, dd, y, res, lse, sy0, sy1, sr0, sr1, sl0, sl1,
                dtype: tl.constexpr, ACCUMULATE: tl.constexpr):
        """Store y = acc / l (zeros for a row without edges), add it into the residual, and
        store lse = m + log l."""
        out = acc / tl.where(el == 0.0, 1.0, el)[:, :, None]
        at = rows[:, None, None] * sy0 + hh[None, :, None] * sy1 + dd[None, None, :]
        tl.store(y + at, out.to(y.dtype.element_ty), mask=rhd)
        if ACCUMULATE:  # the residual gains y in place; y itself is kept for the backward
            rp = res + rows[:, None, None] * sr0 + hh[None, :, None] * sr1 + dd[None, None, :]
            out += tl.load(rp, mask=rhd, other=0.0).to(dtype)
            tl.store(rp, out.to(res.dtype.element_ty), mask=rhd)
        tl.store(lse + hh[None, :] * sl0 + rows[:, None] * sl1,
                 m + tl.log(tl.where(el == 0.0, 1.0, el)), mask=rh)

    @triton.jit
    def _long_rows(long_row, cptr, n_long, BLOCK_R: tl.constexpr):
        """This merge program's long rows (int64), their mask and slot ranges [c0, c1)."""
        i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        row = tl.load(long_row + i, mask=i < n_long, other=-1)
        rmask = row >= 0
        c0 = tl.load(cptr + i, mask=rmask, other=0).to(tl.int64)
        c1 = tl.load(cptr + i + 1, mask=rmask, other=0).to(tl.int64)
        return tl.where(rmask, row, 0).to(tl.int64), rmask, c0, c1

    @triton.jit
    def merge_fwd_kernel(long_row, cptr, n_long, pm, pl, pacc, h, y, res, lse, spa0, spa1,
                         sp0, sp1, sy0, sy1, sr0, sr1, sl0, sl1, D: tl.constexpr,
                         BLOCK_R: tl.constexpr, HG: tl.constexpr, BLOCK_D: tl.constexpr,
                         ACCUMULATE: tl.constexpr):
        # a long row's partials (slots cptr[i] .. cptr[i+1]; pm, pl [h, W] of strides sp0,
        # sp1) folded in slot order by the log-sum-exp rule, then stored like a light row's
        rows, rmask, c0, c1 = _long_rows(long_row, cptr, n_long, BLOCK_R)
        hh, hmask, dd, hdmask = _heads(h, D, HG, BLOCK_D)
        rh = rmask[:, None] & hmask[None, :]
        rhd = rmask[:, None, None] & hdmask[None, :, :]
        dtype = pm.dtype.element_ty
        m = tl.full([BLOCK_R, HG], float("-inf"), dtype)
        el = tl.zeros([BLOCK_R, HG], dtype)
        acc = tl.zeros([BLOCK_R, HG, BLOCK_D], dtype)
        for j in range(0, tl.max(c1 - c0, axis=0)):
            c = c0 + j
            cm = (c < c1)[:, None] & hmask[None, :]
            mc = _stat(pm, hh, sp0, sp1, c, cm, float("-inf"))
            lc = _stat(pl, hh, sp0, sp1, c, cm, 0.0)
            ac = tl.load(pacc + c[:, None, None] * spa0 + hh[None, :, None] * spa1
                         + dd[None, None, :], mask=cm[:, :, None] & hdmask[None, :, :],
                         other=0.0)
            m_new = tl.maximum(m, mc)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha, beta = tl.exp(m - m_safe), tl.exp(mc - m_safe)
            el = el * alpha + lc * beta
            acc = acc * alpha[:, :, None] + ac * beta[:, :, None]
            m = m_new
        _finish(acc, m, el, rows, rh, rhd, hh, dd, y, res, lse, sy0, sy1, sr0, sr1, sl0, sl1,
                dtype, ACCUMULATE)

    @triton.jit
    def merge_sum_kernel(long_row, cptr, n_long, part, out, h, sp0, sp1, so0, so1,
                         D: tl.constexpr, BLOCK_R: tl.constexpr, HG: tl.constexpr,
                         BLOCK_D: tl.constexpr, ACCUMULATE: tl.constexpr):
        # out[row] (+)= the sum of a long row's partial gradients, in slot order
        rows, rmask, c0, c1 = _long_rows(long_row, cptr, n_long, BLOCK_R)
        hh, hmask, dd, hdmask = _heads(h, D, HG, BLOCK_D)
        rhd = rmask[:, None, None] & hdmask[None, :, :]
        acc = tl.zeros([BLOCK_R, HG, BLOCK_D], part.dtype.element_ty)
        for j in range(0, tl.max(c1 - c0, axis=0)):
            c = c0 + j
            acc += tl.load(part + c[:, None, None] * sp0 + hh[None, :, None] * sp1
                           + dd[None, None, :],
                           mask=(c < c1)[:, None, None] & hdmask[None, :, :], other=0.0)
        op = out + rows[:, None, None] * so0 + hh[None, :, None] * so1 + dd[None, None, :]
        if ACCUMULATE:
            acc += tl.load(op, mask=rhd, other=0.0).to(acc.dtype)
        tl.store(op, acc.to(out.dtype.element_ty), mask=rhd)

    @triton.jit
    def bwd_rows_kernel(seg_row, seg_start, seg_end, n_seg, indices, q, k, v, bias, dy, lse,
                        delta, dq, dbias, scale_ptr, h, deg, sq0, sq1, sk0, sk1, sv0, sv1, sg0,
                        sg1, sdq0, sdq1, sb0, sb1, sdb0, sdb1, sl0, sl1, sd0, sd1,
                        D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
                        HG: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr,
                        NEED_DQ: tl.constexpr, NEED_DB: tl.constexpr, PARTIAL: tl.constexpr,
                        STAGES: tl.constexpr):
        # one walk over the segment's edges: dS = P (dP - delta_r) with delta_r = rowsum(dY∘Y)
        # given; dBias_e = dS (the logits' gradient), dQ_r = sum_e scale dS K_c (PARTIAL: the
        # segment's share, stored at its slot of the [W, h, d'] buffer dq)
        slot, rows, rmask, start, end = _segments(seg_row, seg_start, seg_end, n_seg, BLOCK_R)
        hh, hmask, dd, hdmask = _heads(h, D, HG, BLOCK_D)
        scale = tl.load(scale_ptr)
        rh = rmask[:, None] & hmask[None, :]
        rhd = rmask[:, None, None] & hdmask[None, :, :]
        qt = _rows(q, rows, hh, sq0, sq1, dd, rhd, scale.dtype)
        gt = _rows(dy, rows, hh, sg0, sg1, dd, rhd, scale.dtype)
        ls = _stat(lse, hh, sl0, sl1, rows, rh, 0.0)
        dl = _stat(delta, hh, sd0, sd1, rows, rh, 0.0)
        acc = tl.zeros([BLOCK_R, HG, BLOCK_D], scale.dtype)
        for j in tl.range(0, tl.max(end - start, axis=0), BLOCK_E, num_stages=STAGES):
            eo, col, emask = _edges(indices, start, end, j, BLOCK_E)
            tmask = emask[:, :, None, None] & hdmask[None, None, :, :]
            ehmask = emask[:, :, None] & hmask[None, None, :]
            kt = _gather(k, col, hh, sk0, sk1, dd, tmask, scale.dtype)
            vt = _gather(v, col, hh, sv0, sv1, dd, tmask, scale.dtype)
            s = tl.sum(qt[:, None, :, :] * kt, axis=3) * scale
            if HAS_BIAS:
                s += _bias(bias, hh, sb0, sb1, eo, ehmask, scale.dtype)
            p = tl.where(ehmask, tl.exp(s - ls[:, None, :]), 0.0)
            ds = p * (tl.sum(gt[:, None, :, :] * vt, axis=3) - dl[:, None, :])
            if NEED_DB:
                tl.store(dbias + hh[None, None, :] * sdb0 + eo.to(tl.int64)[:, :, None] * sdb1,
                         ds.to(dbias.dtype.element_ty), mask=ehmask)
            if NEED_DQ:
                acc += tl.sum((ds * scale)[:, :, :, None] * kt, axis=1)
        if NEED_DQ:
            at = slot if PARTIAL else rows
            tl.store(dq + at[:, None, None] * sdq0 + hh[None, :, None] * sdq1
                     + dd[None, None, :], acc.to(dq.dtype.element_ty), mask=rhd)

    @triton.jit
    def bwd_cols_kernel(seg_col, seg_start, seg_end, n_seg, tindices, tperm, q, k, v, bias,
                        dy, lse, delta, dk, dv, scale_ptr, h, deg, sq0, sq1, sk0, sk1, sv0, sv1,
                        sg0, sg1, sdk0, sdk1, sdv0, sdv1, sb0, sb1, sl0, sl1, sd0, sd1,
                        D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr,
                        HG: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr,
                        NEED_DK: tl.constexpr, NEED_DV: tl.constexpr, ACCUMULATE: tl.constexpr,
                        PARTIAL: tl.constexpr, STAGES: tl.constexpr):
        # over the transpose: a segment is (column c, a range of the rows r naming it);
        # dV_c = sum P dY_r, dK_c = sum scale dS Q_r, with P and dS recomputed from lse_r,
        # delta_r (and the bias, read at the CSR position tperm gives each transposed edge).
        # PARTIAL: the segment's shares, at its slot of the [W, h, d'] buffers dk, dv
        slot, cols, cmask, start, end = _segments(seg_col, seg_start, seg_end, n_seg, BLOCK_R)
        hh, hmask, dd, hdmask = _heads(h, D, HG, BLOCK_D)
        scale = tl.load(scale_ptr)
        chd = cmask[:, None, None] & hdmask[None, :, :]
        kc = _rows(k, cols, hh, sk0, sk1, dd, chd, scale.dtype)
        vc = _rows(v, cols, hh, sv0, sv1, dd, chd, scale.dtype)
        dk_acc = tl.zeros([BLOCK_R, HG, BLOCK_D], scale.dtype)
        dv_acc = tl.zeros([BLOCK_R, HG, BLOCK_D], scale.dtype)
        for j in tl.range(0, tl.max(end - start, axis=0), BLOCK_E, num_stages=STAGES):
            eo, row, emask = _edges(tindices, start, end, j, BLOCK_E)
            tmask = emask[:, :, None, None] & hdmask[None, None, :, :]
            ehmask = emask[:, :, None] & hmask[None, None, :]
            qt = _gather(q, row, hh, sq0, sq1, dd, tmask, scale.dtype)
            gt = _gather(dy, row, hh, sg0, sg1, dd, tmask, scale.dtype)
            ls = _stat_edges(lse, hh, sl0, sl1, row, ehmask)
            s = tl.sum(kc[:, None, :, :] * qt, axis=3) * scale
            if HAS_BIAS:
                edge = tl.load(tperm + eo, mask=emask, other=0)
                s += _bias(bias, hh, sb0, sb1, edge, ehmask, scale.dtype)
            p = tl.where(ehmask, tl.exp(s - ls), 0.0)
            if NEED_DV:
                dv_acc += tl.sum(p[:, :, :, None] * gt, axis=1)
            if NEED_DK:
                dl = _stat_edges(delta, hh, sd0, sd1, row, ehmask)
                ds = p * (tl.sum(vc[:, None, :, :] * gt, axis=3) - dl) * scale
                dk_acc += tl.sum(ds[:, :, :, None] * qt, axis=1)
        at = (slot if PARTIAL else cols)[:, None, None]
        if NEED_DK:
            dkp = dk + at * sdk0 + hh[None, :, None] * sdk1 + dd[None, None, :]
            if ACCUMULATE:
                dk_acc += tl.load(dkp, mask=chd, other=0.0).to(scale.dtype)
            tl.store(dkp, dk_acc.to(dk.dtype.element_ty), mask=chd)
        if NEED_DV:
            dvp = dv + at * sdv0 + hh[None, :, None] * sdv1 + dd[None, None, :]
            if ACCUMULATE:
                dv_acc += tl.load(dvp, mask=chd, other=0.0).to(scale.dtype)
            tl.store(dvp, dv_acc.to(dv.dtype.element_ty), mask=chd)
