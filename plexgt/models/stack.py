"""The single-process skeleton of grid3d models other than gcn: L layers of
``H' = ReLU(sum_k Op_k · (H W_k) + b)`` (no ReLU after the last), dropout before every layer.

Shapes: x [N, F] (dense, or sparse as a CSRGraph) -> logits [N, C]; the operators of
:data:`plexgt.models.spec.OPERATORS` read from the :class:`~plexgt.models.layers.ModelGraph`
(``gcn``: graph.gcn, ``mean``: graph.mean, ``self``: none). One nn.Linear per operator and
layer, the first operator's with the bias, so the 3D grid shards each weight exactly as it
shards gcn's (:class:`~plexgt.parallel.plexus3d.Plexus3DGCN`), and the widths, dropout sites
and masks are gcn's: a model differs from gcn in its operators only.
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
    linear_in,
    num_features,
    step_rng,
)
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


class LayerStack(nn.Module):
    """The reference of a grid3d model whose ``operators`` the subclass names."""

    operators: tuple[str, ...] = ()

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2,
                 dropout: float = 0.5, input_dropout: float | None = None, seed: int = 0
                 ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError("num_layers must be >= 1")
        dims = layer_widths(in_dim, hidden, out_dim, num_layers)
        for k, name in enumerate(parameter_lists(self.operators)):
            setattr(self, name, nn.ModuleList(nn.Linear(a, b, bias=k == 0)
                                              for a, b in zip(dims[:-1], dims[1:])))
        self.dropout = dropout
        self.input_dropout = dropout if input_dropout is None else input_dropout
        self.seed = seed
        self.step = 0
        """Training forwards so far: the step key of the dropout masks."""

    def operator_layers(self, l: int) -> list[nn.Linear]:
        """Layer ``l``'s nn.Linear of each operator, in ``operators`` order."""
        return [getattr(self, name)[l] for name in parameter_lists(self.operators)]

    def forward(self, x: Features, graph: ModelGraph | None = None) -> torch.Tensor:
        first = self.operator_layers(0)[0]
        if num_features(x) != first.in_features:
            raise ValueError(f"x has {num_features(x)} features, model expects "
                             f"{first.in_features}")
        ids = None if graph is None else graph.node_ids
        drop = Drop(step_rng(self.seed, self.step, ids, x, self.training), 0.0)
        h: Features = x
        count = len(self.layers)  # type: ignore[arg-type]
        for i in range(count):  # dropout site i: before layer i
            h = drop.at(i, self.input_dropout if i == 0 else self.dropout).features(h)
            terms = [apply_operator(op, graph, h, lin)
                     for op, lin in zip(self.operators, self.operator_layers(i))]
            out = terms[0]
            for t in terms[1:]:
                out = out + t
            h = F.relu(out) if i < count - 1 else out
        assert isinstance(h, torch.Tensor)
        if self.training:
            self.step += 1
        return h
