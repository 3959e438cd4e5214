"""The 1D node partition of graph transformers: what a rank reads, its loss, its gradient sync.

Rank i of a p-rank group holds nodes [lo, hi) = block i of p in Q order (``block_bounds``),
padded to n = ceil(N/p) rows so that every collective moves equal shards:

=====================  ============================  ==========================================
tensor                 shape on the rank             split
=====================  ============================  ==========================================
features x             [n, F]                        rows over the group (zero padding rows)
labels, split masks    [n]; multi-label [n, T]       rows over the group (-1 / False padding)
attention pattern      [n, p·n], [a·n, p·n]          node partition, gp_2d's head group,
                       or [p·n, p·n]                 or head partition (GP-A2A)
GCN Â rows (gps)       [n, p·n] weighted             rows over the group, all columns
parameters             as the reference model        replicated; gradients all-reduced
=====================  ============================  ==========================================

Double permutation makes every block's edge count about E/p, so no rank waits for another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from plexgt.distributed.collectives import (
    Comm,
    CommLedger,
    all_gather,
    all_gather_uneven,
    all_reduce_,
)
from plexgt.distributed.grid import Grid3D, block_bounds
from plexgt.models.layers import Features, sparse_features
from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import gcn_norm
from plexgt.parallel.attention.strategy import (
    AttentionShard,
    AttentionStrategy,
    make_shard,
    pad_rows,
)
from plexgt.parallel.redistribute import build_gcn3d_path

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
    node_ids: Tensor | None = None
    """[n] original node id of each local row (padded ids >= N): the dropout masks' row key,
    so every partition drops what the single process drops."""

    @property
    def comm(self) -> Comm:
        return self.attention.comm

    def to(self, device: torch.device | str) -> DistGraph:
        """The same operators on ``device`` (the attention pattern with its cached transpose,
        the 1D Â rows, and the 3D path's Â blocks)."""

        att = self.attention.to(device)
        gcn = None if self.gcn is None else self.gcn.to(device)
        path = self.gcn3d
        if path is not None:
            adj = path.adj
            adj.fwd = [m.to(device) for m in adj.fwd]
            adj.bwd = [m.to(device) for m in adj.bwd]
        ids = None if self.node_ids is None else self.node_ids.to(device)
        return DistGraph(att, gcn, path, ids)


@dataclass
class RowData:
    """This rank's node data, padded to n = ceil(N/p) rows."""

    rows: Range
    x: Features
    """[n, F] features (dense, or a weighted CSRGraph for CSR-stored ones)."""
    labels: Tensor
    """[n] int64 (-1: unlabelled or padding)."""
    masks: dict[str, Tensor]
    """'train' / 'valid' / 'test' -> [n] bool."""

    def to(self, device: torch.device | str) -> RowData:
        return RowData(self.rows, self.x.to(device), self.labels.to(device),
                       {k: m.to(device) for k, m in self.masks.items()})

    @classmethod
    def from_arrays(cls, rows: Range, x: np.ndarray | sp.spmatrix, labels: np.ndarray,
                    masks: dict[str, np.ndarray], dtype: torch.dtype) -> RowData:
        """From a loader's padded arrays (features [n, F] dense, or scipy sparse: kept sparse
        as a weighted CSRGraph; labels [n]; masks [n])."""
        xt = (sparse_features(x, dtype=dtype) if sp.issparse(x)
              else torch.from_numpy(np.ascontiguousarray(x)).to(dtype))
        return cls(rows, xt,
                   torch.from_numpy(labels.astype(np.int64)),
                   {k: torch.from_numpy(m.astype(bool)) for k, m in masks.items()})


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


def build_dist_graph(n: int, mine: sp.csr_matrix, comm: Comm, strategy: AttentionStrategy,
                     heads: int, held: sp.csr_matrix | None = None, gcn: bool = False,
                     dtype: torch.dtype = torch.float32, setup_ledger: CommLedger | None = None,
                     grid: Grid3D | None = None, axis_comms: dict[str, Comm] | None = None,
                     gcn3d_rows: sp.csr_matrix | None = None,
                     block_rows: int | None = None, groups: dict[str, Comm] | None = None,
                     head_parallel: int = 1, ring_chunks: int = 1, super_nodes: int = 0,
                     edge_attr: Tensor | None = None) -> DistGraph:
    """This rank's sparse operators from its pattern rows ``mine`` [hi-lo, N] of Q A Qᵀ (block
    ``comm.rank`` of ``comm.size``; ``held``: the rows the strategy stores when they are not
    those, :meth:`~plexgt.parallel.attention.strategy.AttentionStrategy.rows_held`: every row
    for GP-A2A, the head group's for gp_2d, which also needs its ``groups``,
    ``head_parallel`` and the ring's ``ring_chunks``; ``super_nodes``: the S super columns of
    every real row; ``edge_attr``: [E, F_e] features of the stored pattern's edges, CSR order)
    and, for gps, its GCN operator: Â rows
    (1D path) or, given a ``grid`` of the group's ranks, its ``axis_comms`` ('x', 'y', 'z')
    and the pattern rows of its 3D block ``gcn3d_rows``
    (:func:`~plexgt.parallel.redistribute.gcn3d_rows`), its Â block of the 3D path
    (``block_rows``: Plexus' blocked aggregation). Setup collectives (the global degrees) go
    to ``setup_ledger`` (fresh if None)."""
    lo, hi = block_bounds(n, comm.size, comm.rank)
    own = CSRGraph.from_scipy(mine, keep_values=False)
    if strategy.rows_held(n, comm.size, comm.rank, head_parallel) == (lo, hi):
        adj = own
    elif held is None:
        raise ValueError(f"{strategy.name} needs pattern rows beyond the rank's own block")
    else:
        adj = CSRGraph.from_scipy(held, keep_values=False)
    shard = make_shard(strategy, comm, n, heads, adj, groups, head_parallel, ring_chunks,
                       super_nodes, edge_attr)
    norm = path = None
    if gcn:
        setup = Comm(comm.group, comm.size, comm.rank, comm.name, setup_ledger or CommLedger())
        if grid is None:
            norm = gcn_rows(own, lo, setup, dtype)
        else:
            if gcn3d_rows is None:
                raise ValueError("the 3D GCN path needs its pattern rows (gcn3d_rows)")
            deg = global_degrees(own, lo, setup).numpy()
            path = build_gcn3d_path(gcn3d_rows, n, grid, {**(axis_comms or {}), "rows": comm},
                                    deg, dtype, block_rows)
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
    # counted on the device, one copy to the host at the end (one sync per evaluation)
    counts = torch.stack([torch.stack([((pred == labels) & m).sum(), m.sum()])
                          for m in masks.values()]).to(torch.int64)
    all_reduce_(counts, comm)
    return {k: (c[0], c[1]) for k, c in zip(masks, counts.cpu().tolist())}


def row_binary_cross_entropy(logits: Tensor, labels: Tensor, mask: Tensor, comm: Comm
                             ) -> Tensor:
    """Multi-label tasks: mean per-task binary cross-entropy over the labelled (node, task)
    pairs of the masked rows of all ranks; logits, labels [n, T] rows over ``comm`` (label -1:
    that task is unlabelled for the node, it weighs nothing).

    The gradient is this rank's share, as :func:`row_cross_entropy`'s: one all-reduce of 2
    elements (sum, count), outside autograd.
    """
    known = (labels >= 0) & mask[:, None]
    w = known.to(logits.dtype)
    local = F.binary_cross_entropy_with_logits(logits, labels.clamp(min=0).to(logits.dtype),
                                               weight=w, reduction="sum")
    stats = torch.stack([local.detach(), w.sum()])
    all_reduce_(stats, comm)
    count = stats[1].clamp(min=1)
    mine = local / count
    return mine + (stats[0] / count - mine).detach()


@torch.no_grad()
def row_scores(logits: Tensor, labels: Tensor, masks: dict[str, Tensor], comm: Comm
               ) -> dict[str, tuple[Tensor, Tensor]]:
    """(score, label) of every labelled node of each split, gathered to every rank (in rank
    order). Binary tasks (labels [n]): score [k] = logit_1 - logit_0, a monotone function of
    the positive class's probability, which is all a ROC curve reads. Multi-label (labels
    [n, T]): scores [k, T] = the logits, labels [k, T] (-1 kept: the metric skips them)."""
    multi = labels.ndim == 2
    score = logits.double() if multi else (logits[:, 1] - logits[:, 0]).double()[:, None]
    return gather_scores(score, labels, masks, comm)


@torch.no_grad()
def gather_scores(score: Tensor, labels: Tensor, masks: dict[str, Tensor], comm: Comm
                  ) -> dict[str, tuple[Tensor, Tensor]]:
    """score [n, w] float64 and labels [n] or [n, w] of this rank's rows -> per split the
    masked rows of every rank over ``comm``, in rank order: (score [k], label [k]) for class
    labels, [k, w] each for multi-label ones. One uneven all-gather per split."""
    multi = labels.ndim == 2
    lab = labels.double().reshape(labels.shape[0], -1)
    t = score.shape[1]
    out = {}
    for k, m in masks.items():
        got = all_gather_uneven(torch.cat([score[m], lab[m]], dim=1), comm)
        s, y = got[:, :t], got[:, t:].long()
        out[k] = (s, y) if multi else (s[:, 0], y[:, 0])
    return out


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


class _SyncOnBackward(torch.autograd.Function):
    """Identity whose backward queues the gradient all-reduce for the end of the pass."""

    @staticmethod
    def forward(ctx: Any, out: Tensor, owner: RowParallel) -> Tensor:
        ctx.owner = owner
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Any, ...]:
        owner = ctx.owner
        torch.autograd.Variable._execution_engine.queue_callback(  # type: ignore[attr-defined]
            lambda: all_reduce_gradients(owner.model, owner.comm))
        return g, None


class RowParallel(nn.Module):
    """A row-partitioned model (DistGraphTransformer / DistGPS) with its graph: x -> logits,
    parameter gradients summed over ``comm`` after each backward."""

    def __init__(self, model: nn.Module, graph: DistGraph, comm: Comm) -> None:
        super().__init__()
        self.model = model
        self.graph = graph
        self.comm = comm

    def to_canonical(self, local: dict[str, Tensor]) -> dict[str, Tensor]:
        """Parameter-shaped tensors keyed by parameter name -> the single-process model's
        names (parameters are replicated: the same tensors, without the wrapper's prefix)."""
        return {k.removeprefix("model."): v.detach().cpu() for k, v in local.items()}

    def from_canonical(self, full: dict[str, Tensor]) -> dict[str, Tensor]:
        """The inverse of :meth:`to_canonical`, on the local tensors' device and dtype (the
        parameters, and the persistent buffers ``full`` holds)."""
        return {k: full[k.removeprefix("model.")].to(t.device, t.dtype)
                for k, t in self.state_dict().items() if k.removeprefix("model.") in full}

    def counted(self, name: str) -> bool:  # noqa: ARG002 - every parameter alike
        """Whether this rank counts parameter ``name`` in a global sum over ranks: the
        parameters are replicated (their gradients summed), so rank 0 counts them all."""
        return self.comm.rank == 0

    @property
    def step(self) -> int:
        """The wrapped model's training-step counter (the dropout key; checkpointed)."""
        return int(self.model.step)

    @step.setter
    def step(self, value: int) -> None:
        self.model.step = int(value)

    def forward(self, x: Any) -> Tensor:
        out = self.model(x, self.graph)
        if torch.is_grad_enabled() and out.requires_grad and self.comm.size > 1:
            out = _SyncOnBackward.apply(out, self)
        return out
