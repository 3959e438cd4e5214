"""The blocks a 3D-parallel GCN holds beside its Â blocks: the identity's (node-wise layers,
residuals), constant identity weights, and the shards of weights and per-feature vectors with
their canonical (single-process) forms.

A node-wise map H·W has no Â, but its output must still land in the next layer's layout
(rows over c in the output order, where the input rows are over a in the input order). So it
runs as a GCN layer whose Â block is the identity's block [rows over c, cols over a]: entry
(i, j) = 1 where output row i and input row j are the same node (:func:`identity_block`,
from both sides' node ids, no permutation read whole). The layer's collectives then move
every row to its place, exactly (each output row has one nonzero, so the all-reduce over a
adds zeros to it).

Shards (:mod:`plexgt.distributed.layout3d`): a weight's block [d_in/(Gb·Gc), d_out/Ga] of
the padded W [d_in, d_out] (columns in the layout's ``w_column_order``); a per-feature
vector (bias, norm parameters and running statistics) the output block d_out/(Ga·Gb),
copies over c.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from plexgt.distributed.collectives import Comm, all_reduce_
from plexgt.distributed.layout3d import LayerLayout
from plexgt.ops.precision import autocast_dtype

Tensor = torch.Tensor


def identity_block(out_ids: np.ndarray, in_ids: np.ndarray, n: int) -> sp.csr_matrix:
    """[len(out_ids), len(in_ids)] 0/1: (i, j) = 1 where ``out_ids[i] == in_ids[j] < n``
    (padding ids, >= n and distinct on each side, map nothing)."""
    common, i, j = np.intersect1d(np.asarray(out_ids), np.asarray(in_ids), assume_unique=True,
                                  return_indices=True)
    keep = common < n
    return sp.csr_matrix((np.ones(int(keep.sum())), (i[keep], j[keep])),
                         shape=(len(out_ids), len(in_ids)))


def padded_block(m: sp.csr_matrix, shape: tuple[int, int]) -> sp.csr_matrix:
    """``m`` [r, c] as the top-left block of zeros ``shape`` (r, c <= shape)."""
    m = sp.csr_matrix(m, dtype=np.float64)
    out = sp.csr_matrix(shape, dtype=np.float64)
    if m.nnz:
        coo = m.tocoo()
        out = sp.csr_matrix((coo.data, (coo.row, coo.col)), shape=shape)
    return out


def gathered_weight(lay: LayerLayout, wt: Tensor) -> Tensor:
    """The block of a padded Wᵀ-shaped [d_in, d_out] (natural columns) that the layer
    multiplies by after its weight all-gathers: [d_in/Gb, d_out/Ga] (aggregate_first:
    gathered over c) or [d_in/Gb, d_out] (gemm_first: over c, then a), columns in
    ``w_column_order`` as the gathers leave them."""
    wt = wt[:, lay.w_column_order]
    rows = slice(*lay.gathered_cols)
    if lay.order == "gemm_first":
        return wt[rows]
    return wt[rows, slice(*lay.w_cols)]


def identity_weight(lay: LayerLayout, dtype: torch.dtype) -> Tensor:
    """The gathered block (:func:`gathered_weight`) of the padded identity [d_in, d_out]
    (1 on the first min(d_in_true, d_out_true) diagonal entries): a constant weight, built
    where it is used, so no collective moves it."""
    eye = torch.zeros(lay.d_in, lay.d_out, dtype=dtype)
    k = min(lay.d_in_true, lay.d_out_true)
    eye[torch.arange(k), torch.arange(k)] = 1
    return gathered_weight(lay, eye)


def stacked_rows(lay: LayerLayout, stack: int, d: int) -> Tensor:
    """For an input of ``stack`` blocks side by side (jumping knowledge 'cat': each rank
    holds its w columns of every layer's width-d output, concatenated), the true input
    column of each padded row of W [d_in = stack·d_pad, ...] as the layer splits it (-1:
    padding): row blk·(stack·w) + i·w + j is column i·d + blk·w + j of the concatenation,
    so the shard of rank block blk holds exactly its columns of every layer, in the order
    its concatenation has them."""
    w = lay.d_in // (lay.g[1] * lay.g[2]) // stack
    r = torch.arange(lay.d_in)
    blk, rem = r // (stack * w), r % (stack * w)
    col = blk * w + rem % w
    return torch.where(col < d, (rem // w) * d + col, torch.full_like(r, -1))


def weight_shard(lay: LayerLayout, full: Tensor, like: Tensor, rows: Tensor | None = None
                 ) -> Tensor:
    """This rank's shard of an nn.Linear weight ``full`` [d_out, d_in] (true widths), on
    ``like``'s device and dtype (``rows``: W's rows in :func:`stacked_rows`' order)."""
    wt = torch.zeros(lay.d_in, lay.d_out, dtype=like.dtype)
    if rows is None:
        wt[: lay.d_in_true, : lay.d_out_true] = full.t().to(like.dtype)
    else:
        keep = rows >= 0
        wt[keep, : lay.d_out_true] = full.t()[rows[keep]].to(like.dtype)
    wt = wt[:, lay.w_column_order]
    return wt[slice(*lay.in_cols), slice(*lay.w_cols)].to(like.device)


def weight_full(lay: LayerLayout, w: Tensor, comms: dict[str, Comm],
                rows: Tensor | None = None) -> Tensor:
    """The inverse of :func:`weight_shard` (collective over the grid): every rank's distinct
    block placed in zeros and summed over the x, y and z axes -> [d_out, d_in] on the CPU."""
    wt = w.new_zeros(lay.d_in, lay.d_out)
    wt[slice(*lay.in_cols), slice(*lay.w_cols)] = w
    _sum_grid(wt, comms)
    natural = torch.empty_like(wt)
    natural[:, lay.w_column_order] = wt
    if rows is None:
        return natural[: lay.d_in_true, : lay.d_out_true].t().cpu()
    out = natural.new_zeros(lay.d_in_true, lay.d_out_true)
    keep = rows >= 0
    out[rows[keep]] = natural[keep, : lay.d_out_true]
    return out.t().cpu()


def vector_shard(lay: LayerLayout, full: Tensor, like: Tensor) -> Tensor:
    """This rank's block of a per-output-feature vector ``full`` [d_out_true]: the output
    columns ``out_cols`` of the padded [d_out]; of ``stack`` such outputs side by side
    ([stack·d_out_true], jumping knowledge 'cat'), each one's block, concatenated."""
    d = lay.d_out_true
    stack = full.shape[0] // d
    parts = []
    for i in range(stack):
        v = torch.zeros(lay.d_out, dtype=like.dtype)
        v[:d] = full[i * d:(i + 1) * d].to(like.dtype)
        parts.append(v[slice(*lay.out_cols)])
    return torch.cat(parts).to(like.device)


def vector_full(lay: LayerLayout, v: Tensor, comms: dict[str, Comm]) -> Tensor:
    """The inverse of :func:`vector_shard` (collective): the copy at ic = 0 of each block
    placed in zeros and summed over the grid -> [stack·d_out_true] on the CPU."""
    w = lay.out_cols[1] - lay.out_cols[0]
    parts = []
    for i in range(v.shape[0] // w):
        out = v.new_zeros(lay.d_out)
        if lay.i[2] == 0:
            out[slice(*lay.out_cols)] = v[i * w:(i + 1) * w]
        _sum_grid(out, comms)
        parts.append(out[: lay.d_out_true])
    return torch.cat(parts).cpu()


def _sum_grid(t: Tensor, comms: dict[str, Comm]) -> None:
    for axis in ("x", "y", "z"):
        all_reduce_(t, comms[axis])


def column_mask(lay: LayerLayout, device: torch.device | str = "cpu") -> Tensor:
    """[d_out/(Ga·Gb)] true where the output column held is one of the d_out_true."""
    c0, c1 = lay.out_cols
    return torch.arange(c0, c1, device=device) < lay.d_out_true


def row_mask(lay: LayerLayout, device: torch.device | str = "cpu") -> Tensor:
    """[rows_pad] true on the output rows that are nodes (not padding)."""
    r0, r1 = lay.rows
    return torch.arange(lay.rows_pad, device=device) < r1 - r0


def stacked(parts: Sequence[sp.csr_matrix], how: str) -> sp.csr_matrix:
    """Blocks side by side ('h'), one over the other ('v') or on the diagonal ('diag')."""
    if how == "h":
        out = sp.hstack(parts, format="csr")
    elif how == "v":
        out = sp.vstack(parts, format="csr")
    else:
        out = sp.block_diag(parts, format="csr")
    out.sort_indices()  # what the torch CSR conversion relies on
    return out


class TunedMatmul:
    """Chooses, per GEMM shape, between ``a @ b`` and ``(bᵀ @ aᵀ)ᵀ`` by timing both once.

    BLAS speed depends on the operands' memory order and aspect ratio; which form wins differs
    between forward (Z·W), input-gradient (dP·Wᵀ) and weight-gradient (Zᵀ·dP) shapes. The two
    forms round differently and the choice is timed, so a loaded machine can choose otherwise
    in a resumed run: ``enabled=False`` (deterministic runs) always takes ``a @ b``.
    """

    def __init__(self, enabled: bool = True, repeats: int = 2) -> None:
        self.enabled = enabled
        self.repeats = repeats
        self.choice: dict[tuple[Any, ...], int] = {}

    @staticmethod
    def _forms() -> list[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
        return [lambda a, b: a @ b, lambda a, b: (b.t() @ a.t()).t()]

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return a @ b
        key = (tuple(a.shape), tuple(b.shape), a.stride(), b.stride(), a.dtype, a.device.type)
        forms = self._forms()
        if key not in self.choice:
            # on a GPU: each form once untimed (library handles, kernel selection), and
            # synchronised boundaries, so the kernels are timed rather than their launches
            gpu = a.device.type == "cuda"
            best, best_t = 0, float("inf")
            for i, f in enumerate(forms):
                if gpu:
                    f(a, b)
                    torch.cuda.synchronize(a.device)
                t0 = time.perf_counter()
                for _ in range(self.repeats):
                    f(a, b)
                if gpu:
                    torch.cuda.synchronize(a.device)
                t = time.perf_counter() - t0
                if t < best_t:
                    best, best_t = i, t
            self.choice[key] = best
        return forms[self.choice[key]](a, b)


class _TunedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, mm: TunedMatmul) -> torch.Tensor:
        cd = autocast_dtype(a.device)
        if cd is not None:
            # mixed precision: both operands in the autocast dtype, saved so, so the backward
            # (which runs outside autocast) multiplies matching dtypes; the float32 master's
            # gradient is cast back by autograd
            a, b = a.to(cd), b.to(cd)
        ctx.save_for_backward(a, b)
        ctx.mm = mm
        return mm(a, b)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        a, b = ctx.saved_tensors
        da = ctx.mm(g, b.t()) if ctx.needs_input_grad[0] else None
        db = ctx.mm(a.t(), g) if ctx.needs_input_grad[1] else None
        return da, db, None
