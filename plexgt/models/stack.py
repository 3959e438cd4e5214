"""The single-process skeleton of every grid3d model (gcn, sage, mlp: each subclasses
:class:`LayerStack` with its operators): L layers of ``H' = ReLU(sum_k Op_k · (H W_k) + b)``
(no ReLU after the last), dropout before every layer; with :class:`GCNArch`'s options the
tuned forms of Luo, Shi & Wu ("Classic GNNs are strong baselines", NeurIPS 2024) around
every layer: an input Linear, residual connections, LayerNorm or BatchNorm, pre- or
post-norm, jumping knowledge and a linear classifier.

The model is a chain of *ops*, each node-wise 'linear' (the input projection, the
classifier) or a 'conv' (a graph layer), so that the 3D-parallel copy can run every op as a
layer of its grid (:mod:`plexgt.parallel.plexus3d`); :func:`gcn_ops` is that chain, the one
description the model, its distributed copy and the planner's cost model all read.

Shapes: x [N, F] (dense, or sparse as a CSRGraph) -> logits [N, C]; the operators of
:data:`plexgt.models.spec.OPERATORS` read from the :class:`~plexgt.models.layers.ModelGraph`
(``gcn``: graph.gcn, ``mean``: graph.mean, ``self``: none). One nn.Linear per operator and
layer, the first operator's with the bias, so the 3D grid shards each weight exactly as it
shards gcn's (:class:`~plexgt.parallel.plexus3d.Plexus3DGCN`), and the widths, dropout sites
and masks are gcn's: a model differs from gcn in its operators only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from plexgt.models.layers import (
    Drop,
    Features,
    ModelGraph,
    gcn_conv,
    jk_combine,
    linear_in,
    make_norm,
    num_features,
    step_rng,
)
from plexgt.models.recompute import checkpointed, module_norm
from plexgt.models.spec import parameter_lists


def layer_widths(in_dim: int, hidden: int, out_dim: int, num_layers: int) -> list[int]:
    """Widths of a GCN's layers, input to output: [F, d, ..., d, C] (the model, the planner's
    search and its calibration on whole steps all read the layers this way)."""
    return [in_dim] + [hidden] * (num_layers - 1) + [out_dim]


def apply_operator(op: str, graph: ModelGraph | None, h: Features, lin: nn.Linear
                   ) -> torch.Tensor:
    """Op · (h Wᵀ) (+ the bias where ``lin`` has one): [N, F] -> [N, out]."""
    if op == "self":
        return linear_in(h, lin)
    g = None if graph is None else getattr(graph, op)
    if g is None:
        raise ValueError(f"operator {op!r} needs graph.{op} (ModelGraph.from_edges({op}=True))")
    return gcn_conv(g, h, lin)


@dataclass(frozen=True)
class GCNArch:
    """The GCN's options (``model.*`` config keys of the same names). The defaults are the
    plain Kipf & Welling stack.

    Why this set: tunedGNN's GCN recipes (Computers, Photo, CS, Physics, the heterophilous
    graphs) are exactly an optional input Linear (``input_proj``), GCN layers with
    ``conv(x) + Linear(x)`` (``residual='linear'``), LayerNorm or BatchNorm after each layer
    (post-norm), ReLU, dropout and a linear classifier (``head``); 'identity' residuals,
    pre-norm (DeeperGCN's res+: norm, ReLU, dropout, conv, add) and jumping knowledge are the
    standard forms for deeper stacks.
    """

    input_proj: bool = False
    head: bool = False
    residual: str = "none"
    """'none', 'identity' or 'linear'."""
    norm: str = "none"
    """'none', 'layer' or 'batch'."""
    pre_norm: bool = False
    jk: str = "none"
    """'none', 'cat', 'max' or 'sum' (needs ``head``)."""
    init: str = "torch"
    """The graph layers' initialisation: 'torch' (nn.Linear's) or 'glorot' (Glorot-uniform
    weights, zero biases: PyG's GCNConv, tunedGNN's GCN)."""

    def __post_init__(self) -> None:
        if self.init not in ("torch", "glorot"):
            raise ValueError(f"init {self.init!r} is not torch or glorot")
        if self.residual not in ("none", "identity", "linear"):
            raise ValueError(f"residual {self.residual!r} is not none, identity or linear")
        if self.norm not in ("none", "layer", "batch"):
            raise ValueError(f"norm {self.norm!r} is not none, layer or batch")
        if self.jk not in ("none", "cat", "max", "sum"):
            raise ValueError(f"jk {self.jk!r} is not none, cat, max or sum")
        if self.jk != "none" and not self.head:
            raise ValueError("jumping knowledge needs the linear classifier (head)")


PLAIN = GCNArch()
"""The plain Kipf & Welling GCN."""


@dataclass(frozen=True)
class GCNOp:
    """One op of a GCN's chain (:func:`gcn_ops`)."""

    kind: str
    """'linear' (x W + b, node-wise) or 'conv' (Â x W + b)."""
    name: str
    """The reference module's name: 'input', 'layers.{i}' or 'head'."""
    d_in: int
    d_out: int
    residual: str = "none"
    """'none', 'identity' or 'linear' (a conv's residual path: what it adds)."""
    pre_norm: int | None = None
    """Index into ``norms`` of the norm applied (then ReLU) to the op's input, pre-norm."""
    pre_act: bool = False
    """ReLU on the op's input before the dropout (pre-norm, every op after the first conv)."""
    post_norm: int | None = None
    """Index into ``norms`` of the norm applied to the output (post-norm), before the ReLU."""
    post_act: bool = False
    """ReLU on the output (post-norm hidden convs)."""
    jk: bool = False
    """The output is one of the layers jumping knowledge combines."""


def gcn_ops(in_dim: int, hidden: int, out_dim: int, num_layers: int,
            arch: GCNArch = PLAIN) -> list[GCNOp]:
    """The chain of ops: ['input'] + L convs + ['head'] (as ``arch`` has them), with each
    op's widths, residual and norms. Norm j follows conv j (post-norm: every conv but an
    output conv) or precedes conv j + 1 (pre-norm; the last one precedes the head): L - 1
    norms, plus one with a head, either way. A residual is 'identity' only where the conv
    maps hidden to hidden; elsewhere (raw features in, classes out) a projection."""
    if num_layers < 1:
        raise ValueError("num_layers must be >= 1")
    a = arch
    ops: list[GCNOp] = []
    if a.input_proj:
        ops.append(GCNOp("linear", "input", in_dim, hidden))
    first = hidden if a.input_proj else in_dim
    for i in range(num_layers):
        d_in = first if i == 0 else hidden
        output = i == num_layers - 1 and not a.head
        d_out = out_dim if output else hidden
        res = a.residual
        if res == "identity" and (d_in != d_out or (i == 0 and not a.input_proj)):
            res = "linear"
        pre = a.pre_norm and i > 0
        post = not a.pre_norm and not output
        ops.append(GCNOp("conv", f"layers.{i}", d_in, d_out, res,
                         pre_norm=i - 1 if pre and a.norm != "none" else None, pre_act=pre,
                         post_norm=i if post and a.norm != "none" else None, post_act=post,
                         jk=a.jk != "none"))
    if a.head:
        width = hidden * (num_layers if a.jk == "cat" else 1)
        ops.append(GCNOp("linear", "head", width, out_dim,
                         pre_norm=num_layers - 1 if a.pre_norm and a.norm != "none" else None,
                         pre_act=a.pre_norm))
    return ops


def jk_hops(ops: list[GCNOp]) -> dict[int, list[int]]:
    """Jumping knowledge on the 3D grid: op index i of each combined layer -> the layer
    indices of the node-wise identity maps ('hops') that carry its output into the layout of
    the last GCN layer's output (the classifier's input).

    A layer's output layout is set by its index: the axis roles repeat every 3 layers, the
    row order (P, Q) every 2. One hop at index m moves a tensor from layout m - 1 to layout
    m, its rows into any order (its identity block is built from both sides' node ids, the
    last hop's from the target's). So an output i layers before the target needs
    (target - i) mod 3 hops, or 3 when that is 0 but the orders differ (an odd distance)."""
    target = len(ops) - 2
    out: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        if not op.jk:
            continue
        diff = target - i
        k = diff % 3 if diff % 3 else (3 if diff % 2 else 0)
        out[i] = list(range(i + 1, i + 1 + k))
    return out


def norm_widths(ops: list[GCNOp]) -> list[int]:
    """Width of each norm of the chain, by index."""
    out: dict[int, int] = {}
    for op in ops:
        if op.pre_norm is not None:
            out[op.pre_norm] = op.d_in
        if op.post_norm is not None:
            out[op.post_norm] = op.d_out
    return [out[j] for j in range(len(out))]


def op_widths(ops: list[GCNOp]) -> list[int]:
    """[d_in of op 0, d_out of every op]: the chain's widths as the 3D layouts read them."""
    return [ops[0].d_in] + [op.d_out for op in ops]


class LayerStack(nn.Module):
    """Plain nn.Linear per op (weights + bias), so a distributed copy can shard them as is.

    A conv op is ``sum_k Op_k · (H W_k) + b`` over the subclass's ``operators``
    (:data:`plexgt.models.spec.OPERATORS`; gcn: Â alone, sage: the mean and the identity,
    mlp: the identity), and the options wrap every conv alike.

    Modules: ``layers`` (one Linear per GCN layer, the first operator's, with the bias),
    ``<op>_layers`` for the other operators (weights only, :func:`parameter_lists`), created
    first, so the plain model's initialisation is the same with or without the options,
    then ``input``, ``residuals``
    (a Linear per 'linear' residual, Identity per 'identity' one), ``norms`` and ``head``.
    Dropout: before op k at site k (rate ``input_dropout`` for op 0).
    """

    operators: tuple[str, ...] = ()

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2,
                 dropout: float = 0.5, input_dropout: float | None = None, seed: int = 0,
                 arch: GCNArch = PLAIN, checkpoint: bool = False) -> None:
        super().__init__()
        self.ops = gcn_ops(in_dim, hidden, out_dim, num_layers, arch)
        convs = [op for op in self.ops if op.kind == "conv"]
        for k, name in enumerate(parameter_lists(self.operators)):
            setattr(self, name, nn.ModuleList(nn.Linear(op.d_in, op.d_out, bias=k == 0)
                                              for op in convs))
        if arch.init == "glorot":  # drawn after torch's, so 'torch' draws what it always did
            for name in parameter_lists(self.operators):
                for lin in getattr(self, name):
                    nn.init.xavier_uniform_(lin.weight)
                    if lin.bias is not None:
                        nn.init.zeros_(lin.bias)
        self.arch = arch
        if arch.input_proj:
            self.input = nn.Linear(in_dim, hidden)
        if arch.residual != "none":
            self.residuals = nn.ModuleList(
                nn.Linear(op.d_in, op.d_out) if op.residual == "linear" else nn.Identity()
                for op in convs)
        self.norms = nn.ModuleList(make_norm(arch.norm, w) for w in norm_widths(self.ops))
        if arch.head:
            self.head = nn.Linear(self.ops[-1].d_in, out_dim)
        self.dropout = dropout
        self.input_dropout = dropout if input_dropout is None else input_dropout
        self.seed = seed
        self.checkpoint = checkpoint
        """Recompute each op's activations in backward (:mod:`plexgt.models.recompute`)."""
        self.step = 0
        """Training forwards so far: the step key of the dropout masks."""

    def module(self, name: str) -> nn.Module:
        """The Linear of op ``name`` ('input', 'layers.{i}', 'head')."""
        return self.get_submodule(name)

    def operator_layers(self, i: int) -> list[nn.Linear]:
        """GCN layer ``i``'s nn.Linear of each operator, in ``operators`` order."""
        return [getattr(self, name)[i] for name in parameter_lists(self.operators)]

    def forward(self, x: Features, graph: ModelGraph | None = None) -> torch.Tensor:
        if "gcn" in self.operators and (graph is None or graph.gcn is None):
            raise ValueError("GCN needs graph.gcn (the normalised adjacency)")
        if num_features(x) != self.ops[0].d_in:
            raise ValueError(f"x has {num_features(x)} features, model expects "
                             f"{self.ops[0].d_in}")
        ids = None if graph is None else graph.node_ids
        drop = Drop(step_rng(self.seed, self.step, ids, x, self.training), 0.0)
        h: Features = x
        hidden: list[torch.Tensor] = []
        for k, op in enumerate(self.ops):  # dropout site k: before op k
            if op.name == "head" and hidden:
                h = jk_combine(hidden, self.arch.jk)
            y = checkpointed(self._op, k, h, drop, graph, enabled=self.checkpoint)
            if op.jk:
                hidden.append(y)
            h = y
        assert isinstance(h, torch.Tensor)
        if self.training:
            self.step += 1
        return h

    def _op(self, k: int, h: Features, drop: Drop, graph: ModelGraph | None) -> torch.Tensor:
        """Op k on its input h: its pre-norm and ReLU, dropout, the op with its residual, its
        post-norm and ReLU (one block of :mod:`plexgt.models.recompute`)."""
        op = self.ops[k]
        raw = h
        if op.pre_norm is not None:
            assert isinstance(h, torch.Tensor)
            h = module_norm(self.norms[op.pre_norm], h)
        if op.pre_act:
            h = F.relu(h)  # type: ignore[arg-type]
        h = drop.at(k, self.input_dropout if k == 0 else self.dropout).features(h)
        if op.kind == "linear":
            y = linear_in(h, self.module(op.name))
        else:
            i = int(op.name.split(".")[1])
            terms = [apply_operator(o, graph, h, lin)
                     for o, lin in zip(self.operators, self.operator_layers(i))]
            y = terms[0]
            for t in terms[1:]:
                y = y + t
            if op.residual != "none":
                # pre-norm's residual stream is the raw input; post-norm (and the first
                # conv, which has no pre-transform) adds what the conv read
                src = raw if op.pre_act else h
                res = self.residuals[i]
                y = y + (linear_in(src, res) if op.residual == "linear" else src)
        if op.post_norm is not None:
            y = module_norm(self.norms[op.post_norm], y)
        if op.post_act:
            y = F.relu(y)
        return y
