"""The layer math shared by gcn, gt and gps, as small functions over plain parameters.

Each function takes the nn.Linear / LayerNorm modules it needs rather than owning them, so a
distributed layer can call the very same arithmetic on its shard (or re-implement it line for
line) and be checked against these single-process models, which are the oracle.

Shapes: N nodes (rows of the graph), F input features, d hidden, h heads of d' = d / h.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from plexgt.models.recompute import checkpointed, module_norm
from plexgt.ops.attention import sparse_attention
from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import gcn_norm, gcn_spmm, mean_norm
from plexgt.ops.heads import head_major_linear
from plexgt.ops.rng import CounterRNG
from plexgt.ops.super_nodes import edge_bias_with_super, super_attention, super_columns

Tensor = torch.Tensor
Features = Tensor | CSRGraph
"""Node features: dense [N, F], or sparse as a weighted [N, F] CSRGraph (bag-of-words inputs are
~0.4% dense; multiplying them sparse is what makes Coauthor Physics cheap on a CPU)."""


@dataclass
class ModelGraph:
    """The sparse operators a model's forward needs (rows = destinations, A[dst, src]).

    ``adj`` [Nr, Nc]: structural pattern the attention runs over. ``gcn`` [Nr, Nc]: the
    normalised Â = D^-1/2 (A + I) D^-1/2 for GCN aggregation. ``mean`` [Nr, Nc]: the row-normalised
    M = D^-1 (A + I), GraphSAGE's mean aggregation. Single-process graphs are square; a
    distributed rank may carry rectangular blocks of them.
    """

    adj: CSRGraph | None = None
    gcn: CSRGraph | None = None
    node_ids: Tensor | None = None
    """[Nr] original node id of each row, the key of its dropout masks; None: 0..Nr-1."""
    edge_attr: Tensor | None = None
    """[E, F_e] features of ``adj``'s edges in its CSR order (the attention's edge bias)."""
    _super: CSRGraph | None = field(default=None, repr=False, compare=False)
    mean: CSRGraph | None = None

    def super_adj(self, s: int) -> CSRGraph:
        """``adj`` [N, N] with S super-node columns on every row, [N, N + S] (built once)."""
        assert self.adj is not None, "no attention pattern"
        want = self.adj.num_cols + s
        if self._super is None or self._super.num_cols != want:
            g = super_columns(self.adj, s, self.adj.num_rows)
            g.transpose()
            self._super = g
        return self._super

    @classmethod
    def from_edges(
        cls, dst: Tensor | np.ndarray, src: Tensor | np.ndarray, num_nodes: int,
        attention: bool = True, gcn: bool = True, device: torch.device | str = "cpu",
        edge_attr: Tensor | np.ndarray | None = None, mean: bool = False,
    ) -> ModelGraph:
        """Build the operators asked for from edges src -> dst (duplicates merged, or refused
        when ``edge_attr`` [E, F_e] gives each edge features); transposes are built up front
        so that the first backward is not the one paying for them."""
        attr = None
        if edge_attr is not None:
            d, s = torch.as_tensor(dst).long(), torch.as_tensor(src).long()
            order = torch.argsort(d * num_nodes + s, stable=True)
            attr = torch.as_tensor(edge_attr)[order].to(device)
        adj = CSRGraph.from_coo(dst, src, num_nodes, num_nodes,
                                duplicates="merge" if attr is None else "error").to(device)
        norm = gcn_norm(adj) if gcn else None
        avg = mean_norm(adj) if mean else None
        for g in (adj if attention else None, norm, avg):
            if g is not None:
                g.transpose()
                _ = g.row
        return cls(adj if attention else None, norm, edge_attr=attr, mean=avg)

    def to(self, device: torch.device | str) -> ModelGraph:
        return ModelGraph(
            None if self.adj is None else self.adj.to(device),
            None if self.gcn is None else self.gcn.to(device),
            None if self.node_ids is None else self.node_ids.to(device),
            None if self.edge_attr is None else self.edge_attr.to(device),
            mean=None if self.mean is None else self.mean.to(device),
        )

    @property
    def num_rows(self) -> int:
        g = next((g for g in (self.adj, self.gcn, self.mean) if g is not None), None)
        assert g is not None, "empty ModelGraph"
        return g.num_rows


def sparse_features(x: np.ndarray | sp.spmatrix, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> CSRGraph:
    """Dense or scipy [N, F] features -> weighted CSRGraph [N, F] (transpose prebuilt)."""
    m = sp.csr_matrix(x)
    m.eliminate_zeros()
    g = CSRGraph.from_scipy(m)
    g.values = g.values.to(dtype)  # type: ignore[union-attr]
    g = g.to(device)
    g.transpose()
    return g


def num_features(x: Features) -> int:
    return x.num_cols if isinstance(x, CSRGraph) else int(x.shape[1])


def num_nodes(x: Features) -> int:
    return x.num_rows if isinstance(x, CSRGraph) else int(x.shape[0])


@dataclass(frozen=True)
class Drop:
    """The dropout of one sublayer in one forward: rate ``p``, the step's counter-based RNG
    (None in evaluation), and the sublayer's site number.

    Masks are a function of (seed, step, site, node id, column) alone (:mod:`plexgt.ops.rng`),
    so a distributed copy that numbers its sites the same way drops exactly the entries the
    single-process model drops, whatever rows or columns each rank holds.
    """

    rng: CounterRNG | None
    p: float
    site: int = 0

    def at(self, site: int, p: float | None = None) -> Drop:
        """The same draw at another site (and rate)."""
        return Drop(self.rng, self.p if p is None else p, site)

    def sub(self, k: int) -> Drop:
        """Sublayer k of this block (site + k)."""
        return Drop(self.rng, self.p, self.site + k)

    def __call__(self, x: Tensor, col0: int = 0) -> Tensor:
        """Inverted dropout of x [n, m] (columns col0.. of the global activation)."""
        if self.rng is None or self.p <= 0.0:
            return x
        return self.rng.dropout(x, self.p, self.site, col0)

    def features(self, x: Features, col0: int = 0) -> Features:
        """Dropout on node features (columns col0.. of the global input); for sparse features
        only the stored entries are drawn (zeros stay zeros either way, so this equals dense
        dropout on the same matrix)."""
        if self.rng is None or self.p <= 0.0:
            return x
        if isinstance(x, CSRGraph):
            assert x.values is not None
            cols = x.indices + col0 if col0 else x.indices
            return x.with_values(self.rng.dropout_values(x.values, x.row, cols, self.p,
                                                         self.site))
        return self(x, col0)


NO_DROP = Drop(None, 0.0)
"""Dropout switched off (evaluation, or a model without any)."""

BLOCK_SITES = 8
"""Site numbers per block: block i's sublayers draw at sites 8(i+1) + k, k < 8."""


def step_rng(seed: int, step: int, node_ids: Tensor | None, x: Features, training: bool
             ) -> CounterRNG | None:
    """The counter RNG of a training step over the rows of ``x`` with ids ``node_ids``
    (None: 0..N-1, the single-process order, made on x's device); None when not training."""
    if not training:
        return None
    dev = x.indptr.device if isinstance(x, CSRGraph) else x.device
    ids = torch.arange(num_nodes(x), dtype=torch.int64, device=dev) if node_ids is None \
        else node_ids
    return CounterRNG(seed, step, ids)


def linear_in(x: Features, lin: nn.Linear) -> Tensor:
    """x [N, F] (dense or sparse) -> x Wᵀ + b [N, out]. Sparse x goes through the same
    constant-sparse x dense product as GCN (gradient only for the weight)."""
    if isinstance(x, CSRGraph):
        y = gcn_spmm(x, lin.weight.t())
        return y if lin.bias is None else y + lin.bias
    return lin(x)


def gcn_conv(graph: CSRGraph, x: Features, lin: nn.Linear) -> Tensor:
    """Kipf-Welling propagation Â (x W) + b: x [Nc, F] -> [Nr, out].

    W is applied before Â (the cheaper order whenever out <= F) and the bias after it, as in
    the paper and PyG (bias before Â would be scaled by row sums of Â).
    """
    if isinstance(x, CSRGraph):
        xw = gcn_spmm(x, lin.weight.t())
    else:
        xw = F.linear(x, lin.weight)
    y = gcn_spmm(graph, xw)
    return y if lin.bias is None else y + lin.bias


def attention_conv(
    graph: CSRGraph, x_dst: Tensor, x_src: Tensor, wq: nn.Linear, wk: nn.Linear,
    wv: nn.Linear, wo: nn.Linear, heads: int, block_rows: int | None = None,
    kernel: str = "auto", bias: Tensor | None = None,
) -> Tensor:
    """X' = X W_o + softmax(Q Kᵀ / sqrt(d') ⊙ A) V: x_dst [Nr, d], x_src [Nc, d] -> [Nr, d].

    Q comes from destination rows, K and V from source columns: on a single process both are
    the same x; a distributed rank passes its local rows and the gathered sources. ``kernel``:
    :data:`plexgt.ops.attention.KERNELS` (benchmarks compare them; 'auto' everywhere else).
    """
    # four separate GEMMs on purpose: fusing them into one [d, 4d] GEMM measured no faster on
    # 2 cores, and its backward assembles a [N, 4d] gradient while dq, dk, dv are alive.
    # Q, K, V are written head-major, the layout the attention kernels read (no copies).
    q, k, v = (head_major_linear(x, w, heads) for x, w in ((x_dst, wq), (x_src, wk), (x_src, wv)))
    # X W_o is the residual the kernels add their output to, in place (no pass of its own)
    return sparse_attention(graph, q, k, v, block_rows=block_rows, residual=wo(x_dst),
                            kernel=kernel, bias=bias)


def ffn(x: Tensor, lin1: nn.Linear, lin2: nn.Linear, drop: Drop = NO_DROP) -> Tensor:
    """Position-wise feed-forward: [N, d] -> [N, d] (ReLU, dropout inside)."""
    return lin2(drop(F.relu(lin1(x))))


NORMS = ("none", "layer", "batch")
"""``model.norm``'s kinds (after 'auto' is resolved)."""


def make_norm(kind: str, dim: int) -> nn.Module:
    """The norm over a width-``dim`` hidden activation [n, dim]: LayerNorm (each row over its
    features), BatchNorm1d (each feature over the rows: all N nodes, full-graph) or none."""
    if kind == "layer":
        return nn.LayerNorm(dim)
    if kind == "batch":
        return nn.BatchNorm1d(dim)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"norm {kind!r} is not one of {', '.join(NORMS)}")


NormFn = Callable[[nn.Module, Tensor], Tensor]
"""(norm module, activation [n, d]) -> normalised: how a model applies its norms. On one
process the module itself; a distributed model substitutes the exact distributed form where
the statistics span ranks (BatchNorm over a row partition)."""


def apply_norm(norm: nn.Module, x: Tensor) -> Tensor:
    """The single-process :data:`NormFn`: the module (a recomputed BatchNorm leaves its
    running statistics alone, :func:`~plexgt.models.recompute.module_norm`)."""
    return module_norm(norm, x)


def jk_combine(outs: list[Tensor], mode: str) -> Tensor:
    """Jumping knowledge over L layer outputs [n, d]: 'cat' [n, L·d], 'max' / 'sum' [n, d]."""
    if mode == "cat":
        return torch.cat(outs, 1)
    if mode == "max":
        return torch.stack(outs).amax(0)
    if mode == "sum":
        return torch.stack(outs).sum(0)
    raise ValueError(f"jumping knowledge {mode!r} is not one of cat, max, sum")


def residual_norm(x: Tensor, update: Tensor, norm: nn.Module, drop: Drop = NO_DROP,
                  nf: NormFn = apply_norm) -> Tensor:
    """Post-norm residual N(x + dropout(update)), as in Dwivedi & Bresson's graph transformer."""
    return nf(norm, x + drop(update))


Block = Callable[[Any, Tensor, Any, "int | None", Drop, "Tensor | None", bool, NormFn],
                 tuple[Tensor, "Tensor | None"]]
"""(block module, rows [n, d], graph, block_rows, dropout, super states [S, d] or None,
update_super, norm function) -> (rows, super states, None when not ``update_super``): one
block of a :class:`BlockStack`, single-process or distributed."""


class AttentionParams(nn.Module):
    """The four d x d projections of one attention sublayer (W_Q, W_K, W_V, W_o), and with
    edge features of F_e > 0 columns the edge encoder W_b [h, F_e]: edge e's score in head i
    gains (W_b x_e)_i (Graphormer's / GraphGPS's edge encoding)."""

    def __init__(self, dim: int, heads: int, edge_dim: int = 0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"hidden size {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.edge = nn.Linear(edge_dim, heads, bias=False) if edge_dim else None

    def bias(self, edge_attr: Tensor | None) -> Tensor | None:
        """[E, F_e] edge features -> [h, E] score bias (None without an edge encoder)."""
        if self.edge is None:
            return None
        if edge_attr is None:
            raise ValueError(f"the model encodes {self.edge.in_features} edge features, "
                             "but the graph has none")
        return self.edge(edge_attr.to(self.edge.weight.dtype)).t()

    def forward(self, graph: CSRGraph, x_dst: Tensor, x_src: Tensor,
                block_rows: int | None = None, edge_attr: Tensor | None = None) -> Tensor:
        return attention_conv(graph, x_dst, x_src, self.q, self.k, self.v, self.o, self.heads,
                              block_rows, bias=self.bias(edge_attr))

    def with_super(self, graph: CSRGraph, x: Tensor, z: Tensor, block_rows: int | None = None,
                   update_super: bool = True, bias: Tensor | None = None
                   ) -> tuple[Tensor, Tensor | None]:
        """Attention of real rows x [N, d] and super rows z [S, d] over both:
        (x W_o + attention [N, d], z W_o + attention [S, d], or None unless
        ``update_super``: the last block's super states feed nothing). ``bias`` [h, E + N·S]:
        the edge bias on that pattern (zero on the super entries).

        ``graph`` [N, N + S] is the pattern with the super columns (:meth:`ModelGraph.
        super_adj`): real rows attend to their neighbours and every super node through the
        ordinary kernel; super rows attend to everything, densely (S x (N + S) scores).
        """
        s, d = z.shape
        a = attention_conv(graph, x, torch.cat([x, z]), self.q, self.k, self.v, self.o,
                           self.heads, block_rows, bias=bias)
        if not update_super:
            return a, None
        qs, ks, vs = (self.split(lin(z)) for lin in (self.q, self.k, self.v))
        k, v = self.split(self.k(x)), self.split(self.v(x))
        ys = super_attention(qs, k, v, ks, vs, 1.0 / math.sqrt(d // self.heads))
        return a, self.o(z) + ys.reshape(s, d)

    def split(self, x: Tensor) -> Tensor:
        """[n, d] -> [n, h, d'] (a view)."""
        return x.view(x.shape[0], self.heads, x.shape[1] // self.heads)


def block_attention(attn: AttentionParams, graph: ModelGraph, x: Tensor, z: Tensor | None,
                    block_rows: int | None = None, update_super: bool = True
                    ) -> tuple[Tensor, Tensor | None]:
    """A block's attention sublayer on one process: (x W_o + attention of x [N, d], and of
    the super states z [S, d] when given and ``update_super``, else None), with the edge bias
    when the model encodes edge features."""
    assert graph.adj is not None
    if z is None:
        return attn(graph.adj, x, x, block_rows, graph.edge_attr), None
    s, n = z.shape[0], graph.adj.num_rows
    bias = attn.bias(graph.edge_attr)
    if bias is not None:
        bias = edge_bias_with_super(bias, graph.adj, s, n)
    return attn.with_super(graph.super_adj(s), x, z, block_rows, update_super, bias)


class BlockStack(nn.Module):
    """Input projection, L blocks of ``block_type``, linear classifier: x [N, F] -> [N, C].

    The skeleton shared by the gt and gps models and by their distributed copies, which reuse
    the parameters as they are and replace only how one block runs (``run``'s ``block``).

    ``edge_dim`` = F_e > 0 gives every block's attention an edge encoder (the graph must then
    carry [E, F_e] edge features). With ``super_nodes`` = S, S learned states [S, d]
    (``super_init``, created after every other parameter so that S = 0 and S > 0 initialise
    the rest alike) run through every block beside the real rows, attended by every node and
    attending to every node; they have no label and no dropout (a mask is keyed on a node id,
    and they have none).
    """

    block_type: type[nn.Module]

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2,
                 heads: int = 8, dropout: float = 0.5, input_dropout: float | None = None,
                 ffn_mult: int = 2, block_rows: int | None = None, seed: int = 0,
                 super_nodes: int = 0, edge_dim: int = 0, norm: str = "layer",
                 pre_norm: bool = False, jk: str = "none", checkpoint: bool = False) -> None:
        super().__init__()
        if super_nodes < 0:
            raise ValueError(f"model.super_nodes must be >= 0, got {super_nodes}")
        if super_nodes and norm == "batch":
            raise ValueError("BatchNorm with super nodes: the super rows have no batch")
        self.input = nn.Linear(in_dim, hidden)
        self.blocks = nn.ModuleList(
            self.block_type(hidden, heads, ffn_mult, dropout, edge_dim, norm, pre_norm)
            for _ in range(num_layers)
        )
        self.jk = jk
        self.classifier = nn.Linear(hidden * (num_layers if jk == "cat" else 1), out_dim)
        self.pre_norm = pre_norm
        # pre-norm leaves the residual stream raw: one norm before the classifier (of the
        # classifier's input width)
        self.final_norm = make_norm(norm, self.classifier.in_features) if pre_norm else None
        self.dropout = dropout
        self.input_dropout = dropout if input_dropout is None else input_dropout
        self.block_rows = block_rows
        self.checkpoint = checkpoint
        """Recompute each block's activations in backward (:mod:`plexgt.models.recompute`):
        [n, d] kept per block instead of its attention and FFN activations."""
        self.seed = seed
        self.step = 0
        """Training forwards so far: the step key of the dropout masks (checkpointed)."""
        self.super_nodes = super_nodes
        if super_nodes:
            self.super_init = nn.Parameter(torch.randn(super_nodes, hidden))

    def run(self, x: Features, graph: Any, block: Block, nf: NormFn = apply_norm) -> Tensor:
        """Dropout, projection, ``block(blk, h, graph, block_rows, drop, z, update_super,
        nf)`` per block, jumping knowledge over the blocks' outputs, the final norm
        (pre-norm), classifier. Sites: 0 input, 1 before the classifier, 8(i+1)+k inside
        block i. The last block leaves the super states alone (nothing reads them after
        it)."""
        drop = Drop(step_rng(self.seed, self.step, graph.node_ids, x, self.training), 0.0)
        h = linear_in(drop.at(0, self.input_dropout).features(x), self.input)
        z = self.super_init.to(h.dtype) if self.super_nodes else None
        last = len(self.blocks) - 1
        outs = []
        for i, blk in enumerate(self.blocks):
            h, z = checkpointed(block, blk, h, graph, self.block_rows,
                                drop.at(BLOCK_SITES * (i + 1), blk.dropout), z, i < last, nf,
                                enabled=self.checkpoint)
            if self.jk != "none":
                outs.append(h)
        if self.jk != "none":
            h = jk_combine(outs, self.jk)
        if self.final_norm is not None:
            h = nf(self.final_norm, h)
        h = drop.at(1, self.dropout)(h)
        if self.training:
            self.step += 1
        return self.classifier(h)
