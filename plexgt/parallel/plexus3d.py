"""3D tensor-parallel GCN (Plexus): Agarwal's 3D matrix multiply applied to GCN layers.

Layer l with roles (a, b, c) (:mod:`plexgt.distributed.layout3d` has every block's shape):

forward
    H [N/Ga, d/(Gb·Gc)] --all-gather over c--> [N/Ga, d/Gb]
    S = Â[rows c, cols a] · H                  local SpMM, in row blocks
    Z = all-reduce of S over a                 each block's all-reduce overlaps the next SpMM
    W [d/(Gb·Gc), d'/Ga] --all-gather over c--> [d/Gb, d'/Ga]
    P = Z · W                                  local GEMM, partial over b
    Y = reduce-scatter of P over b, + bias     [N/Gc, d'/(Ga·Gb)]: the next layer's input
backward (autograd, every collective's adjoint)
    dY --all-gather over b--> dP; dW = Zᵀ·dP --reduce-scatter over c-->; dZ = dP·Wᵀ;
    dS = all-reduce of dZ over a (blocked, overlapped with Âᵀ·dS); dH --reduce-scatter over c-->

gemm_first layers (wide input, narrow output; chosen per layer by ``layer_orders``)
    H --all-gather over c--> [N/Ga, d/Gb];  W --all-gather over c, then a--> [d/Gb, d']
    T = reduce-scatter over b of H·W           [N/Ga, d'/Gb]
    Y = reduce-scatter over a of Â·T, + bias   same output block as above (row blocks overlap)

Plexus all-reduces P over b; only the slice the next layer uses is kept, so a reduce-scatter
moves half the bytes for the same result. Every parameter element lives on exactly one rank
(the bias has copies over c, whose gradients are summed), so no gradient all-reduce follows.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from plexgt.data.loader import PlexusArrays
from plexgt.distributed.collectives import (
    Comm,
    all_gather,
    all_gather_async,
    all_reduce_,
    all_reduce_async,
    reduce_scatter,
    reduce_scatter_async,
    replicated,
    wait,
)
from plexgt.distributed.layout3d import LayerLayout, output_plane, row_blocks
from plexgt.models.layers import Drop, Features, sparse_features
from plexgt.ops.csr import CSRGraph, sparse_csr
from plexgt.ops.gcn import gcn_spmm
from plexgt.ops.precision import autocast_dtype, full_precision
from plexgt.ops.rng import CounterRNG
from plexgt.parallel.operators import (
    gcn_block_values,  # noqa: F401 - plan.measure's, perf's
    operator_block,
)


def _torch_csr(m: sp.csr_matrix, dtype: torch.dtype) -> torch.Tensor:
    m = m.tocsr()
    return sparse_csr(  # indices come sorted and in range from scipy
        torch.from_numpy(m.indptr.astype(np.int64)),
        torch.from_numpy(m.indices.astype(np.int64)),
        torch.from_numpy(m.data).to(dtype),
        m.shape,
    )


def padded_block(block: sp.csr_matrix, shape: tuple[int, int]) -> sp.csr_matrix:
    """``block`` [r, c] in the top-left corner of an all-zero [shape] (r, c <= shape)."""
    if not (block.shape[0] and block.shape[1]):
        return sp.csr_matrix(shape, dtype=np.float64)
    block = block.tocsr()
    return sp.csr_matrix(
        (block.data, block.indices, np.concatenate(
            [block.indptr, np.full(shape[0] - block.shape[0], block.indptr[-1])])),
        shape=shape,
    )


def stacked_block(blocks: Sequence[sp.csr_matrix], shape: tuple[int, int], order: str
                  ) -> sp.csr_matrix:
    """K operators' blocks of one layer as the one block the layer's aggregation multiplies
    (each padded to [rows_pad, cols_pad] = ``shape``): aggregate_first stacks them by rows,
    [K·rows_pad, cols_pad], so one all-reduce over a carries every Op_k·H; gemm_first by
    columns, [rows_pad, K·cols_pad], against the K products H·W_k stacked by rows, so one
    reduce-scatter over a sums Op_k·(H·W_k). One block: itself, padded."""
    if len(blocks) == 1:
        return padded_block(blocks[0], shape)
    parts = [padded_block(b, shape) for b in blocks]
    out = (sp.vstack(parts) if order == "aggregate_first" else sp.hstack(parts)).tocsr()
    out.sort_indices()  # what _torch_csr relies on
    return out


class BlockedAdjacency:
    """One rank's Â block [rows_pad, cols_pad] cut in row blocks, with each block's transpose.

    The blocks bound how much of the aggregate waits for its all-reduce: block k's all-reduce
    runs while block k+1 is multiplied.
    """

    def __init__(self, block: sp.csr_matrix, shape: tuple[int, int], block_rows: int | None,
                 dtype: torch.dtype) -> None:
        full = padded_block(block, shape)
        self.shape = shape
        self.bounds = row_blocks(shape[0], block_rows)
        self.fwd = [_torch_csr(full[r0:r1], dtype) for r0, r1 in self.bounds]
        self.bwd = [_torch_csr(full[r0:r1].T.tocsr(), dtype) for r0, r1 in self.bounds]
        self.nnz = int(full.nnz)


def _spmm(blk: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Â_block · H. Half-precision H (bfloat16 runs) is multiplied in the block's float32, sums
    over each row's neighbours included, and rounded once: CPU sparse kernels have no half
    types, and autocast is off so its mm does not cast the operands back."""
    with full_precision(h.device):
        if h.dtype == blk.dtype:
            return torch.sparse.mm(blk, h)
        return torch.sparse.mm(blk, h.to(blk.dtype)).to(h.dtype)


class _AggregateAllReduce(torch.autograd.Function):
    """Z = all-reduce over a of (Â_block · H), blocked so communication overlaps the SpMM."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, adj: BlockedAdjacency, comm: Comm) -> torch.Tensor:
        ctx.adj, ctx.comm = adj, comm
        out = torch.empty((adj.shape[0], h.shape[1]), dtype=h.dtype, device=h.device)
        handles = []
        for (r0, r1), blk in zip(adj.bounds, adj.fwd):
            out[r0:r1] = _spmm(blk, h) if r1 > r0 else out[r0:r1]
            handles.append(all_reduce_async(out[r0:r1], comm))
        for hd in handles:
            wait(hd, comm)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        adj, comm = ctx.adj, ctx.comm
        g = g.contiguous().clone()
        handles = [all_reduce_async(g[r0:r1], comm) for r0, r1 in adj.bounds]
        dh = torch.zeros((adj.shape[1], g.shape[1]), dtype=g.dtype, device=g.device)
        for (r0, r1), blk_t, hd in zip(adj.bounds, adj.bwd, handles):
            wait(hd, comm)
            if r1 > r0:
                dh += _spmm(blk_t, g[r0:r1])
        return dh, None, None


class _AggregateReduceScatter(torch.autograd.Function):
    """[cols_pad, Ga·w] -> [rows_pad, w]: reduce-scatter over a (dim 1) of (Â_block · T).

    The gemm_first aggregation: T = H·W is already reduced over b, so the partial sums over a
    only need each rank's own column block, half the bytes of an all-reduce. Row block k's
    reduce-scatter runs while block k+1 is multiplied; in backward the all-gathers of all
    blocks are issued first and each block's Âᵀ product starts as soon as its block arrives.
    """

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, adj: BlockedAdjacency, comm: Comm) -> torch.Tensor:
        ctx.adj, ctx.comm = adj, comm
        g = comm.size
        w = t.shape[1] // g
        out = torch.empty((adj.shape[0], w), dtype=t.dtype, device=t.device)
        pending = []
        for (r0, r1), blk in zip(adj.bounds, adj.fwd):
            z = _spmm(blk, t) if r1 > r0 else t.new_zeros(0, g * w)
            # [rb, G·w] -> [G, rb, w]: rank i's chunk is its column block, contiguous
            zt = z.view(r1 - r0, g, w).transpose(0, 1).contiguous()
            pending.append((zt, reduce_scatter_async(zt.view(g * (r1 - r0), w), out[r0:r1],
                                                     comm)))
        for _, hd in pending:
            wait(hd, comm)
        return out

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        adj, comm = ctx.adj, ctx.comm
        g = comm.size
        dy = dy.contiguous()
        w = dy.shape[1]
        pending = []
        for r0, r1 in adj.bounds:
            full = dy.new_empty(g * (r1 - r0), w)
            pending.append((full, all_gather_async(dy[r0:r1], full, comm)))
        dt = dy.new_zeros(adj.shape[1], g * w)
        for (r0, r1), blk_t, (full, hd) in zip(adj.bounds, adj.bwd, pending):
            wait(hd, comm)
            if r1 > r0:
                zb = full.view(g, r1 - r0, w).transpose(0, 1).reshape(r1 - r0, g * w)
                dt += _spmm(blk_t, zb)
        return dt, None, None


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


class Plexus3DGCN(nn.Module):
    """A GCN whose every layer is 3D tensor-parallel; mirrors :class:`plexgt.models.gcn.GCN`,
    and with K operators a layer ``sum_k Op_k·(H W_k) + b`` (the other grid3d models,
    :mod:`plexgt.models.stack`).

    Input: this rank's layer-0 feature shard [ceil(N/Gx), d_0/(Gy·Gz)]. Output: the logits
    shard [ceil(N/Gc_L), d_L/(Ga_L·Gb_L)] of the last layer. ``comms`` maps each axis name to
    its :class:`Comm`; ``adj`` holds each layer's normalised block (already in that layer's
    output x input order), or per layer a sequence of K operator blocks. Each operator's
    weight W_k is sharded as gcn's one weight; the K blocks run as one stacked block
    (:func:`stacked_block`), so each aggregation is still one collective, K times the rows
    (aggregate_first) or the columns' products (gemm_first). ``names``: the reference's
    parameter list of each operator (checkpoint names ``{name}.{l}.weight``).
    """

    def __init__(
        self,
        layouts: Sequence[LayerLayout],
        comms: dict[str, Comm],
        adj: Sequence[sp.csr_matrix | Sequence[sp.csr_matrix]],
        dropout: float = 0.0,
        block_rows: int | None = None,
        dtype: torch.dtype = torch.float32,
        tune_gemm: bool = True,
        seed: int = 0,
        input_dropout: float | None = None,
        node_ids: Sequence[torch.Tensor] | None = None,
        names: Sequence[str] = ("layers",),
    ) -> None:
        super().__init__()
        blocks = [(a,) if sp.issparse(a) else tuple(a) for a in adj]
        if any(len(b) != len(names) for b in blocks):
            raise ValueError(f"each layer needs one block per operator ({len(names)}: "
                             f"{', '.join(names)})")
        self.names = list(names)
        self.layouts = list(layouts)
        self.comms = comms
        self.dropout = dropout
        self.input_dropout = dropout if input_dropout is None else input_dropout
        self.seed = seed
        self.step = 0
        """Training forwards so far: the step key of the dropout masks (checkpointed)."""
        # per layer, the original node id of each input row (the dropout masks' row key);
        # buffers, so .to(device) moves them, not persistent: the data gives them
        self.num_id_layers = len(node_ids or [])
        for l, ids in enumerate(node_ids or []):
            self.register_buffer(f"node_ids_{l}", torch.as_tensor(ids, dtype=torch.int64),
                                 persistent=False)
        self.mm = TunedMatmul(tune_gemm)
        self.adj = []
        for b, lay in zip(blocks, self.layouts):
            stacked = stacked_block(b, (lay.rows_pad, lay.cols_pad), lay.order)
            self.adj.append(BlockedAdjacency(stacked, stacked.shape, block_rows, dtype))
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        # operators 1..K-1: weights only, the same shards as the first operator's
        self.op_weights = nn.ModuleList(nn.ParameterList() for _ in names[1:])
        for lay in self.layouts:
            r0, r1 = lay.in_cols
            c0, c1 = lay.w_cols
            o0, o1 = lay.out_cols
            for plist in (self.weights, *self.op_weights):
                plist.append(nn.Parameter(torch.zeros(r1 - r0, c1 - c0, dtype=dtype)))
            self.biases.append(nn.Parameter(torch.zeros(o1 - o0, dtype=dtype)))

    @torch.no_grad()
    def load_full(self, params: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy this rank's shards out of full (weight [d_out, d_in], bias [d_out]) pairs of
        the first operator (gcn's only one).

        The pairs are nn.Linear's, so a distributed model starts from exactly the reference
        model's initialisation.
        """
        full = {}
        for l, (wf, bf) in enumerate(params):
            full[f"layers.{l}.weight"], full[f"layers.{l}.bias"] = wf.detach(), bf.detach()
        self.load_reference(full)

    @torch.no_grad()
    def load_reference(self, state: dict[str, torch.Tensor]) -> None:
        """Copy this rank's shards out of the reference model's ``state_dict()`` (every
        operator's weights: ``{name}.{l}.weight``, and the biases)."""
        for name, shard in self.from_canonical(state).items():
            self.get_parameter(name).copy_(shard)

    def _operator_weights(self, l: int) -> list[tuple[str, nn.Parameter]]:
        """Layer ``l``'s (local parameter name, shard) of each operator, in operator order."""
        return [(f"weights.{l}", self.weights[l])] + [
            (f"op_weights.{k}.{l}", plist[l]) for k, plist in enumerate(self.op_weights)]

    @torch.no_grad()
    def to_canonical(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's parameter-shaped tensors (the parameters, or an optimizer's moments of
        them), keyed by parameter name -> the single-process GCN's full tensors
        (``layers.{l}.weight`` [d_out, d_in], ``layers.{l}.bias`` [d_out]), identical on every
        rank: what a checkpoint holds, so that any grid can resume it.

        Every rank holds a distinct W block and each bias block has Gc copies (the ic = 0 copy
        counts), so placing the blocks in zeros and summing over the x, y and z axes (all ranks)
        rebuilds the whole tensor exactly (each entry is one rank's value plus zeros).
        """
        out: dict[str, torch.Tensor] = {}
        for l, lay in enumerate(self.layouts):
            b = local[f"biases.{l}"]
            wts = []
            for local_name, _ in self._operator_weights(l):
                wt = b.new_zeros(lay.d_in, lay.d_out)
                wt[slice(*lay.in_cols), slice(*lay.w_cols)] = local[local_name]
                wts.append(wt)
            bp = b.new_zeros(lay.d_out)
            if lay.i[2] == 0:
                bp[slice(*lay.out_cols)] = b
            for axis in ("x", "y", "z"):
                for t in (*wts, bp):
                    all_reduce_(t, self.comms[axis])
            for name, wt in zip(self.names, wts):
                natural = torch.empty_like(wt)
                natural[:, lay.w_column_order] = wt
                out[f"{name}.{l}.weight"] = natural[: lay.d_in_true, : lay.d_out_true].t().cpu()
            out[f"{self.names[0]}.{l}.bias"] = bp[: lay.d_out_true].cpu()
        return out

    @torch.no_grad()
    def from_canonical(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`to_canonical` on any grid: this rank's blocks of full tensors,
        keyed by parameter name, on the parameters' device and dtype."""
        out: dict[str, torch.Tensor] = {}
        for l, (lay, b) in enumerate(zip(self.layouts, self.biases)):
            for name, (local_name, w) in zip(self.names, self._operator_weights(l)):
                wt = torch.zeros(lay.d_in, lay.d_out, dtype=w.dtype)
                wt[: lay.d_in_true, : lay.d_out_true] = full[f"{name}.{l}.weight"].t().to(
                    w.dtype)
                wt = wt[:, lay.w_column_order]
                out[local_name] = wt[slice(*lay.in_cols), slice(*lay.w_cols)].to(w.device)
            bp = torch.zeros(lay.d_out, dtype=b.dtype)
            bp[: lay.d_out_true] = full[f"{self.names[0]}.{l}.bias"].to(b.dtype)
            out[f"biases.{l}"] = bp[slice(*lay.out_cols)].to(b.device)
        return out

    def _dropout(self, h: Features, lay: LayerLayout) -> Features:
        """Dropout at the reference GCN's site (the layer index), keyed on the block's node ids
        and global columns: the entries the single-process model drops, on any grid (sparse
        input: its stored entries, at their gathered columns)."""
        p = self.input_dropout if lay.layer == 0 else self.dropout
        if not self.training or p <= 0:
            return h
        if self.num_id_layers != len(self.layouts):
            raise ValueError("dropout needs each layer's node ids (Plexus3DGCN(node_ids=...))")
        rng = CounterRNG(self.seed, self.step, getattr(self, f"node_ids_{lay.layer}"))
        col0 = lay.gathered_cols[0] if isinstance(h, CSRGraph) else lay.in_cols[0]
        return Drop(rng, p, lay.layer).features(h, col0)

    def layer(self, h: Features, l: int) -> torch.Tensor:
        """[N/Ga, d_in/(Gb·Gc)] -> [N/Gc, d_out/(Ga·Gb)] in the layer's order (layout3d).

        A sparse h (layer 0 of CSR-stored features) is read already gathered over c,
        [N/Ga, d_in/Gb]: a constant input needs no all-gather, and H·W runs as an SpMM in the
        gemm_first order (Â·H would be a sparse-sparse product). With K operators the K
        products H·W_k (gemm_first) or aggregates Op_k·H (aggregate_first) are stacked by
        rows, as the layer's stacked block expects."""
        lay = self.layouts[l]
        a, b, c = lay.roles
        ws = [w for _, w in self._operator_weights(l)]
        if isinstance(h, CSRGraph) or lay.order == "gemm_first":
            if isinstance(h, CSRGraph) and lay.order != "gemm_first":
                raise ValueError("sparse input features need layer 0 in the gemm_first order")
            # W [d_in/Gb, d_out] whole on every rank of the ac plane; T = H·W partial over b
            wg = [all_gather(all_gather(w, self.comms[c], dim=0), self.comms[a], dim=1)
                  for w in ws]
            if isinstance(h, CSRGraph):
                prods = [gcn_spmm(h, w) for w in wg]
            else:
                hg = all_gather(h, self.comms[c], dim=1)
                prods = [_TunedMM.apply(hg, w, self.mm) for w in wg]
            t = reduce_scatter(prods[0] if len(prods) == 1 else torch.cat(prods),
                               self.comms[b], dim=1)
            y = _AggregateReduceScatter.apply(t, self.adj[l], self.comms[a])
            return y + replicated(self.biases[l], self.comms[c]).to(y.dtype)
        hg = all_gather(h, self.comms[c], dim=1)
        z = _AggregateAllReduce.apply(hg, self.adj[l], self.comms[a])
        r = lay.rows_pad
        p = None
        for k, w in enumerate(ws):
            pk = _TunedMM.apply(z[k * r:(k + 1) * r] if len(ws) > 1 else z,
                                all_gather(w, self.comms[c], dim=0), self.mm)
            p = pk if p is None else p + pk
        y = reduce_scatter(p, self.comms[b], dim=1)
        return y + replicated(self.biases[l], self.comms[c]).to(y.dtype)

    def _apply(self, fn: Any, recurse: bool = True) -> Plexus3DGCN:
        """``.to(device)``, ``.double()`` and the like reach the adjacency blocks too: they are
        plain lists of sparse tensors, which nn.Module would skip (and a GPU run would then
        multiply CPU blocks with device features)."""
        super()._apply(fn, recurse)
        for a in self.adj:
            a.fwd = [fn(m) for m in a.fwd]
            a.bwd = [fn(m) for m in a.bwd]
        return self

    def forward(self, x: Features) -> torch.Tensor:
        h: Features = x
        for l, lay in enumerate(self.layouts):
            h = self.layer(self._dropout(h, lay), l)
            if l < len(self.layouts) - 1:
                h = torch.relu(h)
        if self.training:
            self.step += 1
        return h


@dataclass
class PlexusInputs:
    """One rank's tensors for an L-layer 3D-parallel GCN, from the loader's
    :class:`~plexgt.data.loader.PlexusArrays`.

    x [ceil(N/Gx), d_0/(Gy·Gz)] (Q order); per layer the normalised Â block (scipy, cut into
    row blocks by :class:`BlockedAdjacency`), or with several operators a tuple of their
    blocks; labels and split masks of the last layer's output rows [ceil(N/Gc_L)] in its
    output order.
    """

    adj: list[Any]
    x: Features
    """Dense, or (CSR-stored features) a weighted CSRGraph already gathered over layer 0's
    role c: [ceil(N/Ga), d_0/Gb]."""
    labels: torch.Tensor
    masks: dict[str, torch.Tensor]
    rows: tuple[int, int]
    """The last layer's output rows the labels and masks cover."""
    order: str
    """Their order: 'P' or 'Q'."""
    bytes_read: int = 0
    node_ids: list[torch.Tensor] = dataclasses.field(default_factory=list)
    """Per layer [ceil(N/Ga)]: original node id of each input row (the dropout key)."""

    @classmethod
    def from_arrays(cls, arrays: PlexusArrays, dtype: torch.dtype,
                    operators: Sequence[str] = ("gcn",),
                    out_ids: Sequence[np.ndarray] | None = None) -> PlexusInputs:
        """``operators``: each layer's graph operators (:mod:`plexgt.parallel.operators`),
        one block each (a tuple of them where there are several); ``out_ids``: per layer the
        original ids of its output rows, which the identity ('self') reads (the input rows'
        are ``arrays.node_ids``)."""
        outs = list(out_ids) if out_ids is not None else [None] * len(arrays.blocks)
        adj: list[Any] = []
        for (a, dr, dc), oid, iid in zip(arrays.blocks, outs, arrays.node_ids or outs):
            ops = tuple(operator_block(op, a, dr, dc, oid, iid) for op in operators)
            adj.append(ops[0] if len(ops) == 1 else ops)
        t = arrays.targets
        x = arrays.features
        xt = (sparse_features(x, dtype=dtype) if sp.issparse(x)
              else torch.from_numpy(x).to(dtype))
        return cls(adj, xt,
                   torch.from_numpy(t.labels), {k: torch.from_numpy(m) for k, m in t.masks.items()},
                   arrays.rows, arrays.order, arrays.bytes_read,
                   [torch.from_numpy(i) for i in arrays.node_ids])


def plexus_comms(groups: Any, ledger: Any, last: LayerLayout) -> dict[str, Comm]:
    """Comm per axis from a :class:`~plexgt.distributed.grid.GridGroups`, plus 'plane': the group of
    the last layer's class shards (roles a and b)."""

    comms = {a: Comm.from_group(groups.axis[a], a, ledger) for a in ("x", "y", "z")}
    plane = output_plane(last.roles)
    comms["plane"] = Comm.from_group(groups.plane[plane], plane, ledger)
    return comms
