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

K graph operators (sage: the mean and the identity; :mod:`plexgt.models.spec`) make a layer
``sum_k Op_k·(H W_k) + b``: each W_k is sharded as gcn's one weight, and the K blocks run as
one stacked block, so each aggregation is still one collective, K times the rows
(aggregate_first: [Op_1; ...; Op_K]·H, then sum_k Z_k·W_k before the one reduce-scatter) or
the columns' products (gemm_first: [Op_1 | ... | Op_K]·[H·W_1; ...; H·W_K]).

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
from plexgt.distributed.collectives import Comm, all_gather, reduce_scatter, replicated
from plexgt.distributed.layout3d import LayerLayout, output_plane
from plexgt.models.gcn import PLAIN, GCNArch, GCNOp, jk_hops
from plexgt.models.layers import Drop, Features, jk_combine, make_norm, sparse_features
from plexgt.models.recompute import checkpointed
from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import gcn_spmm
from plexgt.ops.rng import CounterRNG
from plexgt.parallel.norms import batch_norm_rows, layer_norm_cols
from plexgt.parallel.operators import (
    gcn_block_values,  # noqa: F401 - plan.measure's, perf's
    operator_block,
)
from plexgt.parallel.plexus_aggregate import (
    BlockedAdjacency,
    _AggregateAllReduce,
    _AggregateReduceScatter,
)
from plexgt.parallel.plexus_blocks import (
    TunedMatmul,
    _TunedMM,
    column_mask,
    identity_block,
    identity_weight,
    padded_block,
    row_mask,
    stacked,
    stacked_rows,
    vector_full,
    vector_shard,
    weight_full,
    weight_shard,
)


def plain_ops(layouts: Sequence[LayerLayout]) -> list[GCNOp]:
    """The Kipf & Welling chain of ``layouts``: a GCN layer each, ReLU between them."""
    last = len(layouts) - 1
    return [GCNOp("conv", f"layers.{l}", lay.d_in_true, lay.d_out_true, post_act=l < last)
            for l, lay in enumerate(layouts)]


class Plexus3DGCN(nn.Module):
    """A GCN whose every op is 3D tensor-parallel; mirrors :class:`plexgt.models.gcn.GCN`
    (and its subclasses, the other grid3d models: a conv of K operators is
    ``sum_k Op_k·(H W_k) + b``, module docstring).

    Input: this rank's op-0 feature shard [ceil(N/Gx), d_0/(Gy·Gz)]. Output: the logits
    shard [ceil(N/Gc_L), d_L/(Ga_L·Gb_L)] of the last op. ``comms`` maps each axis and plane
    name to its :class:`Comm` (:func:`plexus_comms`); ``adj`` holds each conv op's normalised
    block (already in that layer's output x input order; None for a node-wise op), or a
    sequence of its K operators' blocks. ``names``: the reference's parameter list of each
    operator (checkpoint names ``{name}.{i}.weight``; the first carries the bias).

    ``ops`` (:func:`plexgt.models.gcn.gcn_ops`; default the plain chain of ``layouts``) with
    ``arch`` say what each op adds. A node-wise op ('linear': the input projection, the
    classifier) and a conv's residual path run through the identity's block
    (:mod:`plexgt.parallel.plexus_blocks`), which needs every op's input node ids
    (``node_ids``) and the last op's output ids (``out_ids``). A residual is fused into its
    conv's collectives: aggregate_first aggregates [Op_1; ...; Op_K; I] (post-norm: one
    input) or diag([Op_1; ...; Op_K], I) (pre-norm: the raw input beside the transformed
    one) in one blocked all-reduce, all products meet before the one reduce-scatter over b;
    gemm_first reduce-scatters [X·W_1; ...; X·W_K; X·W_r] over b, then
    [Op_1 | ... | Op_K | I] aggregates them in one reduce-scatter over a. Norms:
    :mod:`plexgt.parallel.norms` over the plane (a, b) that splits a row's features
    (LayerNorm) or the axis c that splits the rows (BatchNorm); their parameters, as a bias,
    have copies over c.
    """

    def __init__(
        self,
        layouts: Sequence[LayerLayout],
        comms: dict[str, Comm],
        adj: Sequence[sp.csr_matrix | Sequence[sp.csr_matrix] | None],
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
        names: Sequence[str] = ("layers",),
        checkpoint: bool = False,
    ) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        """Recompute each op's activations, collectives included, in backward
        (:mod:`plexgt.models.recompute`): only the ops' input blocks are kept."""
        self.names = list(names)
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
        # operators 1..K-1 of each conv: weights only, the same shards as the first's
        self.op_weights = nn.ModuleList(nn.ParameterDict() for _ in self.names[1:])
        for l, (op, lay) in enumerate(zip(self.ops, self.layouts)):
            r0, r1 = lay.in_cols
            c0, c1 = lay.w_cols
            o0, o1 = lay.out_cols
            self.weights.append(nn.Parameter(torch.zeros(r1 - r0, c1 - c0, dtype=dtype)))
            if op.kind == "conv":
                for pdict in self.op_weights:
                    pdict[str(l)] = nn.Parameter(torch.zeros(r1 - r0, c1 - c0, dtype=dtype))
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
        self.stack = self.layouts[-1].d_in // self.layouts[-2].d_out if (
            arch.jk == "cat" and len(self.layouts) > 1) else 1
        """Layers side by side in the classifier's input (jumping knowledge 'cat')."""
        last = len(self.ops) - 1
        # the classifier's pre-norm reads the concatenation of 'cat'
        self.norms = nn.ModuleList(
            make_norm(arch.norm, _width(self.layouts[l].out_cols)
                      * (self.stack if j == self.ops[-1].pre_norm else 1)).to(dtype)
            for j, l in enumerate(self.norm_at))
        # jumping knowledge: the identity maps ('hops') carrying each combined layer's
        # output into the classifier's input layout (plexgt.models.gcn.jk_hops)
        self.hops: dict[int, list[tuple[LayerLayout, BlockedAdjacency]]] = {}
        for i, path in (jk_hops(self.ops) if arch.jk != "none" else {}).items():
            assert node_ids is not None, "jumping knowledge needs every layer's node ids"
            src = node_ids[i + 1]
            chain = []
            for m in path:
                lay = dataclasses.replace(self.layouts[m], kind="linear",
                                          order="aggregate_first")
                dst = node_ids[last] if m == path[-1] else node_ids[m + 1]
                eye = identity_block(np.asarray(dst), np.asarray(src), lay.n)
                chain.append((lay, BlockedAdjacency(eye, (lay.rows_pad, lay.cols_pad),
                                                    block_rows, dtype)))
                self.register_buffer(f"hop_eye_{m}", identity_weight(lay, dtype),
                                     persistent=False)
                src = dst
            self.hops[i] = chain
        if self.stack > 1:
            lay = self.layouts[-1]
            self.register_buffer("stack_rows",
                                 stacked_rows(lay, self.stack, self.layouts[-2].d_out_true),
                                 persistent=False)

    def _operator(self, l: int, a: sp.csr_matrix | Sequence[sp.csr_matrix] | None,
                  node_ids: Sequence[torch.Tensor] | None, out_ids: torch.Tensor | None
                  ) -> tuple[sp.csr_matrix, tuple[int, int]]:
        """Op l's sparse operator and its shape: the blocks of its graph operators (stacked
        as the order multiplies them, module docstring), the identity's (node-wise op), or
        both stacked as the residual fuses them (class docstring)."""
        op, lay = self.ops[l], self.layouts[l]
        shape = (lay.rows_pad, lay.cols_pad)
        r, c = shape
        parts: list[sp.csr_matrix] = []
        if op.kind == "conv":
            if a is None:
                raise ValueError(f"op {l} is a graph layer without its operators' blocks")
            blocks = (a,) if sp.issparse(a) else tuple(a)
            if len(blocks) != len(self.names):
                raise ValueError(f"each layer needs one block per operator ({len(self.names)}: "
                                 f"{', '.join(self.names)})")
            parts = [padded_block(b, shape) for b in blocks]
            if op.residual == "none":
                if len(parts) == 1:
                    return parts[0], shape
                how = "h" if lay.order == "gemm_first" else "v"
                out = stacked(parts, how)
                return out, out.shape
        if node_ids is None or len(node_ids) != len(self.layouts) or (
                out_ids is None and l == len(self.layouts) - 1):
            raise ValueError("node-wise layers and residuals need every layer's input node "
                             "ids and the last layer's output ids (node_ids=, out_ids=)")
        after = out_ids if l == len(self.layouts) - 1 else node_ids[l + 1]
        eye = identity_block(np.asarray(after), np.asarray(node_ids[l]), lay.n)
        if op.kind == "linear":
            return eye, shape
        k = len(parts)
        if lay.order == "gemm_first":
            return stacked([*parts, eye], "h"), (r, (k + 1) * c)
        if op.pre_act:
            ops = parts[0] if k == 1 else stacked(parts, "v")
            return stacked([ops, eye], "diag"), ((k + 1) * r, 2 * c)
        return stacked([*parts, eye], "v"), ((k + 1) * r, c)

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

    def _operator_weights(self, l: int) -> list[tuple[str, nn.Parameter]]:
        """Op ``l``'s (local parameter name, shard) of each graph operator, in operator order
        (one for a node-wise op)."""
        out = [(f"weights.{l}", self.weights[l])]
        if self.ops[l].kind == "conv":
            out += [(f"op_weights.{k}.{l}", pdict[str(l)])
                    for k, pdict in enumerate(self.op_weights)]
        return out

    def _canonical_name(self, name: str) -> tuple[str, LayerLayout | None, str]:
        """Local parameter or buffer name -> (the reference's name, the layout its shard is
        cut from (None: replicated as is), 'weight' or 'vector')."""
        group, _, rest = name.partition(".")
        if group == "op_weights":
            k, _, l = rest.partition(".")
            i = self.ops[int(l)].name.split(".")[1]
            return f"{self.names[int(k) + 1]}.{i}.weight", self.layouts[int(l)], "weight"
        if group in ("weights", "biases", "res_weights", "res_biases"):
            l = int(rest)
            op = self.ops[l]
            kind = "weight" if group.endswith("weights") else "vector"
            if group.startswith("res_"):
                i = op.name.split(".")[1]
                return f"residuals.{i}.{kind if kind == 'weight' else 'bias'}", \
                    self.layouts[l], kind
            if kind == "weight" and self.stack > 1 and l == len(self.ops) - 1:
                kind = "stacked"
            ref = op.name if op.kind == "linear" else \
                f"{self.names[0]}.{op.name.split('.')[1]}"
            return f"{ref}.{'bias' if kind == 'vector' else 'weight'}", self.layouts[l], kind
        if group == "norms":
            j, _, field = rest.partition(".")
            if field == "num_batches_tracked":
                return name, None, "vector"
            return name, self.layouts[self.norm_at[int(j)]], "vector"
        raise KeyError(f"no canonical form for {name}")

    def counted(self, name: str) -> bool:
        """Whether this rank counts parameter ``name`` in a global sum over ranks (the
        gradient's norm): every weight block (each is one rank's), a vector's block only at
        ic = 0 (its copies over c are equal)."""
        _, lay, kind = self._canonical_name(name)
        return lay is None or kind != "vector" or lay.i[2] == 0

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
            elif kind != "vector":
                out[full] = weight_full(lay, t.detach(), self.comms, self._rows(kind))
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
            elif kind != "vector":
                out[name] = weight_shard(lay, full[key], t, self._rows(kind))
            else:
                out[name] = vector_shard(lay, full[key], t)
        return out

    def _rows(self, kind: str) -> torch.Tensor | None:
        return self.stack_rows.cpu() if kind == "stacked" else None

    def _dropout(self, h: Features, lay: LayerLayout, step: int) -> Features:
        """Dropout at the reference GCN's site (the op index), keyed on the block's node ids
        and global columns: the entries the single-process model drops, on any grid (sparse
        input: its stored entries, at their gathered columns)."""
        p = self.input_dropout if lay.layer == 0 else self.dropout
        if not self.training or p <= 0:
            return h
        if self.num_id_layers != len(self.layouts):
            raise ValueError("dropout needs each layer's node ids (Plexus3DGCN(node_ids=...))")
        rng = CounterRNG(self.seed, step, getattr(self, f"node_ids_{lay.layer}"))
        drop = Drop(rng, p, lay.layer)
        if self.stack > 1 and lay.layer == len(self.layouts) - 1:
            # the classifier's input: each layer's block at its columns of the concatenation
            assert isinstance(h, torch.Tensor)
            prev = self.layouts[-2]
            parts = h.chunk(self.stack, dim=1)
            return torch.cat([drop(x, i * prev.d_out_true + prev.out_cols[0])
                              for i, x in enumerate(parts)], 1)
        col0 = lay.gathered_cols[0] if isinstance(h, CSRGraph) else lay.in_cols[0]
        return drop.features(h, col0)

    def _hop(self, h: torch.Tensor, lay: LayerLayout, adj: BlockedAdjacency) -> torch.Tensor:
        """One jumping-knowledge hop: the node-wise identity map at ``lay``'s index
        (aggregate_first, a constant weight, no bias): out(m - 1) -> out(m)."""
        a, b, c = lay.roles
        z = _AggregateAllReduce.apply(all_gather(h, self.comms[c], dim=1), adj, self.comms[a])
        p = _TunedMM.apply(z, getattr(self, f"hop_eye_{lay.layer}"), self.mm)
        return reduce_scatter(p, self.comms[b], dim=1)

    def _jumping_knowledge(self, hidden: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
        """Every combined layer's output hopped into the classifier's input layout, then
        concatenated (each rank its blocks side by side), or their maximum or sum."""
        outs = []
        for i, y in hidden:
            for lay, adj in self.hops[i]:
                y = self._hop(y, lay, adj)
            outs.append(y)
        return jk_combine(outs, self.arch.jk)

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
        ws = [w for _, w in self._operator_weights(l)]
        if lay.order == "gemm_first":
            # W_k [d_in/Gb, d_out] whole on every rank of the ac plane; T_k = H·W_k partial
            # over b, the K products (and the residual's) stacked by rows: one reduce-scatter
            prods = [self._mm(hg, self._gather_weight(w, lay)) for w in ws]
            if rg is not None:
                prods.append(self._mm(rg, self._residual_weight(l)))
            t = reduce_scatter(prods[0] if len(prods) == 1 else torch.cat(prods),
                               self.comms[b], dim=1)
            y = _AggregateReduceScatter.apply(t, self.adj[l], self.comms[a])
            return y + self._bias(l, y)
        assert isinstance(hg, torch.Tensor)
        rows = lay.rows_pad
        x = hg if rg is None or rg is hg else torch.cat([hg, rg])
        z = _AggregateAllReduce.apply(x, self.adj[l], self.comms[a])
        p = None
        for k, w in enumerate(ws):  # Z = [Op_1·H; ...; Op_K·H (; I·R)]
            pk = _TunedMM.apply(z[k * rows:(k + 1) * rows] if z.shape[0] > rows else z,
                                all_gather(w, self.comms[c], dim=0), self.mm)
            p = pk if p is None else p + pk
        assert p is not None
        if rg is not None:
            k = len(ws)
            p = p + _TunedMM.apply(z[k * rows:(k + 1) * rows], self._residual_weight(l),
                                   self.mm)
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
            stack = k // _width(lay.out_cols)  # jumping knowledge 'cat': layers side by side
            return layer_norm_cols(h, w, bias, column_mask(lay, h.device).repeat(stack),
                                   stack * lay.d_out_true, self.comms[output_plane(lay.roles)],
                                   mod.eps)
        return batch_norm_rows(h, mod, row_mask(lay, h.device), lay.n, c, w, bias)

    def _apply(self, fn: Any, recurse: bool = True) -> Plexus3DGCN:
        """``.to(device)``, ``.double()`` and the like reach the adjacency blocks too: they are
        plain lists of sparse tensors, which nn.Module would skip (and a GPU run would then
        multiply CPU blocks with device features)."""
        super()._apply(fn, recurse)
        for a in self.adj + [adj for chain in self.hops.values() for _, adj in chain]:
            a.fwd = [fn(m) for m in a.fwd]
            a.bwd = [fn(m) for m in a.bwd]
        return self

    def forward(self, x: Features) -> torch.Tensor:
        h: Features = x
        hidden: list[tuple[int, torch.Tensor]] = []
        for l, op in enumerate(self.ops):
            if op.name == "head" and hidden:
                h = self._jumping_knowledge(hidden)
            # the step passed in, not read: a recomputed block runs after the step counted
            y = checkpointed(self._block, l, h, self.step, enabled=self.checkpoint)
            if op.jk:
                hidden.append((l, y))
            h = y
        if self.training:
            self.step += 1
        assert isinstance(h, torch.Tensor)
        return h

    def _block(self, l: int, h: Features, step: int) -> torch.Tensor:
        """Op l on its input block: pre-norm and ReLU, dropout (of training step ``step``),
        the layer with its residual, post-norm and ReLU (one block of
        :mod:`plexgt.models.recompute`)."""
        op, lay = self.ops[l], self.layouts[l]
        raw = h
        if op.pre_norm is not None:
            assert isinstance(h, torch.Tensor)
            h = self._norm(op.pre_norm, h)
        if op.pre_act:
            h = torch.relu(h)  # type: ignore[arg-type]
        h = self._dropout(h, lay, step)
        res = None
        if op.residual != "none":
            assert isinstance(raw, torch.Tensor) or not op.pre_act
            res = raw if op.pre_act else h
        y = self.layer(h, l, res)  # type: ignore[arg-type]
        if op.post_norm is not None:
            y = self._norm(op.post_norm, y)
        if op.post_act:
            y = torch.relu(y)
        return y


@dataclass
class PlexusInputs:
    """One rank's tensors for an L-layer 3D-parallel GCN, from the loader's
    :class:`~plexgt.data.loader.PlexusArrays`.

    x [ceil(N/Gx), d_0/(Gy·Gz)] (Q order); per layer the normalised Â block (scipy, cut into
    row blocks by :class:`BlockedAdjacency`; None for a node-wise layer), or with several
    operators a tuple of their blocks; labels and split masks of the last layer's output rows
    [ceil(N/Gc_L)] in its output order.
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
    out_ids: torch.Tensor | None = None
    """[ceil(N/Gc_L)]: original node id of each of the last layer's output rows."""

    @classmethod
    def from_arrays(cls, arrays: PlexusArrays, dtype: torch.dtype,
                    operators: Sequence[str] = ("gcn",),
                    out_ids: Sequence[np.ndarray] | None = None) -> PlexusInputs:
        """``operators``: each graph layer's operators (:mod:`plexgt.parallel.operators`),
        one block each (a tuple of them where there are several); ``out_ids``: per layer the
        original ids of its output rows, which the identity ('self') reads (the input rows'
        are ``arrays.node_ids``)."""
        outs = list(out_ids) if out_ids is not None else [None] * len(arrays.blocks)
        adj: list[Any] = []
        for b, oid, iid in zip(arrays.blocks, outs, arrays.node_ids or outs):
            if b is None:
                adj.append(None)
                continue
            ops = tuple(operator_block(op, *b, oid, iid) for op in operators)
            adj.append(ops[0] if len(ops) == 1 else ops)
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
