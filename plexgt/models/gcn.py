"""Kipf & Welling GCN: L layers of H' = ReLU(Â H W + b), dropout before every layer.

Shapes: x [N, F] (dense or sparse CSRGraph features) -> logits [N, C]; graph.gcn [N, N].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from plexgt.models.layers import (
    Drop,
    Features,
    ModelGraph,
    gcn_conv,
    num_features,
    step_rng,
)
from plexgt.models.spec import ModelSpec
from plexgt.models.stack import layer_widths  # also the planners' (plan.choose)


class GCN(nn.Module):
    """Plain nn.Linear per layer (weights + bias), so a distributed copy can shard them as is."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2,
                 dropout: float = 0.5, input_dropout: float | None = None, seed: int = 0
                 ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError("num_layers must be >= 1")
        dims = layer_widths(in_dim, hidden, out_dim, num_layers)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = dropout
        self.input_dropout = dropout if input_dropout is None else input_dropout
        self.seed = seed
        self.step = 0
        """Training forwards so far: the step key of the dropout masks."""

    def forward(self, x: Features, graph: ModelGraph) -> torch.Tensor:
        if graph.gcn is None:
            raise ValueError("GCN needs graph.gcn (the normalised adjacency)")
        if num_features(x) != self.layers[0].in_features:
            raise ValueError(f"x has {num_features(x)} features, model expects "
                             f"{self.layers[0].in_features}")
        drop = Drop(step_rng(self.seed, self.step, graph.node_ids, x, self.training), 0.0)
        h: Features = x
        for i, lin in enumerate(self.layers):  # dropout site i: before layer i
            h = drop.at(i, self.input_dropout if i == 0 else self.dropout).features(h)
            h = gcn_conv(graph.gcn, h, lin)
            if i < len(self.layers) - 1:
                h = F.relu(h)
        assert isinstance(h, torch.Tensor)
        if self.training:
            self.step += 1
        return h


SPEC = ModelSpec("gcn", "graph convolutional network (Kipf & Welling): H' = Â H W + b", GCN,
                 "grid3d", ("gcn",))
