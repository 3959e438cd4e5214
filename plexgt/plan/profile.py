"""The system profile file: its format, its validation, and the fits the planners read.

A profile (``plexgt profile --out system.json``, measured by :mod:`plexgt.plan.measure`) is
JSON with ``format`` = :data:`FORMAT` and ``version`` = :data:`VERSION`; it names the
hardware and the libraries, and holds the raw samples (``collectives``, ``kernels``,
``loaded``) beside what is fitted from them: ``collective_fits`` (latency and seconds per byte
per operation and group size), ``kernel_fits`` (per-call, per-row and per-element costs,
:func:`fit_kernels`),
``contention`` and, under ``plexus``, the coefficients
:class:`plexgt.plan.plexus_cost.Coefficients` takes (:func:`fit_plexus_coefficients`).
Profiles an older version wrote load as they are: what they lack is priced as that version
did, and :func:`profile_notes` says what.
The fits live here rather than with the measurements so that a planner can refit stored raw
samples without importing the measuring code.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from plexgt.plan.plexus_cost import Coefficients

FORMAT = "plexgt-system-profile"
VERSION = 1
OPS = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")


def fit_linear(rows: list[list[float]]) -> dict[str, float]:
    """Least squares ``t = latency + s_per_byte · x`` with both coefficients >= 0."""

    a = np.array([[1.0, r[0]] for r in rows])
    t = np.array([r[1] for r in rows])
    w = 1.0 / np.maximum(t, 1e-9)  # relative error: small messages matter as much as big
    coef, _ = nnls(a * w[:, None], t * w)
    return {"latency_s": float(coef[0]), "s_per_byte": float(coef[1])}
GT_STEP_SHAPE = {"features": 128, "classes": 8, "layers": 2, "ffn_mult": 2}


KERNEL_KINDS = ("spmm", "sddmm", "gemm", "attention", "elementwise", "copy", "dense_block")
"""The kinds of raw kernel sample a profile holds; :meth:`plexgt.plan.agp.SystemModel.
from_profile` refits them when all are there."""
OPTIONAL_KINDS = ("recompute",)
"""Kinds later profiles added, refitted when present: 'recompute' [E, h, d', s, rows, cols],
the ring's block kernel (scores rebuilt in backward) on the square attention samples'
patterns; without them the planner prices a recomputation as one more of the fused kernel's
six per-edge passes (:func:`fit_recompute`)."""
STEP_KINDS = ("gt_step", "gcn_step")
"""Whole one-rank training steps: gt [N, E, F, C, hidden, heads, layers, s] and gcn
[N, E, F, C, hidden, layers, density, s] (density 0: a dense input), which calibrate the two
planners' kernel sums (optional: profiles before the calibration have neither or only gt's)."""


def per_element_curve(samples: list[list[float]]) -> list[tuple[float, float]]:
    """[(elements, seconds per element)] sorted by size, from [elements, seconds] samples."""
    return sorted((float(r[0]), float(r[1]) / float(r[0])) for r in samples if r[0] > 0)


def monotone_curve(points: list[list[float]] | list[tuple[float, float]]
                   ) -> tuple[tuple[float, float], ...]:
    """Measured (bytes, seconds) sorted by size, each time lowered to the fastest time of any
    size at least as large: sending more never takes less, and on a shared machine noise only
    adds time, so a small message timed slower than a bigger one was disturbed."""
    pts = sorted((float(b), float(t)) for b, t in points)
    out: list[tuple[float, float]] = []
    low = math.inf
    for b, t in reversed(pts):
        low = min(low, t)
        out.append((b, low))
    return tuple(reversed(out))


def curve_time(curve: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear time at x bytes: the smallest size's time below it, the last
    segment's slope beyond the largest (its bandwidth)."""
    if x <= curve[0][0] or len(curve) == 1:
        return curve[0][1] if x <= curve[0][0] else curve[-1][1]
    for (b0, t0), (b1, t1) in zip(curve, curve[1:]):
        if x <= b1:
            return t0 + (t1 - t0) * (x - b0) / (b1 - b0)
    (b0, t0), (b1, t1) = curve[-2], curve[-1]
    return t1 + (t1 - t0) / (b1 - b0) * (x - b1)


def memory_factor(curve: list[tuple[float, float]] | tuple[tuple[float, float], ...],
                  elems: float) -> float:
    """How much slower per element a streaming op over arrays of ``elems`` elements runs than
    over the smallest profiled ones (>= 1 where the arrays fall out of cache).

    The profiled per-element cost, interpolated linearly in log(size) and held constant
    outside the profiled sizes; 1.0 without a curve. For many sizes on one curve, take its
    :func:`memory_table` once and ask :func:`table_factor`.
    """
    return table_factor(memory_table(curve), elems)


def memory_table(curve: list[tuple[float, float]] | tuple[tuple[float, float], ...]
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """What :func:`memory_factor` interpolates on ``curve``: the logs of its sizes and its
    per-element costs (None without a curve)."""
    if not curve:
        return None
    return np.log([c[0] for c in curve]), np.array([c[1] for c in curve])


def table_factor(table: tuple[np.ndarray, np.ndarray] | None, elems: float) -> float:
    """:func:`memory_factor` at ``elems`` elements from the curve's :func:`memory_table`."""
    if table is None:
        return 1.0
    xs, ys = table
    return float(max(1.0, np.interp(np.log(max(elems, 1.0)), xs, ys) / ys[0]))


def _attention_nodes(r: list[float]) -> tuple[float, float] | None:
    """(rows, cols) of an attention sample; None for the first profiler's [E, h, d', s]."""
    return (float(r[4]), float(r[5])) if len(r) >= 6 else None


def streamed(mem: tuple[np.ndarray, np.ndarray] | None, r: list[float], n: float) -> float:
    """Elements of the [h, n, d'] arrays an attention sample r = [E, h, d', ...] streams,
    times their memory factor: what its per-row and per-column terms are fitted against."""
    x = n * r[1] * r[2]
    return x * table_factor(mem, x)


def fit_kernels(raw: dict[str, list[list[float]]]) -> dict[str, float]:
    """Per-unit coefficients (non-negative least squares on relative error).

    Terms that stream [rows, d]-sized arrays (the row·d part of the dense block, the per-row
    and per-column part of attention) are fitted against size x memory_factor(array elements),
    so the same coefficient prices a cache-resident and a DRAM-bound size; the per-edge and
    per-row·d² (GEMM) terms are not scaled.
    """

    def through_origin(xs: list[float], ts: list[float]) -> float:
        x, t = np.array(xs), np.array(ts)
        return float(np.median(t / x))

    def rel_nnls(a: np.ndarray, t: np.ndarray) -> np.ndarray:
        coef, _ = nnls(a / t[:, None], np.ones_like(t))
        return coef

    fits = {
        **fit_spmm(raw["spmm"]),
        "sddmm_s_per_nnz_col": through_origin([r[0] * r[1] for r in raw["sddmm"]],
                                              [r[2] for r in raw["sddmm"]]),
        "gemm_s_per_fma": through_origin([r[0] * r[1] * r[2] for r in raw["gemm"]],
                                         [r[3] for r in raw["gemm"]]),
        "elementwise_s_per_elem": through_origin([r[0] for r in raw["elementwise"]],
                                                 [r[1] for r in raw["elementwise"]]),
        "copy_s_per_elem": through_origin([r[0] for r in raw["copy"]],
                                          [r[1] for r in raw["copy"]]),
    }
    mem = memory_table(per_element_curve(raw["elementwise"]))
    rows = raw["dense_block"]
    a = np.array([[1.0, r[0] * r[1] * r[1], r[0] * r[1] * table_factor(mem, r[0] * r[1])]
                  for r in rows], dtype=np.float64)
    coef = rel_nnls(a, np.array([r[2] for r in rows]))
    fits["dense_s_per_block"] = float(coef[0])
    fits["dense_s_per_row_d2"] = float(coef[1])
    fits["dense_s_per_row_d"] = float(coef[2])
    rows = raw["attention"]
    t = np.array([r[3] for r in rows])
    nodes = [_attention_nodes(r) for r in rows]
    fits["attention_s_per_row_head_dim"] = fits["attention_s_per_col_head_dim"] = 0.0
    if any(nd is None for nd in nodes):  # sizes unknown: per-call, per-edge terms only
        a = np.array([[r[1], r[0] * r[1] * r[2], r[0] * r[1]] for r in rows], dtype=np.float64)
        coef = rel_nnls(a, t)
    else:
        a = np.array([[r[1], r[0] * r[1] * r[2], r[0] * r[1], streamed(mem, r, nd[0]),
                       streamed(mem, r, nd[1])] for r, nd in zip(rows, nodes)],
                     dtype=np.float64)
        if all(nd[0] == nd[1] for nd in nodes):
            # square patterns only: rows and columns cannot be told apart; half each
            coef = rel_nnls(np.column_stack([a[:, :3], a[:, 3] + a[:, 4]]), t)
            coef = np.append(coef, coef[3])
        else:
            coef = rel_nnls(a, t)
        fits["attention_s_per_row_head_dim"] = float(coef[3])
        fits["attention_s_per_col_head_dim"] = float(coef[4])
    fits["attention_s_per_head"] = float(coef[0])
    fits["attention_s_per_edge_head_dim"] = float(coef[1])
    fits["attention_s_per_edge_head"] = float(coef[2])
    fits.update(fit_recompute(raw, fits, mem))
    return fits


SPMM_TERMS = ("spmm_s_per_call", "spmm_s_per_row_col")
"""The SpMM fit's terms beyond the per-nonzero one, which profiles before them lack."""


def fit_spmm(rows: list[list[float]]) -> dict[str, float]:
    """SpMM seconds ``t = per_call + per_row_col · rows·d + per_nnz_col · nnz·d`` from
    samples [nnz, d, s, rows] (non-negative least squares on relative error): a rank's
    block of a sparse matrix is not priced per nonzero alone, since a call's launch and its
    [rows, d] output cost what they cost however few nonzeros the block holds. Samples
    without rows (a profile before the fit, [nnz, d, s]): per nonzero·column only, through
    the origin (the two other terms 0; :func:`profile_notes` says so)."""
    if len(rows) >= 4 and all(len(r) >= 4 for r in rows):
        a = np.array([[1.0, r[3] * r[1], r[0] * r[1]] for r in rows], dtype=np.float64)
        t = np.array([r[2] for r in rows], dtype=np.float64)
        coef, _ = nnls(a / t[:, None], np.ones_like(t))
        return {"spmm_s_per_call": float(coef[0]), "spmm_s_per_row_col": float(coef[1]),
                "spmm_s_per_nnz_col": float(coef[2])}
    return {"spmm_s_per_call": 0.0, "spmm_s_per_row_col": 0.0,
            "spmm_s_per_nnz_col": float(np.median([r[2] / (r[0] * r[1]) for r in rows]))}


def profile_notes(prof: dict[str, Any] | None) -> list[str]:
    """What a profile lacks that this version fits, and how the planners price it instead
    (one line each; empty for a current profile or none)."""
    if not prof:
        return []
    out = []
    spmm = (prof.get("kernels") or {}).get("spmm") or []
    if spmm and not all(len(r) >= 4 for r in spmm):
        out.append("profile's SpMM samples have no rows (an older plexgt profile): SpMM priced "
                   "per nonzero x column only, no per-call or per-row term; rerun plexgt "
                   "profile to fit them")
    if (prof.get("kernels") or {}) and not (prof.get("kernels") or {}).get("recompute"):
        out.append("profile has no recompute samples: a ring's rebuilt scores priced as one "
                   "more of the fused kernel's six per-edge passes")
    return out


def counted_recompute(fits: dict[str, float]) -> dict[str, float]:
    """Recomputation counted, not measured: one more of the fused kernel's six per-edge·
    head·d' passes (2 forward, 4 backward). How the planner priced it before profiles held
    'recompute' samples, and still prices a profile without them."""
    return {"recompute_s_per_edge_head_dim": fits["attention_s_per_edge_head_dim"] / 6,
            "recompute_s_per_edge_head": 0.0, "recompute_s_per_row_head_dim": 0.0}


def fit_recompute(raw: dict[str, list[list[float]]], fits: dict[str, float],
                  mem: tuple[np.ndarray, np.ndarray] | None) -> dict[str, float]:
    """What recomputing the scores adds per edge·head·d', edge·head and row·head·d': the
    profile's 'recompute' samples less the fused attention sample of the same pattern and
    (h, d'), fitted on error relative to the fused kernel's time (non-negative least squares;
    the row term against size x memory factor ``mem``, as the fused kernel's). Without them
    (an older profile), :func:`counted_recompute`.

    Why a measurement: the ring rebuilds each block's scores (an SDDMM and the exponentials)
    and gathers and merges its rows, which on the 2-core VM cost ~45% of the fused kernel's
    per-edge time, not the sixth that counting passes gives (the exponentials dominate)."""
    fused = {(r[0], r[1], r[2], r[4], r[5]): r[3] for r in raw.get("attention", [])
             if len(r) >= 6}
    pairs = [(r, fused[r[0], r[1], r[2], r[4], r[5]]) for r in raw.get("recompute", [])
             if len(r) >= 6 and (r[0], r[1], r[2], r[4], r[5]) in fused]
    if len(pairs) < 3:
        return counted_recompute(fits)
    # the row term: the [h, rows, d'] arrays gathered and merged
    a = np.array([[r[0] * r[1] * r[2], r[0] * r[1], streamed(mem, r, r[4])] for r, _ in pairs])
    base = np.array([t for _, t in pairs])
    extra = np.array([max(0.0, r[3] - t) for r, t in pairs])
    coef, _ = nnls(a / base[:, None], extra / base)
    return {"recompute_s_per_edge_head_dim": float(coef[0]),
            "recompute_s_per_edge_head": float(coef[1]),
            "recompute_s_per_row_head_dim": float(coef[2])}


def fit_plexus_coefficients(kfits: dict[str, float], cfits: dict[str, dict[str, dict[str, float]]]
                        ) -> dict[str, float]:
    """The numbers of :class:`plexgt.plan.plexus_cost.Coefficients` a profile stores under
    "plexus": kernel rates (SpMM per call, per output row·column and per nonzero·column;
    GEMM per multiply-add), and latency / s_per_byte averaged over the operations at the
    largest profiled group. Profiles before the SpMM fit store four (the SpMM's per-call and
    per-row terms then 0)."""

    dflt = Coefficients()
    lat, spb = [], []
    for by in cfits.values():
        if by:
            big = by[max(by, key=int)]
            lat.append(big["latency_s"])
            spb.append(big["s_per_byte"])
    return {
        "spmm_s_per_nnz_col": kfits.get("spmm_s_per_nnz_col", dflt.spmm_s_per_nnz_col),
        "gemm_s_per_fma": kfits.get("gemm_s_per_fma", dflt.gemm_s_per_fma),
        **{k: kfits.get(k, 0.0) for k in SPMM_TERMS},
        "latency_s": float(np.mean(lat)) if lat else dflt.latency_s,
        "s_per_byte": float(np.mean(spb)) if spb else dflt.s_per_byte,
    }


def read_profile(path: Path | str) -> dict[str, Any]:
    """A system profile file, validated; ValueError naming the file and the problem."""
    try:
        prof = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a text file (byte {e.start} is not UTF-8); a profile "
                         f"is the JSON plexgt profile writes") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    return check_profile(prof, str(path))


def check_profile(prof: Any, where: str) -> dict[str, Any]:
    """Raise ValueError naming ``where`` unless ``prof`` is a system profile this code reads."""
    if not isinstance(prof, dict) or prof.get("format") != FORMAT:
        raise ValueError(f"{where}: not a plexgt system profile (no format {FORMAT!r})")
    if prof.get("version") != VERSION:
        raise ValueError(f"{where}: profile version {prof.get('version')!r}, expected {VERSION}")
    for key in ("kernel_fits", "collective_fits", "plexus"):
        if key not in prof:
            raise ValueError(f"{where}: profile has no {key!r}")
    if not isinstance(prof["plexus"], dict):
        raise ValueError(f"{where}: profile's 'plexus' is not a table of coefficients")
    for k, v in prof["plexus"].items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v < 0:
            raise ValueError(f"{where}: plexus coefficient {k}={v!r} is not a finite number >= 0")
    bad = _bad_number(prof, "")
    if bad:
        raise ValueError(f"{where}: {bad[0]} = {bad[1]!r} is not a finite number >= 0 (every "
                         f"time, size and rate of a profile is)")
    return prof


def _bad_number(node: Any, where: str) -> tuple[str, float] | None:
    """The first number under ``node`` that no measurement gives (infinite, NaN or
    negative: JSON readers take 1e400 as infinity), with its path; None when all are sane."""
    if isinstance(node, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in node.items())
    elif isinstance(node, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(node))
    else:
        if isinstance(node, (int, float)) and not isinstance(node, bool) and not (
                math.isfinite(node) and node >= 0):
            return where, node
        return None
    for path, v in items:
        got = _bad_number(v, path)
        if got:
            return got
    return None
