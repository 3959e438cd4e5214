"""GraphSAGE with the mean aggregator: H' = ReLU(M · (H W_n) + b + H W_s), M = D^-1 A.

Shapes: x [N, F] -> logits [N, C]; graph.mean [N, N] (``ModelGraph.from_edges(mean=True)``).

The sum form of Hamilton et al.'s concatenation (``[H, M H] · [W_s; W_n]`` is the same
product) and PyG's ``SAGEConv(aggr="mean")``: W_n (``layers.{l}``, with the bias) on the
neighbours' mean, W_s (``self_layers.{l}``, no bias) on the node itself. Why the sum form:
each of W_n and W_s has gcn's weight shape, so the 3D grid shards both as it shards gcn's
one; the concatenated [2d, d'] weight would need a layout of its own.

M averages the prepared pattern's row: the node itself is one of its neighbours when prep
stored self loops (its default), as when PyG's SAGEConv runs on a graph with self loops
added; prep --no-self-loops gives the mean over the other neighbours only. A node with no
entry in its row averages nothing (0).
"""

from __future__ import annotations

from plexgt.models.spec import ModelSpec
from plexgt.models.stack import LayerStack


class SAGE(LayerStack):
    """L GraphSAGE-mean layers, ReLU between them."""

    operators = ("mean", "self")


SPEC = ModelSpec("sage", "GraphSAGE, mean aggregation: H' = D^-1 A H W_n + H W_s + b", SAGE,
                 "grid3d", SAGE.operators, plan_as="gcn")
