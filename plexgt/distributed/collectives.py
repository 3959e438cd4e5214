"""Communication as autograd Functions, each paired with its adjoint, and a byte ledger.

Adjoint pairs (what backward calls):

=================  =================
forward            backward
=================  =================
all_gather         reduce_scatter
reduce_scatter     all_gather
all_reduce         all_reduce
all_to_all         all_to_all (splits swapped)
shift (+k)         shift (-k)
=================  =================

Every call, forward or backward, records what this rank sends and receives in a
:class:`CommLedger`, keyed by the group's name (a grid axis such as 'x', or a plane) and the
operation. The per-rank byte counts follow the bandwidth-optimal algorithms (ring / recursive
halving); they are written once, as the ``*_bytes`` functions here, so cost models import the
same formulas the ledger records and tests compare the two exactly.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

# torch >= 2.13 renamed the tensor-in/tensor-out collectives; clusters still run older releases.
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# -- the per-rank byte formulas -------------------------------------------------------------


def all_gather_bytes(local_bytes: int, p: int) -> int:
    """Bytes one rank sends (and receives) gathering p shards of ``local_bytes`` each."""
    return (p - 1) * local_bytes


def reduce_scatter_bytes(full_bytes: int, p: int) -> int:
    """Bytes one rank sends (and receives) reducing ``full_bytes`` to a 1/p shard."""
    return (p - 1) * full_bytes // p


def all_reduce_bytes(full_bytes: int, p: int) -> int:
    """Bytes one rank sends (and receives) all-reducing ``full_bytes``: reduce-scatter + gather."""
    return 2 * ((p - 1) * full_bytes // p)


def world_bound_to_device() -> bool:
    """Whether the default group is bound to a device (``init_process_group(device_id=...)``,
    as plexgt binds NCCL): every ``new_group`` is then a split of the world's communicator,
    which every world rank joins in the same order (gp_2d's and the mesh's groups)."""
    try:
        pg = dist.distributed_c10d._get_default_group()
    except (RuntimeError, ValueError, AttributeError):
        return False
    return getattr(pg, "bound_device_id", None) is not None


def partition_group(groups: Sequence[Sequence[int]], rank: int, **kw: Any) -> Any:
    """This rank's group of ``groups``, a partition of the world's ranks (every rank calls
    it with the same ``groups``, in step; ``kw``: ``new_group``'s, e.g. ``timeout``), created
    so that its members agree on it whatever groups the job made before.

    Unbound (gloo): every rank creates every group, in the given order, with torch's default
    (global) synchronisation, which names a group by a count every rank shares. A
    members-only group (``use_local_synchronization``) is named instead by a hash of its
    ranks and of how many groups the calling rank holds; a rank holds no group it is not a
    member of, so after any earlier group that not every rank joined (a test's
    world-minus-one group), a members-only group's ranks disagreed on its name and waited
    for each other in gloo's rendezvous until the store timed out. Each rank is a member of
    exactly one group of a partition, so the counts every rank holds stay equal for what
    comes after. A non-member's call returns at once (no rendezvous).

    Bound to a device (NCCL, :func:`world_bound_to_device`): each ``new_group`` is an
    ncclCommSplit of the world's communicator that every world rank joins, so creating every
    group would be one world-wide split per group; there each rank creates only its own,
    with ``use_local_synchronization``: one split in all, each rank splitting off its group.
    torch colours the split by the group's ranks; the per-rank name is the prefix of a store
    rendezvous that a split does not make (read in torch 2.13's
    ``_new_process_group_helper``; not run on several GPUs here)."""
    own = next(list(g) for g in groups if rank in g)
    if world_bound_to_device():
        return dist.new_group(own, use_local_synchronization=True, **kw)
    mine = None
    for g in groups:
        made = dist.new_group(list(g), **kw)
        if list(g) == own:
            mine = made
    return mine


def groups_held() -> int:
    """How many process groups this rank holds (is a member of, the world's included): what
    torch (2.x, ``_hash_ranks_to_str``) hashes with a group's ranks into the name of a
    members-only group (``use_local_synchronization``), so ranks that hold different counts
    name the same members-only group differently."""
    return len(dist.distributed_c10d._world.pg_names)


@dataclass(frozen=True)
class CommOp:
    """One collective call of one rank: operation name and its bytes sent / received."""

    op: str
    sent: int
    recv: int
    phase: str = "forward"
    """'forward' or 'backward'."""
    group: str = ""
    """The group it runs over when not the caller's whole group (gp_2d's 'heads', 'ring')."""
    group_size: int = 0
    """That group's size (0: the caller's whole group)."""
    count: int = 1
    """The call repeated this many times with the same bytes (a ring's b-1 steps): one entry,
    so a plan prices a 2048-rank ring in O(1), not O(p)."""

    @property
    def total_sent(self) -> int:
        """Bytes sent over all :attr:`count` calls."""
        return self.sent * self.count

    @property
    def total_recv(self) -> int:
        """Bytes received over all :attr:`count` calls."""
        return self.recv * self.count


@dataclass
class CommLedger:
    """Bytes sent and received by this rank, per (group name, operation).

    One ledger per rank, created by the caller and passed in with the groups (never global).
    """

    sent: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    recv: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    seconds: float = 0.0
    """Time this rank spent inside collectives (blocking calls and waits on async ones). On the
    CPU, host wall time. On a GPU, where an NCCL call returns before its transfer is done, the
    time the compute stream was held by collectives, from CUDA events around each call and
    wait: added by :meth:`settle` once the step's work is complete."""
    device: torch.device | None = None
    """Where the collectives' tensors live; CUDA selects event timing."""
    _events: list[tuple[Any, Any]] = field(default_factory=list, repr=False)

    def record(self, name: str, op: str, sent: int, recv: int) -> None:
        key = (name, op)
        self.sent[key] += int(sent)
        self.recv[key] += int(recv)
        self.calls[key] += 1

    @contextmanager
    def timed(self) -> Iterator[None]:
        if self.device is not None and self.device.type == "cuda":
            # events on the current stream: the span is what the stream spent waiting for the
            # collective (NCCL's own stream runs it; wait() makes this one wait for it)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((start, end))
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - t0

    def settle(self) -> float:
        """Add the timed spans of completed GPU work to :attr:`seconds` (call after the
        device is synchronised); returns :attr:`seconds`."""
        self.seconds += sum(a.elapsed_time(b) for a, b in self._events) / 1e3
        self._events.clear()
        return self.seconds

    def total(self, name: str | None = None, op: str | None = None, kind: str = "sent") -> int:
        """Sum of bytes ``kind`` ('sent' or 'recv'), optionally for one group name and/or op."""
        table = self.sent if kind == "sent" else self.recv
        return sum(
            v
            for (n, o), v in table.items()
            if (name is None or n == name) and (op is None or o == op)
        )

    def by_name(self, kind: str = "sent") -> dict[str, int]:
        """Bytes per group name (axis or plane)."""
        out: dict[str, int] = defaultdict(int)
        table = self.sent if kind == "sent" else self.recv
        for (n, _), v in table.items():
            out[n] += v
        return dict(out)

    def reset(self) -> None:
        self.sent.clear()
        self.recv.clear()
        self.calls.clear()
        self.seconds = 0.0
        self._events.clear()


@dataclass
class Comm:
    """A process group with its size, this rank's index in it, a name and the rank's ledger.

    ``group=None`` with ``size=1`` is a trivial group: every collective is the identity and
    records nothing, so layers need no special case for axes of extent 1.
    """

    group: Any
    size: int
    rank: int
    name: str
    ledger: CommLedger

    @staticmethod
    def from_group(group: Any, name: str, ledger: CommLedger) -> Comm:
        size = dist.get_world_size(group)
        rank = dist.get_rank(group)
        return Comm(group if size > 1 else None, size, rank, name, ledger)

    @staticmethod
    def single(name: str, ledger: CommLedger) -> Comm:
        return Comm(None, 1, 0, name, ledger)

    @staticmethod
    def loopback(size: int, name: str, ledger: CommLedger) -> Comm:
        """A group of ``size`` members on one process, for timing and measuring one member's
        computation (:mod:`plexgt.plan.batch_profile`): a ring step (:func:`shift_async`)
        hands a member its own block back, as if every member held the same data; no other
        collective takes it."""
        return Comm(None, size, 0, name, ledger)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

# -- raw operations (record in the ledger, no autograd) -------------------------------------


def _issue(op: str, out: torch.Tensor, x: torch.Tensor, comm: Comm, async_op: bool = False
           ) -> Any:
    """Record and run one tensor-in, tensor-out collective over dim 0 ('all_gather' or
    'reduce_scatter'); a handle when ``async_op``."""
    if op == "all_gather":
        b, fn = all_gather_bytes(_nbytes(x), comm.size), _all_gather_tensor
    else:
        b, fn = reduce_scatter_bytes(_nbytes(x), comm.size), _reduce_scatter_tensor
    comm.ledger.record(comm.name, op, b, b)
    with comm.ledger.timed():
        return fn(out, x, group=comm.group, async_op=async_op)


def _all_gather(x: torch.Tensor, comm: Comm, dim: int) -> torch.Tensor:
    if comm.size == 1:
        return x
    xt = x.movedim(dim, 0).contiguous()
    out = torch.empty((comm.size * xt.shape[0], *xt.shape[1:]), dtype=x.dtype, device=x.device)
    _issue("all_gather", out, xt, comm)
    return out.movedim(0, dim)


def _reduce_scatter(x: torch.Tensor, comm: Comm, dim: int) -> torch.Tensor:
    if comm.size == 1:
        return x
    if x.shape[dim] % comm.size:
        raise ValueError(
            f"reduce_scatter over '{comm.name}': dim {dim} of size {x.shape[dim]} is not "
            f"divisible by the group size {comm.size}"
        )
    xt = x.movedim(dim, 0).contiguous()
    out = torch.empty(
        (xt.shape[0] // comm.size, *xt.shape[1:]), dtype=x.dtype, device=x.device
    )
    _issue("reduce_scatter", out, xt, comm)
    return out.movedim(0, dim)


def _all_reduce(x: torch.Tensor, comm: Comm, async_op: bool = False, op: str = "sum") -> Any:
    if comm.size == 1:
        return None
    b = all_reduce_bytes(_nbytes(x), comm.size)
    comm.ledger.record(comm.name, "all_reduce", b, b)
    with comm.ledger.timed():
        return dist.all_reduce(x, op=_OPS[op], group=comm.group, async_op=async_op)


def _all_to_all(
    x: torch.Tensor, comm: Comm, send_splits: Sequence[int], recv_splits: Sequence[int], dim: int
) -> torch.Tensor:
    if len(send_splits) != comm.size or len(recv_splits) != comm.size:
        raise ValueError(f"all_to_all over '{comm.name}' needs {comm.size} send and recv splits")
    if sum(send_splits) != x.shape[dim]:
        raise ValueError(
            f"all_to_all over '{comm.name}': send splits sum to {sum(send_splits)}, "
            f"dim {dim} has {x.shape[dim]}"
        )
    if comm.size == 1:
        return x
    xt = x.movedim(dim, 0).contiguous()
    row = math.prod(xt.shape[1:]) * xt.element_size()
    out = torch.empty((sum(recv_splits), *xt.shape[1:]), dtype=x.dtype, device=x.device)
    with comm.ledger.timed():
        dist.all_to_all_single(
            out, xt, list(map(int, recv_splits)), list(map(int, send_splits)), group=comm.group
        )
    me = comm.rank
    sent = (sum(send_splits) - send_splits[me]) * row
    recv = (sum(recv_splits) - recv_splits[me]) * row
    comm.ledger.record(comm.name, "all_to_all", sent, recv)
    return out.movedim(0, dim)


def _shift(x: torch.Tensor, comm: Comm, offset: int) -> torch.Tensor:
    if comm.size == 1 or offset % comm.size == 0:
        return x
    xc = x.contiguous()
    out = torch.empty_like(xc)
    to = dist.get_global_rank(comm.group, (comm.rank + offset) % comm.size)
    frm = dist.get_global_rank(comm.group, (comm.rank - offset) % comm.size)
    ops = [
        dist.P2POp(dist.isend, xc, to, group=comm.group),
        dist.P2POp(dist.irecv, out, frm, group=comm.group),
    ]
    with comm.ledger.timed():
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    b = _nbytes(xc)
    comm.ledger.record(comm.name, "send_recv", b, b)
    return out


# -- autograd Functions ---------------------------------------------------------------------


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Comm, dim: int) -> torch.Tensor:
        ctx.comm, ctx.dim = comm, dim
        return _all_gather(x, comm, dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return _reduce_scatter(g, ctx.comm, ctx.dim), None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Comm, dim: int) -> torch.Tensor:
        ctx.comm, ctx.dim = comm, dim
        return _reduce_scatter(x, comm, dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return _all_gather(g, ctx.comm, ctx.dim), None, None


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Comm) -> torch.Tensor:
        ctx.comm = comm
        out = x.clone()
        _all_reduce(out, comm)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        out = g.clone()
        _all_reduce(out, ctx.comm)
        return out, None


class _Replicated(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Comm) -> torch.Tensor:
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        out = g.clone()
        _all_reduce(out, ctx.comm)
        return out, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        comm: Comm,
        send_splits: Sequence[int],
        recv_splits: Sequence[int],
        dim: int,
    ) -> torch.Tensor:
        ctx.comm, ctx.send, ctx.recv, ctx.dim = comm, send_splits, recv_splits, dim
        return _all_to_all(x, comm, send_splits, recv_splits, dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return _all_to_all(g, ctx.comm, ctx.recv, ctx.send, ctx.dim), None, None, None, None


class _Shift(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Comm, offset: int) -> torch.Tensor:
        ctx.comm, ctx.offset = comm, offset
        return _shift(x, comm, offset)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return _shift(g, ctx.comm, -ctx.offset), None, None


def all_gather(x: torch.Tensor, comm: Comm, dim: int = 0) -> torch.Tensor:
    """[..., n, ...] shards of equal size -> [..., p*n, ...], concatenated in group-rank order.

    Backward reduce-scatters the gradient: each shard's gradient is the sum of what every rank's
    use of the gathered tensor contributed to it.
    """
    return _AllGather.apply(x, comm, dim)


def reduce_scatter(x: torch.Tensor, comm: Comm, dim: int = 0) -> torch.Tensor:
    """[..., p*n, ...] partial sums -> [..., n, ...] this rank's block of the sum.

    Backward all-gathers: the block's gradient is needed by every rank whose partial fed it.
    """
    return _ReduceScatter.apply(x, comm, dim)


def all_reduce(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """Partial sums -> the sum on every rank (same shape). Self-adjoint: backward all-reduces."""
    return _AllReduce.apply(x, comm)


def all_to_all(
    x: torch.Tensor,
    comm: Comm,
    send_splits: Sequence[int],
    recv_splits: Sequence[int],
    dim: int = 0,
) -> torch.Tensor:
    """Split ``x`` along ``dim`` by ``send_splits`` (one piece per rank) and exchange.

    Uneven splits are allowed; ``recv_splits[j]`` must equal rank j's ``send_splits[me]``.
    Backward is the all-to-all with the splits swapped.
    """
    return _AllToAll.apply(x, comm, tuple(send_splits), tuple(recv_splits), dim)


def shift(x: torch.Tensor, comm: Comm, offset: int = 1) -> torch.Tensor:
    """Point-to-point ring step: send ``x`` to group rank (r+offset), receive from (r-offset).

    Backward shifts the gradient the other way (-offset).
    """
    return _Shift.apply(x, comm, offset)


def all_reduce_async(x: torch.Tensor, comm: Comm) -> Any:
    """In-place all-reduce issued asynchronously (no autograd): returns a waitable handle or None.

    For overlap of communication with computation inside hand-written backward/forward passes.
    """
    return _all_reduce(x, comm, async_op=True)


def reduce_scatter_async(x: torch.Tensor, out: torch.Tensor, comm: Comm) -> Any:
    """Reduce-scatter of contiguous ``x`` [G·m, ...] into ``out`` [m, ...] (chunk = this rank's
    index), issued asynchronously, no autograd; returns a handle for :func:`wait` or None.

    For pipelines that overlap the collective of one row block with the next block's SpMM.
    """
    if comm.size == 1:
        out.copy_(x)
        return None
    return _issue("reduce_scatter", out, x, comm, async_op=True)


def all_gather_async(x: torch.Tensor, out: torch.Tensor, comm: Comm) -> Any:
    """All-gather of contiguous ``x`` [m, ...] into ``out`` [G·m, ...] (rank order), issued
    asynchronously, no autograd; the adjoint of :func:`reduce_scatter_async`."""
    if comm.size == 1:
        out.copy_(x)
        return None
    return _issue("all_gather", out, x, comm, async_op=True)


class _Requests:
    """The requests of one batched point-to-point exchange, waited on together."""

    def __init__(self, reqs: list[Any]) -> None:
        self.reqs = reqs

    def wait(self) -> None:
        for r in self.reqs:
            r.wait()


def shift_async(x: torch.Tensor, out: torch.Tensor, comm: Comm, offset: int = 1) -> Any:
    """Ring step issued without waiting, no autograd: send contiguous ``x`` to group rank
    (r+offset), receive the same shape from (r-offset) into ``out``; a handle for
    :func:`wait` (None when the group has one rank: ``out`` is then ``x``'s copy).

    For pipelines (ring attention) that move the next block while computing on this one;
    recorded as 'send_recv', the bytes of ``x`` each way. A :meth:`Comm.loopback` group
    copies ``x`` into ``out`` and records nothing."""
    if comm.size == 1 or comm.group is None or offset % comm.size == 0:
        out.copy_(x)
        return None
    to = dist.get_global_rank(comm.group, (comm.rank + offset) % comm.size)
    frm = dist.get_global_rank(comm.group, (comm.rank - offset) % comm.size)
    ops = [dist.P2POp(dist.isend, x, to, group=comm.group),
           dist.P2POp(dist.irecv, out, frm, group=comm.group)]
    b = _nbytes(x)
    comm.ledger.record(comm.name, "send_recv", b, b)
    with comm.ledger.timed():
        return _Requests(dist.batch_isend_irecv(ops))


def wait(handle: Any, comm: Comm) -> None:
    """Wait for an async collective (None: nothing was issued), timing the wait in the ledger."""
    if handle is not None:
        with comm.ledger.timed():
            handle.wait()


def all_reduce_(x: torch.Tensor, comm: Comm, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce ('sum', 'max' or 'min') without autograd, recorded in the ledger.

    For statistics (row maxima, counts, metrics) whose gradient is not wanted.
    """
    _all_reduce(x, comm, op=op)
    return x


@torch.no_grad()
def all_gather_uneven(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """[k_r, ...] on rank r -> [sum k, ...] on every rank, in rank order, without autograd
    (two all-gathers: the lengths, then the rows padded to the longest, both in the ledger).

    For evaluation (the scores of a split's labelled nodes, whose count differs per rank).
    """
    if comm.size == 1:
        return x
    k = torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device)
    counts = _all_gather(k, comm, 0).tolist()
    pad = torch.zeros((max(counts), *x.shape[1:]), dtype=x.dtype, device=x.device)
    pad[: x.shape[0]] = x
    got = _all_gather(pad, comm, 0).view(comm.size, max(counts), *x.shape[1:])
    return torch.cat([got[r, :c] for r, c in enumerate(counts)])


def replicated(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """Identity on a tensor held identically by every rank of ``comm`` (a parameter copy).

    Each copy feeds a different computation, so its true gradient is the sum of the copies'
    gradients: backward all-reduces, which keeps the copies identical after an optimizer step.
    """
    return _Replicated.apply(x, comm)
