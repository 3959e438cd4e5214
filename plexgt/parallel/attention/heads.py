"""Node partition <-> head partition of a group, by all-to-all (GP-A2A, and gp_2d's inner axis).

Inside a group of a ranks, each holding rows [n, h, d'] (its block of the group's a·n rows):

    nodes_to_heads   [n, h, d'] every head of its rows  ->  [a·n, h_k, d'] its heads of all rows
    heads_to_nodes   the reverse

h_k = h//a (+1 on the first h%a ranks, :func:`~plexgt.parallel.attention.strategy.
head_splits`): uneven splits when a does not divide h, and ranks without a head when h < a;
they still take part in every exchange. Why a module of its own: two strategies move between
the layouts the same way, and strategy modules do not import each other.
"""

from __future__ import annotations

import torch

from plexgt.distributed.collectives import Comm, all_to_all
from plexgt.parallel.attention.strategy import head_splits

Tensor = torch.Tensor


def my_heads(heads: int, comm: Comm) -> tuple[int, int]:
    """The heads [h0, h1) this rank of ``comm`` holds in the head partition."""
    hs = head_splits(heads, comm.size)
    h0 = sum(hs[:comm.rank])
    return h0, h0 + hs[comm.rank]


def nodes_to_heads(x: Tensor, comm: Comm, n_loc: int, heads: int) -> Tensor:
    """[n, h, d'] rows over ``comm`` -> [a·n, h_k, d'] (a view of head-major memory).

    Head-major rows [h, n, d'] are cut by head blocks (h_j·n rows to rank j); rank k
    receives [a, h_k, n, d'], which reordered is [h_k, a·n, d'] in row order.
    """
    hs = head_splits(heads, comm.size)
    h_me, a = hs[comm.rank], comm.size
    d = x.shape[2]
    flat = x.transpose(0, 1).reshape(-1, d)
    got = all_to_all(flat, comm, [hj * n_loc for hj in hs], [h_me * n_loc] * a, dim=0)
    out = got.view(a, h_me, n_loc, d).transpose(0, 1).reshape(h_me, a * n_loc, d)
    return out.transpose(0, 1)


def heads_to_nodes(y: Tensor, comm: Comm, n_loc: int, heads: int) -> Tensor:
    """[a·n, h_k, d'] (head partition) -> [n, h, d'] this rank's rows of every head."""
    hs = head_splits(heads, comm.size)
    h_me, a = hs[comm.rank], comm.size
    d = y.shape[2]
    blocks = y.transpose(0, 1).reshape(h_me, a, n_loc, d).transpose(0, 1).reshape(-1, d)
    got = all_to_all(blocks, comm, [h_me * n_loc] * a, [hj * n_loc for hj in hs], dim=0)
    return got.view(sum(hs), n_loc, d).transpose(0, 1)
