"""GraphGPS-style hybrid: every block sums a GCN (local) path and a sparse-attention path.

Shapes: x [N, F] (dense or sparse features) -> logits [N, C]; needs graph.gcn and graph.adj.
Block: L = LN(X + Â X W_g + b_g); G = LN(X + X W_o + softmax(QKᵀ/sqrt(d') ⊙ A) V);
X' = LN(H + FFN(H)) with H = L + G (Rampášek et al., with the attention restricted to edges).
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
    gcn_conv,
    linear_in,
    residual_norm,
)


class GPSBlock(nn.Module):
    def __init__(self, dim: int, heads: int, ffn_mult: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.local = nn.Linear(dim, dim)
        self.norm_local = nn.LayerNorm(dim)
        self.attn = AttentionParams(dim, heads)
        self.norm_attn = nn.LayerNorm(dim)
        self.ffn1 = nn.Linear(dim, ffn_mult * dim)
        self.ffn2 = nn.Linear(ffn_mult * dim, dim)
        self.norm_out = nn.LayerNorm(dim)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, graph: ModelGraph,
                block_rows: int | None = None) -> torch.Tensor:
        assert graph.gcn is not None and graph.adj is not None
        p, t = self.dropout, self.training
        local = residual_norm(x, gcn_conv(graph.gcn, x, self.local), self.norm_local, p, t)
        glob = residual_norm(x, self.attn(graph.adj, x, x, block_rows), self.norm_attn, p, t)
        h = local + glob
        return residual_norm(h, ffn(h, self.ffn1, self.ffn2, p, t), self.norm_out, p, t)


class GPS(nn.Module):
    """Input projection, L GPS blocks, linear classifier."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2,
                 heads: int = 8, dropout: float = 0.5, input_dropout: float | None = None,
                 ffn_mult: int = 2, block_rows: int | None = None) -> None:
        super().__init__()
        self.input = nn.Linear(in_dim, hidden)
        self.blocks = nn.ModuleList(
            GPSBlock(hidden, heads, ffn_mult, dropout) for _ in range(num_layers)
        )
        self.classifier = nn.Linear(hidden, out_dim)
        self.dropout = dropout
        self.input_dropout = dropout if input_dropout is None else input_dropout
        self.block_rows = block_rows

    def forward(self, x: Features, graph: ModelGraph) -> torch.Tensor:
        if graph.adj is None or graph.gcn is None:
            raise ValueError("GPS needs graph.adj and graph.gcn")
        x = feature_dropout(x, self.input_dropout, self.training)
        h = linear_in(x, self.input)
        for blk in self.blocks:
            h = blk(h, graph, self.block_rows)
        h = dropout(h, self.dropout, self.training)
        return self.classifier(h)
