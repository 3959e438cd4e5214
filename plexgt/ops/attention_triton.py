"""Fused sparse attention in Triton: SDDMM -> online softmax -> SpMM in one pass per row block.

Shapes: q [Nr, h, d'], k and v [Nc, h, d'] on a CSR pattern [Nr, Nc], optionally an edge bias
[h, E] (any strides, CSR edge order) -> y [Nr, h, d'] and the per-row log-sum-exp [h, Nr]
(float32, or float64 for float64 inputs; stored node-major, an [Nr, h] tensor transposed).
Same function as :func:`plexgt.ops.attention.sparse_attention`, which stays the reference
and the fallback.

Why a kernel of its own: the torch path materialises scores and probabilities as [h, E] arrays
(cuSPARSE SDDMM, a segment softmax, a CSR SpMM: four passes over E·h values, and the [h, E]
probabilities held until backward), and ROCm builds of torch have no GPU ``sampled_addmm`` at
all. Here a program owns ``BLOCK_R`` rows and a group of HG heads (all h where h·d' fits
:data:`GROUP_ELEMS`), walks their edges ``BLOCK_E`` at a time, gathers the K and V rows those
edges name (node-major: one contiguous HG·d' run per edge, one index read for all HG heads;
a program per head re-read the index h times and gathered d'-wide pieces, 32 bytes at
d' = 16 in bf16) and the bias of those edges, and keeps
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

Rows are walked in order of falling degree, and rows (columns, in the column backward) longer
than :data:`SPLIT_STEPS` edge steps are cut across programs and merged exactly in a fixed
order (:mod:`plexgt.ops.attention_schedule`; the kernels are :mod:`plexgt.ops.attention_kernels`).

Launch configurations: on a GPU each edge launch is autotuned (``triton.autotune``: a few
candidate BLOCK_R, BLOCK_E, HG, num_warps timed on the first use of each key of d', heads,
degree bucket, flags and dtypes, the fastest kept for the process; :func:`candidates`); under
the interpreter and in deterministic runs the fixed :func:`blocks` (:func:`tuning`).

On a machine without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``
set before this module is imported), which is how the test suite checks them against the
reference.
"""

from __future__ import annotations

import inspect
import math
import os
import time
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from plexgt.ops.attention_kernels import (
    bwd_cols_kernel,
    bwd_rows_kernel,
    fwd_kernel,
    merge_fwd_kernel,
    merge_sum_kernel,
    triton,
)
from plexgt.ops.attention_schedule import Schedule, schedule
from plexgt.ops.csr import CSRGraph

Tensor = torch.Tensor

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""Input dtypes the kernels take."""
GPU_TYPES = ("cuda",)
"""Device types the compiled kernels serve (ROCm devices are ``cuda`` to torch)."""
MAX_HEAD_DIM = 256
"""Widest d' a program holds in registers."""
TILE_ELEMS = 4096
"""Elements of one gathered [BLOCK_R, BLOCK_E, HG, BLOCK_D] tile: sized for registers; the
fixed configuration (:func:`blocks`) and every tuned candidate (:func:`candidates`) keep to
it."""
GROUP_ELEMS = 512
"""Widest HG·BLOCK_D of one program's head group: at 512 a step still holds 8 edges of every
row under :data:`TILE_ELEMS`; h·d' = 128 (8 heads of 16, the benchmarks') takes all heads."""
EDGE_STAGES = 3
"""Software-pipeline stages of the edge loops (``tl.range(num_stages=...)``): index loads and
gathers of the next steps in flight while one step computes. The tuned launches keep it
(their candidates vary the tile and the warps)."""
TUNE_WARPS = (4, 8)
"""num_warps the autotuned launches try with each candidate tile (:func:`candidates`)."""
TUNE_BENCH_MS = (5, 25)
"""Warm-up and measured milliseconds per candidate when a launch is tuned on a GPU: the
first use of each key, once per process."""
SPLIT_STEPS = 8
"""A row (or, in the column backward, a column) with more than SPLIT_STEPS·BLOCK_E edges is
cut into segments of that many, walked by separate programs and merged exactly
(:mod:`plexgt.ops.attention_schedule`)."""


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


class Blocks(NamedTuple):
    """One launch configuration: ``block_r`` segments and ``heads`` heads (HG) per program,
    ``block_e`` edges per step, ``block_d`` lanes per head (d' rounded up to a power of two)."""

    block_r: int
    block_e: int
    heads: int
    block_d: int


def blocks(num_rows: int, num_edges: int, head_dim: int, heads: int = 1) -> Blocks:
    """The launch configuration: d' and the head group rounded up to powers of two (Triton's
    block shapes must be), all h heads in one program while h·d' fits :data:`GROUP_ELEMS`
    (one edge one gather of HG·d' contiguous elements, one index read for HG heads), edges
    per step about the mean degree (16..64) but no more than one row's tile of
    :data:`TILE_ELEMS` holds, and as many rows as fill it. The tile
    BLOCK_R·BLOCK_E·HG·BLOCK_D never passes the cap (it did at d' = 256 with a mean degree
    over 16: one row of 64 edges, four times the cap, spilled)."""
    block_d = triton.next_power_of_2(max(head_dim, 1))
    group = min(triton.next_power_of_2(max(heads, 1)), max(1, GROUP_ELEMS // block_d))
    width = group * block_d
    mean = num_edges / max(num_rows, 1)
    block_e = min(64, max(16, triton.next_power_of_2(max(1, math.ceil(mean)))))
    block_e = min(block_e, max(1, TILE_ELEMS // width))
    block_r = max(1, min(64, TILE_ELEMS // (block_e * width)))
    return Blocks(block_r, block_e, group, block_d)


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
    return torch.einsum("nhd,nhd->nh", dy.to(acc), y.to(acc)).t()  # stored node-major


def _split(block_e: int) -> int:
    """Edges per segment of a long row: :data:`SPLIT_STEPS` edge steps."""
    return SPLIT_STEPS * block_e


def _tile(cfg: Blocks) -> dict[str, int]:
    """The tuned meta-parameters of an edge launch at the fixed configuration ``cfg``."""
    return dict(BLOCK_R=cfg.block_r, BLOCK_E=cfg.block_e, HG=cfg.heads, STAGES=EDGE_STAGES)


def _grid(n: int, h: int, cfg: Blocks) -> tuple[int, int]:
    """Programs of a launch over n segments (or long rows): row blocks x head groups."""
    return triton.cdiv(n, cfg.block_r), triton.cdiv(h, cfg.heads)


def _merge_cfg(cfg: Blocks) -> Blocks:
    """The merge kernels' configuration: the launch's head group, rows to fill a tile of
    [BLOCK_R, HG, BLOCK_D] (no edge axis), at most 16."""
    return cfg._replace(block_r=max(1, min(16, TILE_ELEMS // (cfg.heads * cfg.block_d))))


def _merge(cfg: Blocks) -> dict[str, int]:
    return dict(BLOCK_R=cfg.block_r, HG=cfg.heads, BLOCK_D=cfg.block_d)


def degree_bucket(mean: float) -> int:
    """The degree key of a launch: its mean degree rounded up to a power of two (1..1024)."""
    return min(1024, triton.next_power_of_2(max(1, math.ceil(mean))))


def candidates(head_dim: int, heads: int, degree: int) -> list:
    """The configurations a launch of ``heads`` heads of ``head_dim`` over segments of
    mean degree ``degree`` is timed at (``triton.Config``; the first is :func:`blocks`'):
    the head group whole and halved, BLOCK_E halved, as is and doubled (8..64), rows to fill
    :data:`TILE_ELEMS` (never past it), each at every :data:`TUNE_WARPS`. BLOCK_R, HG,
    STAGES and num_warps change the order of no sum in the kernels' source; BLOCK_E the
    order in which a row's steps fold, and the compiled reductions' trees may follow the
    layout: float reassociation only."""
    base = blocks(1, degree, head_dim, heads)
    out = []
    for hg in dict.fromkeys((base.heads, max(1, base.heads // 2))):
        for be in dict.fromkeys((base.block_e, max(8, base.block_e // 2),
                                 min(64, 2 * base.block_e))):
            width = hg * base.block_d
            if be * width > TILE_ELEMS:
                continue
            br = max(1, min(64, TILE_ELEMS // (be * width)))
            for warps in TUNE_WARPS:
                out.append(triton.Config(dict(BLOCK_R=br, BLOCK_E=be, HG=hg,
                                              STAGES=EDGE_STAGES), num_warps=warps))
    return out


def tuning() -> bool:
    """Whether the edge launches take the autotuned configuration: compiled kernels (not
    Triton's interpreter, which runs one fixed configuration) and not under
    ``torch.use_deterministic_algorithms`` (a timed choice may differ between a run and its
    resume, and the sums' order with it: ``deterministic`` promises bit-equal reruns)."""
    return not interpreted() and not torch.are_deterministic_algorithms_enabled()


def _prune(configs: list, named_args: dict, **kwargs: object) -> list:
    """triton.autotune's hook, used to give each key its own candidates (the static list is
    two placeholders): d' from q, the heads and the degree bucket from the arguments."""
    return candidates(named_args["q"].shape[-1], named_args["h"], named_args["deg"])


def _bench(kernel_call, quantiles):  # noqa: ANN001, ANN202 - triton.autotune's do_bench
    """Triton's GPU timing at :data:`TUNE_BENCH_MS`; under the interpreter (a test of the
    tuned path) one wall-clock call."""
    if interpreted():
        t = time.perf_counter()
        kernel_call()
        return [1e3 * (time.perf_counter() - t)] * len(quantiles)
    warm, rep = TUNE_BENCH_MS
    return triton.testing.do_bench(kernel_call, warmup=warm, rep=rep, quantiles=quantiles)


def _autotuned(kernel, flags: tuple[str, ...], restore: tuple[str, ...]):  # noqa: ANN001, ANN202
    """``kernel`` autotuned per (d', heads, degree bucket, flags, dtypes: triton.autotune
    adds every tensor argument's dtype to the key); ``restore``: the arguments a launch adds
    into, restored after each timed candidate."""
    kw = {}
    if "do_bench" in inspect.signature(triton.autotune).parameters:
        kw["do_bench"] = _bench
    placeholders = [triton.Config({}, num_warps=4), triton.Config({}, num_warps=8)]
    return triton.autotune(placeholders, key=["D", "h", "deg", *flags],
                           prune_configs_by={"early_config_prune": _prune},
                           restore_value=list(restore), **kw)(kernel)


if triton is not None:
    fwd_tuned = _autotuned(fwd_kernel, ("HAS_BIAS", "ACCUMULATE", "PARTIAL"), ("res",))
    bwd_rows_tuned = _autotuned(bwd_rows_kernel, ("HAS_BIAS", "NEED_DQ", "NEED_DB", "PARTIAL"),
                                ())
    bwd_cols_tuned = _autotuned(bwd_cols_kernel, ("HAS_BIAS", "NEED_DK", "NEED_DV",
                                                  "ACCUMULATE", "PARTIAL"), ("dk", "dv"))


def _launch(kernel, tuned, n: int, h: int, cfg: Blocks, args: tuple,  # noqa: ANN001
            **flags: object) -> None:
    """One edge launch over n segments of h heads. ``args`` end with (h, degree bucket)
    followed by the strides. Tuned (:func:`tuning`): the autotuned kernel picks BLOCK_R,
    BLOCK_E, HG, STAGES and num_warps per key; else the fixed ``cfg``."""
    if tuning():
        tuned[lambda m: (triton.cdiv(n, m["BLOCK_R"]), triton.cdiv(h, m["HG"]))](
            *args, **flags)
    else:
        kernel[_grid(n, h, cfg)](*args, **flags, **_tile(cfg))


def _sched(graph: CSRGraph, q: Tensor) -> Schedule:
    """The schedule of ``graph`` for q [N, h, d']: segments of SPLIT_STEPS steps of the
    launch's BLOCK_E."""
    cfg = blocks(graph.num_rows, graph.num_edges, q.shape[-1], q.shape[1])
    return schedule(graph, _split(cfg.block_e))


def _arrays(s: Schedule) -> list[Tensor]:
    return [s.light_row, s.light_start, s.light_end, s.long_row, s.long_ptr, s.seg_row,
            s.seg_start, s.seg_end]


def _work(s: Schedule, q: Tensor) -> Tensor:
    """The schedule's partial buffer, big enough for any launch of q's h·d' (forward
    W·h·(d' + 2), column backward 2·W·h·d'); empty where no row is long."""
    w, (h, d) = s.seg_row.numel(), q.shape[1:]
    return s.partials(w * h * max(d + 2, 2 * d), _acc_dtype(q.dtype)) if w else q.new_empty(0)


def _carve(work: Tensor, *shapes: tuple[int, ...]) -> list[Tensor]:
    """Consecutive contiguous views of the given shapes from the front of ``work``."""
    out, at = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(work[at:at + n].view(shape))
        at += n
    return out


def _stats(n: int, h: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """An [h, n] per-(row, head) array stored node-major ([n, h] transposed): the column
    backward reads a gathered row's HG values in one load."""
    return torch.empty(n, h, dtype=dtype, device=device).t()


# The launches are torch custom operators, so the dispatcher sees one op per kernel call: device
# checks (and the test suite's device audit) apply to them like to any aten op, and torch.compile
# could trace around them. Optional outputs come back as empty tensors (an op returns tensors).
# ``sched`` is :func:`_arrays` of the pattern's (the transpose's) :class:`Schedule`.
@torch.library.custom_op("plexgt::fused_attention_forward", mutates_args=("y", "res", "work"))
def _forward_op(sched: list[Tensor], work: Tensor, indices: Tensor, q: Tensor, k: Tensor,
                v: Tensor, bias: Tensor | None, y: Tensor, res: Tensor | None,
                scale: float) -> Tensor:
    nr, h, d = q.shape
    acc_dt = _acc_dtype(q.dtype)
    lse = _stats(nr, h, acc_dt, q.device)
    if nr == 0 or h == 0:
        return lse
    lr, ls, le, long_row, long_ptr, sr, ss, se = sched
    cfg = blocks(nr, indices.numel(), d, h)
    sc = torch.full((1,), scale, dtype=acc_dt, device=q.device)
    qkv = (*_strides(q), *_strides(k), *_strides(v))
    flags = dict(D=d, BLOCK_D=cfg.block_d, HAS_BIAS=bias is not None)
    b_arg = q if bias is None else bias
    res_arg = y if res is None else res
    _launch(fwd_kernel, fwd_tuned, nr, h, cfg,
            (lr, ls, le, nr, indices, q, k, v, b_arg, y, res_arg, lse, sc, h,
             degree_bucket(indices.numel() / nr), *qkv, *_strides(y), *_strides(res),
             *_strides(bias), *_strides(lse)), **flags, ACCUMULATE=res is not None,
            PARTIAL=False)
    w, n_long = sr.numel(), long_row.numel()
    if w:  # long rows: segments into (acc, max, sum) partials, folded per row in slot order
        pacc, pm, pl = _carve(work, (w, h, d), (w, h), (w, h))
        pm, pl = pm.t(), pl.t()  # [h, W] views, node-major
        _launch(fwd_kernel, fwd_tuned, w, h, cfg,
                (sr, ss, se, w, indices, q, k, v, b_arg, pacc, pl, pm, sc, h,
                 degree_bucket(_split(cfg.block_e)), *qkv, *_strides(pacc), 0, 0,
                 *_strides(bias), *_strides(pm)), **flags, ACCUMULATE=False, PARTIAL=True)
        mc = _merge_cfg(cfg)
        merge_fwd_kernel[_grid(n_long, h, mc)](
            long_row, long_ptr, n_long, pm, pl, pacc, h, y, res_arg, lse, *_strides(pacc),
            *_strides(pm), *_strides(y), *_strides(res), *_strides(lse), D=d, **_merge(mc),
            ACCUMULATE=res is not None)
    return lse


@torch.library.custom_op("plexgt::fused_attention_backward_rows", mutates_args=("work",))
def _backward_rows_op(sched: list[Tensor], work: Tensor, indices: Tensor, q: Tensor, k: Tensor,
                      v: Tensor, bias: Tensor | None, dy: Tensor, lse: Tensor, delta: Tensor,
                      scale: float, need_q: bool, need_bias: bool) -> tuple[Tensor, Tensor]:
    nr, h, d = q.shape
    none = q.new_empty(0)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if need_q else none
    db = torch.empty_like(bias) if need_bias and bias is not None else none.clone()
    if nr == 0 or h == 0 or not (need_q or db.numel()):
        return dq, db
    lr, ls, le, long_row, long_ptr, sr, ss, se = sched
    acc_dt = _acc_dtype(q.dtype)
    sc = torch.full((1,), scale, dtype=acc_dt, device=q.device)
    cfg = blocks(nr, indices.numel(), d, h)
    dq_arg = dq if need_q else q  # never written when NEED_DQ is off
    db_arg = db if db.numel() else q
    ins = (q, k, v, q if bias is None else bias, dy, lse, delta)
    qkv = (*_strides(q), *_strides(k), *_strides(v), *_strides(dy))
    tail = (*_strides(bias), *_strides(db if db.numel() else None), *_strides(lse),
            *_strides(delta))
    flags = dict(D=d, BLOCK_D=cfg.block_d, HAS_BIAS=bias is not None, NEED_DQ=need_q,
                 NEED_DB=bool(db.numel()))
    _launch(bwd_rows_kernel, bwd_rows_tuned, nr, h, cfg,
            (lr, ls, le, nr, indices, *ins, dq_arg, db_arg, sc, h,
             degree_bucket(indices.numel() / nr), *qkv, *_strides(dq_arg), *tail),
            **flags, PARTIAL=False)
    w, n_long = sr.numel(), long_row.numel()
    if w:  # long rows: each segment's share of dQ (dBias is per edge: stored directly)
        pdq = _carve(work, (w, h, d))[0] if need_q else q
        _launch(bwd_rows_kernel, bwd_rows_tuned, w, h, cfg,
                (sr, ss, se, w, indices, *ins, pdq, db_arg, sc, h,
                 degree_bucket(_split(cfg.block_e)), *qkv, *_strides(pdq), *tail),
                **flags, PARTIAL=True)
        if need_q:
            mc = _merge_cfg(cfg)
            merge_sum_kernel[_grid(n_long, h, mc)](
                long_row, long_ptr, n_long, pdq, dq, h, *_strides(pdq), *_strides(dq), D=d,
                **_merge(mc), ACCUMULATE=False)
    return dq, db


@torch.library.custom_op("plexgt::fused_attention_backward_cols",
                        mutates_args=("work", "dk", "dv"))
def _backward_cols_op(sched: list[Tensor], work: Tensor, tindices: Tensor, tperm: Tensor,
                      q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, dy: Tensor,
                      lse: Tensor, delta: Tensor, dk: Tensor, dv: Tensor, scale: float,
                      accumulate: bool) -> None:
    nr, h, d = q.shape
    nc = k.shape[0]
    need_k, need_v = dk.numel() > 0, dv.numel() > 0
    if nc == 0 or h == 0 or not (need_k or need_v):
        return
    lr, ls, le, long_col, long_ptr, sr, ss, se = sched
    acc_dt = _acc_dtype(q.dtype)
    sc = torch.full((1,), scale, dtype=acc_dt, device=q.device)
    cfg = blocks(nc, tindices.numel(), d, h)
    dk_arg = dk if need_k else k  # never written when NEED_DK is off
    dv_arg = dv if need_v else v
    ins = (tperm, q, k, v, q if bias is None else bias, dy, lse, delta)
    qkv = (*_strides(q), *_strides(k), *_strides(v), *_strides(dy))
    tail = (*_strides(bias), *_strides(lse), *_strides(delta))
    flags = dict(D=d, BLOCK_D=cfg.block_d, HAS_BIAS=bias is not None, NEED_DK=need_k,
                 NEED_DV=need_v)
    _launch(bwd_cols_kernel, bwd_cols_tuned, nc, h, cfg,
            (lr, ls, le, nc, tindices, *ins, dk_arg, dv_arg, sc, h,
             degree_bucket(tindices.numel() / nc), *qkv, *_strides(dk_arg), *_strides(dv_arg),
             *tail), **flags, ACCUMULATE=accumulate, PARTIAL=False)
    w, n_long = sr.numel(), long_col.numel()
    if w:  # long columns (super nodes, hubs): each segment's share of dK, dV, then summed
        pdk, pdv = _carve(work, (w, h, d), (w, h, d))
        pdk, pdv = pdk if need_k else k, pdv if need_v else v
        _launch(bwd_cols_kernel, bwd_cols_tuned, w, h, cfg,
                (sr, ss, se, w, tindices, *ins, pdk, pdv, sc, h,
                 degree_bucket(_split(cfg.block_e)), *qkv, *_strides(pdk), *_strides(pdv),
                 *tail), **flags, ACCUMULATE=False, PARTIAL=True)
        mc = _merge_cfg(cfg)
        for need, p, out in ((need_k, pdk, dk), (need_v, pdv, dv)):
            if need:
                merge_sum_kernel[_grid(n_long, h, mc)](
                    long_col, long_ptr, n_long, p, out, h, *_strides(p), *_strides(out), D=d,
                    **_merge(mc), ACCUMULATE=accumulate)


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
    _, ix = graph.compact_index()
    s = _sched(graph, q)
    return y, _forward_op(_arrays(s), _work(s, q), ix, q, k, v, bias, y, out, scale)


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
    _, ix = graph.compact_index()
    dq = db = None
    if need[0] or (need_bias and bias is not None):
        s = _sched(graph, q)
        dq, db = _backward_rows_op(_arrays(s), _work(s, q), ix, q, k, v, bias, dy,
                                   lse, delta, scale, need[0], need_bias and bias is not None)
    dk = dv = None
    if need[1] or need[2]:
        none = q.new_empty(0)
        if dkv is None:
            dk = torch.empty(k.shape, dtype=k.dtype, device=k.device) if need[1] else None
            dv = torch.empty(v.shape, dtype=v.dtype, device=v.device) if need[2] else None
            outs = (none if dk is None else dk, none.clone() if dv is None else dv)
        else:
            outs = (dkv[0] if need[1] else none, dkv[1] if need[2] else none.clone())
        gt = graph.transpose()
        _, tix = gt.compact_index()
        s = _sched(gt, q)
        _backward_cols_op(_arrays(s), _work(s, q), tix, graph.compact_transpose_perm(),
                          q, k, v, bias, dy, lse, delta, *outs, scale, dkv is not None)
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
