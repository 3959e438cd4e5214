"""The per-node MLP, the no-graph baseline: H' = ReLU(H W + b), gcn's widths and dropout.

Shapes: x [N, F] -> logits [N, C]; the graph is not read. On the 3D grid its one operator is
the identity: each layer moves its rows from the input's split to the output's exactly as
gcn's aggregation does (the same collectives, the same bytes), so what an MLP scores against
gcn on any layout is the graph's contribution alone.
"""

from __future__ import annotations

from plexgt.models.spec import ModelSpec
from plexgt.models.stack import LayerStack


class MLP(LayerStack):
    """L layers of nn.Linear (``layers.{l}``), ReLU between them; the options as gcn's."""

    operators = ("self",)


SPEC = ModelSpec("mlp", "per-node MLP, no graph (a baseline): H' = H W + b", MLP, "grid3d",
                 MLP.operators, plan_as="gcn")
