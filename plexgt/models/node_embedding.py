"""Learnable node embeddings: a trained input for graphs without (enough) features.

A node's input row is [x_v, e_v]: its F stored features, then D learned columns (an embedding
table [N, D], ``model.node_embedding = D``). Every layout holds the table's rows and columns
where it holds the input's — rows with the node partition, columns with the first layer's
input columns (:class:`NodeEmbedding` is one such block) — so nothing is replicated and no
gradient is communicated: the table's gradient is the input's, which each layout's backward
already produces for its own block.

Why initialise from counters, not torch's stream: the entry (node v, column j) is a function
of (seed, v, j) alone (:meth:`~plexgt.ops.rng.CounterRNG.normal`), so every grid, world size
and strategy starts from the single-process model's table, and training curves agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from plexgt.ops.rng import CounterRNG

EMBED_SITE = 1 << 20
"""The counter site of the table's initial values (dropout sites are small layer numbers)."""


class NodeEmbedding(nn.Module):
    """A block of the [N, D] embedding table: rows ``ids`` (original node ids of this block's
    real rows, in the block's order), table columns [col0, col0 + width).

    forward(x) adds the block into the input x [rows_pad, w] at columns [at, at + width) (x is
    zero there: the loader pads feature columns past F), rows beyond ``ids`` (padding) left
    zero. ``position`` (the block's first row in the table's stored order) and ``shape``
    ([N, D]) place it in a checkpoint.
    """

    def __init__(self, ids: torch.Tensor, col0: int, width: int, at: int, seed: int,
                 position: int, shape: tuple[int, int], dtype: torch.dtype = torch.float32
                 ) -> None:
        super().__init__()
        init = CounterRNG(seed, 0, ids.to(torch.int64)).normal(EMBED_SITE, width, col0,
                                                               torch.device("cpu"))
        self.weight = nn.Parameter(init.to(dtype))
        self.col0, self.at, self.position, self.shape = col0, at, position, shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, m = self.weight.shape
        if k == 0 or m == 0:
            # an empty block (input columns of features only, or no rows) still joins the
            # autograd graph: every rank then runs the first layer's input-gradient
            # collectives (the all-gather's adjoint), which a rank without a trainable input
            # would skip, leaving the others waiting
            return x + self.weight.sum().to(x.dtype)
        right, bottom = x.shape[1] - self.at - m, x.shape[0] - k
        return x + F.pad(self.weight.to(x.dtype), (self.at, right, 0, bottom))
