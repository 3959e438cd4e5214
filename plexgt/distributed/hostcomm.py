"""The host-side MPI communicator of the jobs that run before or without torch.distributed
(``plexgt prep``, ``verify``): mpi4py's world, or a world of one.

Why a wrapper around mpi4py: prep runs the same code as one process or under ``mpiexec``; the
wrapper turns every stage boundary into an *agreement* (all ranks exchange their error, if any),
so a bad input found by one rank stops every rank at the same point instead of leaving the
others waiting in a barrier. The one probe for MPI is :func:`plexgt.distributed.launch.
mpi_world` (a machine with mpi4py but no MPI library runs as one process, for every command).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from plexgt.distributed.launch import mpi_world
from plexgt.distributed.mpiwait import arrive
from plexgt.errors import DataError, mark_agreed

T = TypeVar("T")


class HostComm:
    """Rank, size and the few collectives prep uses; ``HostComm(None)`` is a world of one."""

    def __init__(self, comm: Any | None = None) -> None:
        self.c = comm if comm is not None and comm.Get_size() > 1 else None
        self.rank = 0 if self.c is None else self.c.Get_rank()
        self.size = 1 if self.c is None else self.c.Get_size()

    # each collective first meets in a sleeping barrier (plexgt.distributed.mpiwait): ranks often
    # wait here for seconds while another builds a tile, and must not spin meanwhile

    def bcast(self, obj: Any) -> Any:
        if self.c is None:
            return obj
        arrive(self.c)
        return self.c.bcast(obj, root=0)

    def allgather(self, obj: Any) -> list[Any]:
        if self.c is None:
            return [obj]
        arrive(self.c)
        return self.c.allgather(obj)

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (in rank order); None on the others."""
        if self.c is None:
            return [obj]
        arrive(self.c)
        return self.c.gather(obj, root=0)

    def sum(self, arr: np.ndarray) -> np.ndarray:
        """Element-wise sum over ranks (collective), in place."""
        if self.c is not None:
            from mpi4py import MPI

            arrive(self.c)
            self.c.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM)
        return arr

    def run(self, fn: Callable[[], T]) -> T | None:
        """Run ``fn`` on this rank, then agree with every rank on success (collective): an
        error anywhere is raised everywhere, so no rank is left waiting for the others."""
        err, res = None, None
        try:
            res = fn()
        except Exception as e:  # noqa: BLE001 - every rank must learn of it, or the others hang
            err = e
        self.agree(err)
        return res

    def first_failure(self, err: BaseException | None) -> tuple[int, tuple[bool, str] | None]:
        """Collective, the one exchange of plexgt's agreements over MPI: (the lowest rank
        whose ``err`` is not None, (whether it is a DataError, its message)), or (size, None)
        when no rank failed. :func:`plexgt.distributed.agree.agreed` uses it before
        torch.distributed is up."""
        info = None if err is None else (isinstance(err, DataError), f"{err}")
        infos = [info] if self.c is None else self.allgather(info)
        return next(((r, i) for r, i in enumerate(infos) if i is not None), (self.size, None))

    def agree(self, err: BaseException | None) -> None:
        """Collective: re-raise on every rank the first rank's error (DataError stays DataError)."""
        r, i = self.first_failure(err)
        if i is None:
            return
        # every rank raises; the command line prints only rank r's (one copy)
        out = err if err is not None else (
            DataError(i[1]) if i[0] else RuntimeError(f"rank {r} failed: {i[1]}"))
        mark_agreed(out, r)  # a world of one agrees with itself
        raise out


def world_comm() -> HostComm:
    """COMM_WORLD when this process was started by an MPI launcher with several ranks, else a
    world of one."""
    return HostComm(mpi_world())
