"""The 1D node partition of graph transformers: what a rank reads, its loss, its gradient sync.

Rank i of a p-rank group holds nodes [lo, hi) = block i of p in Q order (``block_bounds``),
padded to n = ceil(N/p) rows so that every collective moves equal shards:

=====================  ============================  ==========================================
tensor                 shape on the rank             split
=====================  ============================  ==========================================
features x             [n, F]                        rows over the group (zero padding rows)
labels, split masks    [n]                           rows over the group (-1 / False padding)
attention pattern      [n, p·n] or [p·n, p·n]        node- or head-partitioned strategy
GCN Â rows (gps)       [n, p·n] weighted             rows over the group, all columns
parameters             as the reference model        replicated; gradients all-reduced
=====================  ============================  ==========================================

Double permutation makes every block's edge count about E/p, so no rank waits for another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plexgt.dist.collectives import Comm, CommLedger, all_gather, all_reduce_
from plexgt.dist.grid import block_bounds
from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import gcn_norm
from plexgt.parallel.strategies import AttentionShard, AttentionStrategy, make_shard, pad_rows

Tensor = torch.Tensor
Range = tuple[int, int]


@dataclass
class DistGraph:
    """The sparse operators a distributed gt / gps forward needs on one rank."""

    attention: AttentionShard
    gcn: CSRGraph | None = None
    """[n, p·n] rows of Â = D^-1/2 (A + I) D^-1/2 (gps, 1D GCN path), columns in Q order."""
    gcn3d: Any = None
    """:class:`~plexgt.parallel.redistribute.Plexus3DPath` (gps, 3D GCN path) or None."""

    @property
    def comm(self) -> Comm:
        return self.attention.comm

    def to(self, device: torch.device | str) -> DistGraph:
        """The same operators on ``device`` (the attention pattern with its cached transpose,
        the 1D Â rows, and the 3D path's Â blocks)."""
        import dataclasses

        att = dataclasses.replace(self.attention, graph=self.attention.graph.to(device))
        gcn = None if self.gcn is None else self.gcn.to(device)
        path = self.gcn3d
        if path is not None:
            adj = path.adj
            adj.fwd = [m.to(device) for m in adj.fwd]
            adj.bwd = [m.to(device) for m in adj.bwd]
        return DistGraph(att, gcn, path)


@dataclass
class RowData:
    """This rank's node data, padded to n = ceil(N/p) rows."""

    rows: Range
    x: Tensor
    """[n, F] features."""
    labels: Tensor
    """[n] int64 (-1: unlabelled or padding)."""
    masks: dict[str, Tensor]
    """'train' / 'valid' / 'test' -> [n] bool."""

    def to(self, device: torch.device | str) -> RowData:
        return RowData(self.rows, self.x.to(device), self.labels.to(device),
                       {k: m.to(device) for k, m in self.masks.items()})


def read_adjacency_q(pg: object, rows: Range | None = None) -> CSRGraph:
    """Rows ``rows`` of Q A Qᵀ against all N columns (as :func:`~plexgt.data.loader.
    read_row_block`, without reading features): A2 = Q A Pᵀ relabelled P -> Q."""
    a2 = pg.read_adjacency("A2", rows, None).tocoo()  # type: ignore[attr-defined]
    perm_p, perm_q = pg.read_perm("P"), pg.read_perm("Q")  # type: ignore[attr-defined]
    qinv = np.empty_like(perm_q)
    qinv[perm_q] = np.arange(perm_q.size, dtype=perm_q.dtype)
    return CSRGraph.from_coo(a2.row, qinv[perm_p[a2.col]], a2.shape[0], a2.shape[1])


def read_rows(pg: object, p: int, i: int, dtype: torch.dtype = torch.float32) -> RowData:
    """Features, labels and split masks of block i of p (Q order), padded to ceil(N/p) rows."""
    n = pg.N  # type: ignore[attr-defined]
    lo, hi = block_bounds(n, p, i)
    n_loc = -(-n // p)
    feats = pg.read_features((lo, hi))  # type: ignore[attr-defined]
    x = torch.zeros(n_loc, feats.shape[1], dtype=dtype)
    x[: hi - lo] = torch.from_numpy(np.asarray(feats, dtype=np.float64)).to(dtype)
    labels = torch.full((n_loc,), -1, dtype=torch.int64)
    labels[: hi - lo] = torch.from_numpy(pg.read_labels((lo, hi), "Q").astype(np.int64))  # type: ignore[attr-defined]
    masks = {}
    for s in ("train", "valid", "test"):
        m = torch.zeros(n_loc, dtype=torch.bool)
        m[: hi - lo] = torch.from_numpy(pg.read_mask(s, (lo, hi), "Q").astype(bool))  # type: ignore[attr-defined]
        masks[s] = m
    return RowData((lo, hi), x, labels, masks)


def global_degrees(block: CSRGraph, lo: int, comm: Comm) -> Tensor:
    """[N] int64 row counts of A + I (self loops merged, as :func:`~plexgt.ops.gcn.gcn_norm`
    counts them) from each rank's rows [lo, lo+r) x N: one all-gather of [ceil(N/p)] over
    ``comm`` (setup traffic; give ``comm`` its own ledger to keep it apart)."""
    r, n_all = block.num_rows, block.num_cols
    n_loc = -(-n_all // comm.size)
    loops = torch.arange(r, dtype=torch.int64)
    merged = CSRGraph.from_coo(torch.cat([block.row.cpu(), loops]),
                               torch.cat([block.indices.cpu(), loops + lo]), r, n_all)
    deg = torch.zeros(n_loc, dtype=torch.int64)
    deg[:r] = merged.degrees()
    return all_gather(deg.to(_comm_device(comm)), comm, dim=0)[:n_all].cpu()


def _comm_device(comm: Comm) -> torch.device:
    """Where ``comm``'s tensors must live: the current GPU for NCCL, else the CPU."""
    if comm.group is not None:
        import torch.distributed as dist

        if dist.get_backend(comm.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gcn_rows(block: CSRGraph, lo: int, comm: Comm, dtype: torch.dtype) -> CSRGraph:
    """Rows [lo, lo+r) of Â = D^-1/2 (A + I) D^-1/2, padded to [n, p·n] (column degrees from
    :func:`global_degrees`)."""
    n_all = block.num_cols
    p = comm.size
    n_loc = -(-n_all // p)
    col_deg = global_degrees(block, lo, comm)
    norm = gcn_norm(block, self_loops=True, row_offset=lo, col_degrees=col_deg, dtype=dtype)
    g = pad_rows(norm, n_loc, p * n_loc)
    g.transpose()
    return g


def build_dist_graph(pg: object, comm: Comm, strategy: AttentionStrategy, heads: int,
                     gcn: bool = False, dtype: torch.dtype = torch.float32,
                     setup_ledger: CommLedger | None = None, grid: Any = None,
                     axis_comms: dict[str, Comm] | None = None,
                     block_rows: int | None = None) -> DistGraph:
    """Read this rank's attention pattern (its rows, or all rows for a full-graph strategy)
    and, for gps, its GCN operator: Â rows (1D path) or, given a ``grid`` of the group's
    ranks and its ``axis_comms`` ('x', 'y', 'z'), its Â block of the 3D path (``block_rows``:
    Plexus' blocked aggregation). Setup collectives go to ``setup_ledger`` (fresh if None)."""
    n = pg.N  # type: ignore[attr-defined]
    lo, hi = block_bounds(n, comm.size, comm.rank)
    mine = read_adjacency_q(pg, (lo, hi))
    adj = read_adjacency_q(pg) if strategy.full_graph else mine
    shard = make_shard(strategy, comm, n, heads, adj)
    norm = path = None
    if gcn:
        setup = Comm(comm.group, comm.size, comm.rank, comm.name, setup_ledger or CommLedger())
        if grid is None:
            norm = gcn_rows(mine, lo, setup, dtype)
        else:
            from plexgt.parallel.redistribute import build_gcn3d_path

            deg = global_degrees(mine, lo, setup).numpy()
            path = build_gcn3d_path(pg, grid, {**(axis_comms or {}), "rows": comm}, deg,
                                    dtype, block_rows)
    return DistGraph(shard, norm, path)


def row_cross_entropy(logits: Tensor, labels: Tensor, mask: Tensor, comm: Comm) -> Tensor:
    """Mean cross-entropy over the masked rows of all ranks: logits [n, C] rows over ``comm``.

    The value is the global mean on every rank; the gradient is this rank's share only
    (sum of its rows' losses / global count), so summing gradients over ranks — the
    all-reduce of :func:`all_reduce_gradients` — gives the reference gradient. One all-reduce
    of 2 elements (sum, count), outside autograd.
    """
    local = F.cross_entropy(logits[mask], labels[mask], reduction="sum")
    stats = torch.stack([local.detach(), mask.sum().to(logits.dtype)])
    all_reduce_(stats, comm)
    count = stats[1].clamp(min=1)
    mine = local / count
    return mine + (stats[0] / count - mine).detach()


@torch.no_grad()
def row_correct(logits: Tensor, labels: Tensor, masks: dict[str, Tensor], comm: Comm
                ) -> dict[str, tuple[int, int]]:
    """(correct, total) per split over all ranks (argmax; ties take the lowest class id)."""
    pred = logits.argmax(dim=1)
    counts = torch.tensor([[int(((pred == labels) & m).sum()), int(m.sum())]
                           for m in masks.values()], dtype=torch.int64, device=logits.device)
    all_reduce_(counts, comm)
    return {k: (int(c[0]), int(c[1])) for k, c in zip(masks, counts)}


@torch.no_grad()
def all_reduce_gradients(module: nn.Module, comm: Comm) -> None:
    """Sum every parameter's gradient over ``comm`` in one flat all-reduce.

    Parameters are replicated and each rank's backward only saw its rows, so the true gradient
    is the sum over ranks (one call rather than one per tensor: latency, not bytes, dominates
    small parameters). Missing gradients count as zeros and are filled in.
    """
    params = list(module.parameters())
    if comm.size == 1 or not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])
    all_reduce_(flat, comm)
    off = 0
    for p in params:
        k = p.numel()
        p.grad = flat[off:off + k].view_as(p).clone()
        off += k
