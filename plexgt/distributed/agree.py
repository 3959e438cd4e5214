"""Agree on failure: a step that may fail on some ranks only fails on all of them, cleanly.

Reading a rank's data, loading its checkpoint shard or creating a directory can fail on one
rank while the others go on into the next collective and wait there until the timeout (or
forever, for a sub-group without one). :func:`agreed` runs such a step on every rank, then
all ranks exchange one integer (the lowest failing rank, or P when none failed) over the
world group, bounded by its timeout (over MPI before torch.distributed is up): the lowest
failing rank re-raises its own error, every other rank raises
:class:`~plexgt.errors.PeerFailed`, so the job ends everywhere at once with one copy of the
message, naming the rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from plexgt.distributed.hostcomm import HostComm
from plexgt.distributed.launch import mpi_world
from plexgt.errors import PeerFailed, mark_agreed

T = TypeVar("T")


def agreed(fn: Callable[[], T], device: torch.device | str = "cpu") -> T:
    """``fn()`` on every rank; an exception on any rank is raised on all (module docstring).

    ``device``: where the world group's tensors live (the rank's GPU under NCCL)."""
    err: BaseException | None = None
    out: T | None = None
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - every failure must reach the other ranks
        err = e
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        rank, world = dist.get_rank(), dist.get_world_size()
        flag = torch.tensor([rank if err is not None else world], dtype=torch.int64,
                            device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # bounded by the world group's timeout
        first = int(flag.item())
    elif (comm := mpi_world()) is not None and comm.Get_size() > 1:
        # before torch.distributed exists (reading the configuration): every rank is on the
        # same path, so MPI's untimed all-reduce cannot wait on a rank that went elsewhere
        rank, world = comm.Get_rank(), comm.Get_size()
        first = HostComm(comm).first_failure(err)[0]
    else:
        rank, world = 0, 1
        first = 0 if err is not None else 1
    if first == world:
        return out  # type: ignore[return-value]
    if first == rank:
        assert err is not None
        mark_agreed(err, rank)
        raise err
    raise PeerFailed(f"rank {first} failed")
