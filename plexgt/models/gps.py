"""GraphGPS-style hybrid: every block sums a GCN (local) path and a sparse-attention path.

Shapes: x [N, F] (dense or sparse features) -> logits [N, C]; needs graph.gcn and graph.adj.
Block: L = LN(X + Â X W_g + b_g); G = LN(X + X W_o + softmax(QKᵀ/sqrt(d') ⊙ A) V);
X' = LN(H + FFN(H)) with H = L + G (Rampášek et al., with the attention restricted to edges);
the norm may be BatchNorm or none, and pre-norm (:class:`GPSBlock`).
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
    gcn_conv,
    make_norm,
    residual_norm,
)
from plexgt.models.spec import ModelSpec


class GPSBlock(nn.Module):
    """Post-norm (module docstring), or pre-norm: H = X + Â N_l(X) W_g + b_g + attention of
    N_a(X); X' = H + FFN(N_o(H)). N is ``norm`` ('layer', 'batch' or 'none')."""

    def __init__(self, dim: int, heads: int, ffn_mult: int = 2, dropout: float = 0.0,
                 edge_dim: int = 0, norm: str = "layer", pre_norm: bool = False) -> None:
        super().__init__()
        self.local = nn.Linear(dim, dim)
        self.norm_local = make_norm(norm, dim)
        self.attn = AttentionParams(dim, heads, edge_dim)
        self.norm_attn = make_norm(norm, dim)
        self.ffn1 = nn.Linear(dim, ffn_mult * dim)
        self.ffn2 = nn.Linear(ffn_mult * dim, dim)
        self.norm_out = make_norm(norm, dim)
        self.dropout = dropout
        self.pre_norm = pre_norm

    def forward(self, x: torch.Tensor, graph: ModelGraph, block_rows: int | None = None,
                drop: Drop = NO_DROP, z: torch.Tensor | None = None, update_super: bool = True,
                nf: NormFn = apply_norm) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [N, d] and super states z [S, d] (or None) -> both after the block (z: None
        unless ``update_super``)."""
        assert graph.gcn is not None and graph.adj is not None
        xl, xa = self.path_inputs(x, nf)
        g = gcn_conv(graph.gcn, xl, self.local)
        za = None if z is None else self.path_inputs(z, nf)[1]
        a, az = block_attention(self.attn, graph, xa, za, block_rows, update_super)
        zo = None if az is None else self.tail(z, self.super_local(z), az, nf=nf)
        return self.tail(x, g, a, drop, nf), zo

    def path_inputs(self, x: torch.Tensor, nf: NormFn = apply_norm
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What the GCN and the attention path read of the block input x [n, d]: (N_l(x),
        N_a(x)) pre-norm, else (x, x)."""
        if not self.pre_norm:
            return x, x
        return nf(self.norm_local, x), nf(self.norm_attn, x)

    def super_local(self, z: torch.Tensor) -> torch.Tensor:
        """The GCN path of super rows [S, d]: they are in no edge of Â, so only its bias."""
        b = self.local.bias
        return torch.zeros_like(z) if b is None else b.expand_as(z)

    def tail(self, x: torch.Tensor, g: torch.Tensor, a: torch.Tensor, drop: Drop = NO_DROP,
             nf: NormFn = apply_norm) -> torch.Tensor:
        """x [n, d], its GCN path g and attention a [n, d] -> the block's output (row-local
        but for a BatchNorm's statistics). Dropout sites: 0 local residual, 1 attention
        residual, 2 inside the FFN, 3 FFN residual."""
        if self.pre_norm:
            h = x + drop.sub(0)(g) + drop.sub(1)(a)
            return h + drop.sub(3)(ffn(nf(self.norm_out, h), self.ffn1, self.ffn2,
                                       drop.sub(2)))
        local = residual_norm(x, g, self.norm_local, drop.sub(0), nf)
        glob = residual_norm(x, a, self.norm_attn, drop.sub(1), nf)
        h = local + glob
        return residual_norm(h, ffn(h, self.ffn1, self.ffn2, drop.sub(2)), self.norm_out,
                             drop.sub(3), nf)


class GPS(BlockStack):
    """Input projection, L GPS blocks, linear classifier."""

    block_type = GPSBlock

    def forward(self, x: Features, graph: ModelGraph) -> torch.Tensor:
        if graph.adj is None or graph.gcn is None:
            raise ValueError("GPS needs graph.adj and graph.gcn")
        return self.run(x, graph, lambda blk, h, g, br, dr, z, up, nf: blk(h, g, br, dr, z, up,
                                                                            nf))


SPEC = ModelSpec("gps", "a GCN path and a sparse attention path in every block (GraphGPS)",
                 GPS, "attention")
