"""Sparse graph transformer (Dwivedi & Bresson / UniMP style) over the graph's edges.

Shapes: x [N, F] (dense or sparse features) -> logits [N, C]; graph.adj [N, N] structural.
Block: X1 = LN(X + X W_o + softmax(Q Kᵀ/sqrt(d') ⊙ A) V); X2 = LN(X1 + FFN(X1)) (the
norm may be BatchNorm or none, and pre-norm: :class:`GTBlock`).
Attention is restricted to graph neighbours (exact, no sampling), so the layer costs
O(E h + N d²) instead of O(N² d).
"""

from __future__ import annotations

import torch
from torch import nn

from plexgt.models.layers import (
    NO_DROP,
    AttentionParams,
    BlockStack,
    Drop,
    Features,
    ModelGraph,
    NormFn,
    apply_norm,
    block_attention,
    ffn,
    make_norm,
    residual_norm,
)
from plexgt.models.spec import ModelSpec


class GTBlock(nn.Module):
    """One attention sublayer + one FFN sublayer, each with a residual: post-norm
    X1 = N1(X + A(X)), X2 = N2(X1 + F(X1)), or pre-norm X1 = X + A(N1(X)),
    X2 = X1 + F(N2(X1)). N is ``norm`` ('layer', 'batch' or 'none')."""

    def __init__(self, dim: int, heads: int, ffn_mult: int = 2, dropout: float = 0.0,
                 edge_dim: int = 0, norm: str = "layer", pre_norm: bool = False) -> None:
        super().__init__()
        self.attn = AttentionParams(dim, heads, edge_dim)
        self.norm1 = make_norm(norm, dim)
        self.ffn1 = nn.Linear(dim, ffn_mult * dim)
        self.ffn2 = nn.Linear(ffn_mult * dim, dim)
        self.norm2 = make_norm(norm, dim)
        self.dropout = dropout
        self.pre_norm = pre_norm

    def forward(self, x: torch.Tensor, graph: ModelGraph, block_rows: int | None = None,
                drop: Drop = NO_DROP, z: torch.Tensor | None = None, update_super: bool = True,
                nf: NormFn = apply_norm) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [N, d] and super states z [S, d] (or None) -> both after the block (z: None
        unless ``update_super``)."""
        a, az = block_attention(self.attn, graph, self.attention_input(x, nf),
                                None if z is None else self.attention_input(z, nf),
                                block_rows, update_super)
        return self.tail(x, a, drop, nf), None if az is None else self.tail(z, az, nf=nf)

    def attention_input(self, x: torch.Tensor, nf: NormFn = apply_norm) -> torch.Tensor:
        """What the attention reads of the block input x [n, d]: N1(x) pre-norm, else x."""
        return nf(self.norm1, x) if self.pre_norm else x

    def tail(self, x: torch.Tensor, a: torch.Tensor, drop: Drop = NO_DROP,
             nf: NormFn = apply_norm) -> torch.Tensor:
        """Everything after attention (row-local but for a BatchNorm's statistics): x [n, d]
        and its attention a [n, d] -> the block's output. Dropout sites: 0 attention
        residual, 1 inside the FFN, 2 FFN residual."""
        if self.pre_norm:
            x = x + drop.sub(0)(a)
            return x + drop.sub(2)(ffn(nf(self.norm2, x), self.ffn1, self.ffn2, drop.sub(1)))
        x = residual_norm(x, a, self.norm1, drop.sub(0), nf)
        f = ffn(x, self.ffn1, self.ffn2, drop.sub(1))
        return residual_norm(x, f, self.norm2, drop.sub(2), nf)


class GraphTransformer(BlockStack):
    """Input projection, L GT blocks, linear classifier."""

    block_type = GTBlock

    def forward(self, x: Features, graph: ModelGraph) -> torch.Tensor:
        if graph.adj is None:
            raise ValueError("GraphTransformer needs graph.adj")
        return self.run(x, graph, lambda blk, h, g, br, dr, z, up, nf: blk(h, g, br, dr, z, up,
                                                                            nf))


SPEC = ModelSpec("gt", "sparse graph transformer: attention over each node's edges, FFN",
                 GraphTransformer, "attention")
