"""Sparse graph transformer (Dwivedi & Bresson / UniMP style) over the graph's edges.

Shapes: x [N, F] (dense or sparse features) -> logits [N, C]; graph.adj [N, N] structural.
Block: X1 = LN(X + X W_o + softmax(Q Kᵀ/sqrt(d') ⊙ A) V); X2 = LN(X1 + FFN(X1)).
Attention is restricted to graph neighbours (exact, no sampling), so the layer costs
O(E h + N d²) instead of O(N² d).
"""

from __future__ import annotations

import torch
from torch import nn

from plexgt.models.layers import (
    AttentionParams,
    Features,
    ModelGraph,
    dropout,
    feature_dropout,
    ffn,
    linear_in,
    residual_norm,
)


class GTBlock(nn.Module):
    """One attention sublayer + one FFN sublayer, each post-norm with a residual."""

    def __init__(self, dim: int, heads: int, ffn_mult: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.attn = AttentionParams(dim, heads)
        self.norm1 = nn.LayerNorm(dim)
        self.ffn1 = nn.Linear(dim, ffn_mult * dim)
        self.ffn2 = nn.Linear(ffn_mult * dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, graph: ModelGraph,
                block_rows: int | None = None) -> torch.Tensor:
        assert graph.adj is not None
        a = self.attn(graph.adj, x, x, block_rows)
        x = residual_norm(x, a, self.norm1, self.dropout, self.training)
        f = ffn(x, self.ffn1, self.ffn2, self.dropout, self.training)
        return residual_norm(x, f, self.norm2, self.dropout, self.training)


class GraphTransformer(nn.Module):
    """Input projection, L GT blocks, linear classifier."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2,
                 heads: int = 8, dropout: float = 0.5, input_dropout: float | None = None,
                 ffn_mult: int = 2, block_rows: int | None = None) -> None:
        super().__init__()
        self.input = nn.Linear(in_dim, hidden)
        self.blocks = nn.ModuleList(
            GTBlock(hidden, heads, ffn_mult, dropout) for _ in range(num_layers)
        )
        self.classifier = nn.Linear(hidden, out_dim)
        self.dropout = dropout
        self.input_dropout = dropout if input_dropout is None else input_dropout
        self.block_rows = block_rows

    def forward(self, x: Features, graph: ModelGraph) -> torch.Tensor:
        if graph.adj is None:
            raise ValueError("GraphTransformer needs graph.adj")
        x = feature_dropout(x, self.input_dropout, self.training)
        h = linear_in(x, self.input)
        for blk in self.blocks:
            h = blk(h, graph, self.block_rows)
        h = dropout(h, self.dropout, self.training)
        return self.classifier(h)
