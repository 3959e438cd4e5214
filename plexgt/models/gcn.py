"""Kipf & Welling GCN: L layers of H' = ReLU(Â H W + b), dropout before every layer, with
the grid3d models' options (:class:`~plexgt.models.stack.GCNArch`).

Shapes: x [N, F] (dense or sparse CSRGraph features) -> logits [N, C]; graph.gcn [N, N].
"""

from __future__ import annotations

from plexgt.models.spec import ModelSpec
from plexgt.models.stack import (  # noqa: F401 - the chain's names, also read from here
    PLAIN,
    GCNArch,
    GCNOp,
    LayerStack,
    gcn_ops,
    jk_hops,
    layer_widths,
    norm_widths,
    op_widths,
)


class GCN(LayerStack):
    """L GCN layers (``layers.{l}``: weights and bias), ReLU between them."""

    operators = ("gcn",)


SPEC = ModelSpec("gcn", "graph convolutional network (Kipf & Welling): H' = Â H W + b", GCN,
                 "grid3d", ("gcn",))
