"""The 1D baseline for a distributed GCN (benchmarks): node rows over p ranks, H all-gathered.

Layer l: H [N/p, d] --all-gather--> [N, d]; Y = Â[rows, :] · H · W + b with W and b replicated
on every rank (their gradients all-reduced). It is what most full-graph systems do; the 3D
algorithm is measured against it (bytes per rank, time per epoch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import scipy.sparse as sp
import torch
from torch import nn

from plexgt.distributed.collectives import Comm, all_gather, replicated
from plexgt.distributed.grid import block_bounds, padded
from plexgt.parallel.operators import gcn_block_values
from plexgt.parallel.plexus_aggregate import BlockedAdjacency, _AggregateAllReduce


class Row1DGCN(nn.Module):
    """GCN on a 1D node partition. x [ceil(N/p), F] (Q order) -> logits [ceil(N/p), C]."""

    def __init__(self, comm: Comm, n: int, dims: Sequence[int], adj: Sequence[sp.csr_matrix],
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.comm = comm
        self.rows_pad = padded(n, comm.size) // comm.size
        self.trivial = Comm.single(comm.name + "-local", comm.ledger)
        self.adj = [BlockedAdjacency(a, (self.rows_pad, self.rows_pad * comm.size), None, dtype)
                    for a in adj]
        self.lins = nn.ModuleList(nn.Linear(a, b, dtype=dtype) for a, b in zip(dims, dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for l, lin in enumerate(self.lins):
            hg = all_gather(h, self.comm, dim=0)
            z = _AggregateAllReduce.apply(hg, self.adj[l], self.trivial)
            w, b = replicated(lin.weight, self.comm), replicated(lin.bias, self.comm)
            h = z @ w.t() + b
            if l < len(self.lins) - 1:
                h = torch.relu(h)
        return h


def read_row1d(pg: Any, p: int, i: int, num_layers: int) -> tuple[list[sp.csr_matrix], Any]:
    """Rank i of p: each layer's normalised Â rows (A1 / A2 alternating) over all columns, and
    the layer-0 feature rows (Q order)."""
    rows = block_bounds(pg.N, p, i)
    adj = []
    for l in range(num_layers):
        which, out_o, in_o = ("A1", "P", "Q") if l % 2 == 0 else ("A2", "Q", "P")
        block = pg.read_adjacency(which, rows, (0, pg.N))
        adj.append(gcn_block_values(block, pg.read_degrees(rows, out_o),
                                    pg.read_degrees((0, pg.N), in_o)))
    return adj, pg.read_features(rows)
