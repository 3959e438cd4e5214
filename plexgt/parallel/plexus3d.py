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
from collections.abc import Sequence
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
    all_reduce_async,
    reduce_scatter,
    reduce_scatter_async,
    replicated,
    wait,
)
from plexgt.distributed.layout3d import LayerLayout, output_plane, row_blocks
from plexgt.models.gcn import PLAIN, GCNArch, GCNOp
from plexgt.models.layers import Drop, Features, make_norm, sparse_features
from plexgt.ops.csr import CSRGraph, sparse_csr
from plexgt.ops.gcn import gcn_spmm, inv_sqrt_degrees
from plexgt.ops.precision import full_precision
from plexgt.ops.rng import CounterRNG
from plexgt.parallel.norms import batch_norm_rows, layer_norm_cols
from plexgt.parallel.plexus_blocks import (
    TunedMatmul,
    _TunedMM,
    column_mask,
    identity_block,
    identity_weight,
    padded_block,
    row_mask,
    stacked,
    vector_full,
    vector_shard,
    weight_full,
    weight_shard,
)


def gcn_block_values(adj: sp.csr_matrix, deg_rows: np.ndarray, deg_cols: np.ndarray
                     ) -> sp.csr_matrix:
    """The block of Â = D^-1/2 A D^-1/2 given the pattern block and both sides' degrees."""
    a = adj.tocsr().astype(np.float64)
    r = np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))
    a.data = (inv_sqrt_degrees(deg_rows)[r] * inv_sqrt_degrees(deg_cols)[a.indices]).numpy()
    return a


def _torch_csr(m: sp.csr_matrix, dtype: torch.dtype) -> torch.Tensor:
    m = m.tocsr()
    return sparse_csr(  # indices come sorted and in range from scipy
        torch.from_numpy(m.indptr.astype(np.int64)),
        torch.from_numpy(m.indices.astype(np.int64)),
        torch.from_numpy(m.data).to(dtype),
        m.shape,
    )


class BlockedAdjacency:
    """One rank's Â block [rows_pad, cols_pad] cut in row blocks, with each block's transpose.

    The blocks bound how much of the aggregate waits for its all-reduce: block k's all-reduce
    runs while block k+1 is multiplied.
    """

    def __init__(self, block: sp.csr_matrix, shape: tuple[int, int], block_rows: int | None,
                 dtype: torch.dtype) -> None:
        full = sp.csr_matrix(shape, dtype=np.float64)
        if block.shape[0] and block.shape[1]:
            full = sp.csr_matrix(
                (block.data, block.indices, np.concatenate(
                    [block.indptr, np.full(shape[0] - block.shape[0], block.indptr[-1])])),
                shape=shape,
            )
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


def plain_ops(layouts: Sequence[LayerLayout]) -> list[GCNOp]:
    """The Kipf & Welling chain of ``layouts``: a GCN layer each, ReLU between them."""
    last = len(layouts) - 1
    return [GCNOp("conv", f"layers.{l}", lay.d_in_true, lay.d_out_true, post_act=l < last)
            for l, lay in enumerate(layouts)]


class Plexus3DGCN(nn.Module):
    """A GCN whose every op is 3D tensor-parallel; mirrors :class:`plexgt.models.gcn.GCN`.

    Input: this rank's op-0 feature shard [ceil(N/Gx), d_0/(Gy·Gz)]. Output: the logits
    shard [ceil(N/Gc_L), d_L/(Ga_L·Gb_L)] of the last op. ``comms`` maps each axis and plane
    name to its :class:`Comm` (:func:`plexus_comms`); ``adj`` holds each conv op's normalised
    block (already in that layer's output x input order; None for a node-wise op).

    ``ops`` (:func:`plexgt.models.gcn.gcn_ops`; default the plain chain of ``layouts``) with
    ``arch`` say what each op adds. A node-wise op ('linear': the input projection, the
    classifier) and a conv's residual path run through the identity's block
    (:mod:`plexgt.parallel.plexus_blocks`), which needs every op's input node ids
    (``node_ids``) and the last op's output ids (``out_ids``). A residual is fused into its
    conv's collectives: aggregate_first aggregates [Â; I] (post-norm: one input) or
    diag(Â, I) (pre-norm: the raw input beside the transformed one) in one blocked
    all-reduce, both products meet before the one reduce-scatter over b; gemm_first
    reduce-scatters X·W and X·W_r over b, then [Â | I] aggregates both in one reduce-scatter
    over a. Norms: :mod:`plexgt.parallel.norms` over the plane (a, b) that splits a row's
    features (LayerNorm) or the axis c that splits the rows (BatchNorm); their parameters, as
    a bias, have copies over c.
    """

    def __init__(
        self,
        layouts: Sequence[LayerLayout],
        comms: dict[str, Comm],
        adj: Sequence[sp.csr_matrix | None],
        dropout: float = 0.0,
        block_rows: int | None = None,
        dtype: torch.dtype = torch.float32,
        tune_gemm: bool = True,
        seed: int = 0,
        input_dropout: float | None = None,
        node_ids: Sequence[torch.Tensor] | None = None,
        ops: Sequence[GCNOp] | None = None,
        arch: GCNArch = PLAIN,
        out_ids: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.layouts = list(layouts)
        self.ops = list(ops) if ops is not None else plain_ops(self.layouts)
        if len(self.ops) != len(self.layouts) or any(
                (op.kind == "linear") != (lay.kind == "linear")
                for op, lay in zip(self.ops, self.layouts)):
            raise ValueError("ops and layouts disagree (count or kinds)")
        self.arch = arch
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
        self.adj = [BlockedAdjacency(*self._operator(l, a, node_ids, out_ids), block_rows, dtype)
                    for l, a in enumerate(adj)]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        self.res_weights = nn.ParameterDict()
        self.res_biases = nn.ParameterDict()
        for l, (op, lay) in enumerate(zip(self.ops, self.layouts)):
            r0, r1 = lay.in_cols
            c0, c1 = lay.w_cols
            o0, o1 = lay.out_cols
            self.weights.append(nn.Parameter(torch.zeros(r1 - r0, c1 - c0, dtype=dtype)))
            self.biases.append(nn.Parameter(torch.zeros(o1 - o0, dtype=dtype)))
            if op.residual == "linear":
                self.res_weights[str(l)] = nn.Parameter(torch.zeros(r1 - r0, c1 - c0,
                                                                    dtype=dtype))
                self.res_biases[str(l)] = nn.Parameter(torch.zeros(o1 - o0, dtype=dtype))
            elif op.residual == "identity":
                self.register_buffer(f"res_eye_{l}", identity_weight(lay, dtype),
                                     persistent=False)
        # norm j normalises the output of op norm_at[j] (post-norm: its own op's; pre-norm:
        # the previous op's, which is its op's input)
        at: dict[int, int] = {}
        for l, op in enumerate(self.ops):
            if op.post_norm is not None:
                at[op.post_norm] = l
            if op.pre_norm is not None:
                at[op.pre_norm] = l - 1
        self.norm_at = [at[j] for j in range(len(at))]
        self.norms = nn.ModuleList(
            make_norm(arch.norm, _width(self.layouts[l].out_cols)).to(dtype)
            for l in self.norm_at)

    def _operator(self, l: int, a: sp.csr_matrix | None,
                  node_ids: Sequence[torch.Tensor] | None, out_ids: torch.Tensor | None
                  ) -> tuple[sp.csr_matrix, tuple[int, int]]:
        """Op l's sparse operator and its shape: Â's block, the identity's (node-wise op), or
        both stacked as the residual fuses them (class docstring)."""
        op, lay = self.ops[l], self.layouts[l]
        shape = (lay.rows_pad, lay.cols_pad)
        if op.kind == "conv" and op.residual == "none":
            assert a is not None, f"op {l} is a GCN layer without its Â block"
            return a, shape
        if node_ids is None or len(node_ids) != len(self.layouts) or (
                out_ids is None and l == len(self.layouts) - 1):
            raise ValueError("node-wise layers and residuals need every layer's input node "
                             "ids and the last layer's output ids (node_ids=, out_ids=)")
        after = out_ids if l == len(self.layouts) - 1 else node_ids[l + 1]
        eye = identity_block(np.asarray(after), np.asarray(node_ids[l]), lay.n)
        if op.kind == "linear":
            return eye, shape
        assert a is not None, f"op {l} is a GCN layer without its Â block"
        ahat = padded_block(a, shape)
        r, c = shape
        if lay.order == "gemm_first":
            return stacked([ahat, eye], "h"), (r, 2 * c)
        if op.pre_act:
            return stacked([ahat, eye], "diag"), (2 * r, 2 * c)
        return stacked([ahat, eye], "v"), (2 * r, c)

    @torch.no_grad()
    def load_full(self, params: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy this rank's shards out of full (weight [d_out, d_in], bias [d_out]) pairs, one
        per GCN layer of the plain chain (the reference's ``layers``), so a distributed model
        starts from exactly the reference model's initialisation."""
        full = {}
        for l, (wf, bf) in enumerate(params):
            full[f"layers.{l}.weight"], full[f"layers.{l}.bias"] = wf.detach(), bf.detach()
        self.load_reference(full)

    @torch.no_grad()
    def load_reference(self, state: dict[str, torch.Tensor]) -> None:
        """Copy this rank's shards of every tensor of a reference GCN's ``state_dict()``
        (parameters and norm statistics)."""
        mine = self.state_dict()
        for name, shard in self.from_canonical(state).items():
            mine[name].copy_(shard)

    def _canonical_name(self, name: str) -> tuple[str, LayerLayout | None, str]:
        """Local parameter or buffer name -> (the reference's name, the layout its shard is
        cut from (None: replicated as is), 'weight' or 'vector')."""
        group, _, rest = name.partition(".")
        if group in ("weights", "biases", "res_weights", "res_biases"):
            l = int(rest)
            op = self.ops[l]
            kind = "weight" if group.endswith("weights") else "vector"
            if group.startswith("res_"):
                i = op.name.split(".")[1]
                return f"residuals.{i}.{kind if kind == 'weight' else 'bias'}", \
                    self.layouts[l], kind
            return f"{op.name}.{'weight' if kind == 'weight' else 'bias'}", \
                self.layouts[l], kind
        if group == "norms":
            j, _, field = rest.partition(".")
            if field == "num_batches_tracked":
                return name, None, "vector"
            return name, self.layouts[self.norm_at[int(j)]], "vector"
        raise KeyError(f"no canonical form for {name}")

    @torch.no_grad()
    def to_canonical(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's parameter-shaped tensors (the parameters and norm statistics, or an
        optimizer's moments of the parameters), keyed by local name -> the single-process
        GCN's full tensors (``layers.{l}.weight`` [d_out, d_in], ``layers.{l}.bias``
        [d_out], ``norms.{j}.running_mean``, ...), identical on every rank: what a
        checkpoint holds, so that any grid can resume it.

        Every rank holds a distinct W block and each vector block has Gc copies (the ic = 0
        copy counts), so placing the blocks in zeros and summing over the x, y and z axes (all
        ranks) rebuilds the whole tensor exactly (each entry is one rank's value plus zeros).
        Collective: every rank passes the same names in the same order."""
        out: dict[str, torch.Tensor] = {}
        for name, t in local.items():
            full, lay, kind = self._canonical_name(name)
            if lay is None:
                out[full] = t.detach().cpu()
            elif kind == "weight":
                out[full] = weight_full(lay, t.detach(), self.comms)
            else:
                out[full] = vector_full(lay, t.detach(), self.comms)
        return out

    @torch.no_grad()
    def from_canonical(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`to_canonical` on any grid: this rank's blocks of the full
        tensors in ``full`` (parameters; norm statistics where given), keyed by local name,
        on the local tensors' device and dtype."""
        out: dict[str, torch.Tensor] = {}
        for name, t in self.state_dict().items():
            key, lay, kind = self._canonical_name(name)
            if key not in full:
                continue
            if lay is None:
                out[name] = full[key].to(t.device, t.dtype)
            elif kind == "weight":
                out[name] = weight_shard(lay, full[key], t)
            else:
                out[name] = vector_shard(lay, full[key], t)
        return out

    def _dropout(self, h: Features, lay: LayerLayout) -> Features:
        """Dropout at the reference GCN's site (the op index), keyed on the block's node ids
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

    def _gather_weight(self, w: torch.Tensor, lay: LayerLayout) -> torch.Tensor:
        """A weight shard gathered as the layer multiplies by it: over c (aggregate_first),
        then over a too (gemm_first)."""
        a, _, c = lay.roles
        wg = all_gather(w, self.comms[c], dim=0)
        return all_gather(wg, self.comms[a], dim=1) if lay.order == "gemm_first" else wg

    def _residual_weight(self, l: int) -> torch.Tensor:
        if self.ops[l].residual == "linear":
            return self._gather_weight(self.res_weights[str(l)], self.layouts[l])
        return getattr(self, f"res_eye_{l}")

    def _mm(self, h: Features, w: torch.Tensor) -> torch.Tensor:
        return gcn_spmm(h, w) if isinstance(h, CSRGraph) else _TunedMM.apply(h, w, self.mm)

    def _bias(self, l: int, like: torch.Tensor) -> torch.Tensor:
        """Op l's bias (and its residual's), summed over its copies over c in backward."""
        c = self.comms[self.layouts[l].roles[2]]
        b = self.biases[l]
        if self.ops[l].residual != "linear":
            return replicated(b, c).to(like.dtype)
        both = replicated(torch.cat([b, self.res_biases[str(l)]]), c)
        return (both[: b.shape[0]] + both[b.shape[0]:]).to(like.dtype)

    def layer(self, h: Features, l: int, res: torch.Tensor | None = None) -> torch.Tensor:
        """[N/Ga, d_in/(Gb·Gc)] -> [N/Gc, d_out/(Ga·Gb)] in the layer's order (layout3d),
        plus the residual path of ``res`` (the same layout; ``h`` itself post-norm).

        A sparse h (layer 0 of CSR-stored features) is read already gathered over c,
        [N/Ga, d_in/Gb]: a constant input needs no all-gather, and H·W runs as an SpMM in the
        gemm_first order (Â·H would be a sparse-sparse product)."""
        lay = self.layouts[l]
        a, b, c = lay.roles
        sparse = isinstance(h, CSRGraph)
        if sparse and lay.order != "gemm_first":
            raise ValueError("sparse input features need layer 0 in the gemm_first order")
        hg = h if sparse else all_gather(h, self.comms[c], dim=1)
        rg = None if res is None else hg if res is h else all_gather(res, self.comms[c], dim=1)
        if lay.order == "gemm_first":
            # W [d_in/Gb, d_out] whole on every rank of the ac plane; T = H·W partial over b
            t = reduce_scatter(self._mm(hg, self._gather_weight(self.weights[l], lay)),
                               self.comms[b], dim=1)
            if rg is not None:
                tr = reduce_scatter(self._mm(rg, self._residual_weight(l)), self.comms[b],
                                    dim=1)
                t = torch.cat([t, tr])
            y = _AggregateReduceScatter.apply(t, self.adj[l], self.comms[a])
            return y + self._bias(l, y)
        assert isinstance(hg, torch.Tensor)
        rows = lay.rows_pad
        if rg is None:
            z = _AggregateAllReduce.apply(hg, self.adj[l], self.comms[a])
        else:
            both = _AggregateAllReduce.apply(hg if rg is hg else torch.cat([hg, rg]),
                                             self.adj[l], self.comms[a])
            z, zr = both[:rows], both[rows:]
        w = all_gather(self.weights[l], self.comms[c], dim=0)
        p = _TunedMM.apply(z, w, self.mm)
        if rg is not None:
            p = p + _TunedMM.apply(zr, self._residual_weight(l), self.mm)
        y = reduce_scatter(p, self.comms[b], dim=1)
        return y + self._bias(l, y)

    def _norm(self, j: int, h: torch.Tensor) -> torch.Tensor:
        """Norm j of the output layout of op ``norm_at[j]`` (:mod:`plexgt.parallel.norms`)."""
        lay = self.layouts[self.norm_at[j]]
        mod = self.norms[j]
        if isinstance(mod, nn.Identity):
            return h
        c = self.comms[lay.roles[2]]
        k = mod.weight.shape[0]
        wb = replicated(torch.cat([mod.weight, mod.bias]), c)
        w, bias = wb[:k], wb[k:]
        if isinstance(mod, nn.LayerNorm):
            return layer_norm_cols(h, w, bias, column_mask(lay, h.device), lay.d_out_true,
                                   self.comms[output_plane(lay.roles)], mod.eps)
        return batch_norm_rows(h, mod, row_mask(lay, h.device), lay.n, c, w, bias)

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
        hidden: list[torch.Tensor] = []
        for l, (op, lay) in enumerate(zip(self.ops, self.layouts)):
            if op.name == "head" and hidden:
                raise NotImplementedError("jumping knowledge on the 3D grid")
            raw = h
            if op.pre_norm is not None:
                assert isinstance(h, torch.Tensor)
                h = self._norm(op.pre_norm, h)
            if op.pre_act:
                h = torch.relu(h)  # type: ignore[arg-type]
            h = self._dropout(h, lay)
            res = None
            if op.residual != "none":
                assert isinstance(raw, torch.Tensor) or not op.pre_act
                res = raw if op.pre_act else h
            y = self.layer(h, l, res)  # type: ignore[arg-type]
            if op.post_norm is not None:
                y = self._norm(op.post_norm, y)
            if op.post_act:
                y = torch.relu(y)
            if op.jk:
                hidden.append(y)
            h = y
        if self.training:
            self.step += 1
        assert isinstance(h, torch.Tensor)
        return h


@dataclass
class PlexusInputs:
    """One rank's tensors for an L-layer 3D-parallel GCN, from the loader's
    :class:`~plexgt.data.loader.PlexusArrays`.

    x [ceil(N/Gx), d_0/(Gy·Gz)] (Q order); per layer the normalised Â block (scipy, cut into
    row blocks by :class:`BlockedAdjacency`; None for a node-wise layer); labels and split
    masks of the last layer's output rows [ceil(N/Gc_L)] in its output order.
    """

    adj: list[sp.csr_matrix | None]
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
    out_ids: torch.Tensor | None = None
    """[ceil(N/Gc_L)]: original node id of each of the last layer's output rows."""

    @classmethod
    def from_arrays(cls, arrays: PlexusArrays, dtype: torch.dtype) -> PlexusInputs:
        adj = [None if b is None else gcn_block_values(*b) for b in arrays.blocks]
        t = arrays.targets
        x = arrays.features
        xt = (sparse_features(x, dtype=dtype) if sp.issparse(x)
              else torch.from_numpy(x).to(dtype))
        return cls(adj, xt,
                   torch.from_numpy(t.labels), {k: torch.from_numpy(m) for k, m in t.masks.items()},
                   arrays.rows, arrays.order, arrays.bytes_read,
                   [torch.from_numpy(i) for i in arrays.node_ids],
                   None if arrays.out_ids is None else torch.from_numpy(arrays.out_ids))


def plexus_comms(groups: Any, ledger: Any, last: LayerLayout) -> dict[str, Comm]:
    """Comm per axis ('x', 'y', 'z') and plane ('xy', 'yz', 'zx': a LayerNorm's row
    statistics) from a :class:`~plexgt.distributed.grid.GridGroups`, plus 'plane': the group
    of the last layer's class shards (roles a and b)."""

    comms = {a: Comm.from_group(groups.axis[a], a, ledger) for a in ("x", "y", "z")}
    for p in ("xy", "yz", "zx"):
        comms[p] = Comm.from_group(groups.plane[p], p, ledger)
    comms["plane"] = comms[output_plane(last.roles)]
    return comms


def _width(r: tuple[int, int]) -> int:
    return r[1] - r[0]
