"""Waiting for the other MPI ranks without spinning.

MPICH waits inside blocking calls (barrier, bcast, allreduce) by polling its progress engine at
full speed. With one rank per core that costs nothing; with more ranks than cores (a laptop, a
CI runner, an oversubscribed test) the ranks that wait take the cores from the ones still
working, and a step that needs a second of work can take a minute. Every place where ranks may
wait long on MPI (prep's collectives while one rank builds a tile, rank 0 writing a file the
others then read, teardown) first meets in a non-blocking barrier polled with short sleeps,
then runs the blocking call, which by then completes at once.
"""

from __future__ import annotations

import time
from typing import Any


def arrive(comm: Any, max_sleep_s: float = 0.005) -> None:
    """Return once every rank of the mpi4py communicator ``comm`` has called this.

    Polls an ``Ibarrier`` with sleeps growing from 50 µs to ``max_sleep_s``: at most a few
    milliseconds of latency, and an idle core while waiting. ``None`` or a world of one: no-op.
    """
    if comm is None or comm.Get_size() == 1:
        return
    wait_request(comm.Ibarrier(), max_sleep_s)


def wait_request(req: Any, max_sleep_s: float = 0.005, deadline: float | None = None) -> bool:
    """Poll the mpi4py request ``req`` with sleeps growing from 50 µs to ``max_sleep_s`` until
    it completes (True) or ``time.monotonic()`` passes ``deadline`` (False; it stays pending)."""
    pause = 5e-5
    while not req.Test():
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(max_sleep_s, pause * 2)
    return True
