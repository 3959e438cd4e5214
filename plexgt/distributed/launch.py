"""What a process knows of its job before anything is initialised: no torch, no MPI init.

The command line imports this module alone (``plexgt prep`` on 64 ranks should not pay for
torch), to name the rank in a one-line error and to end the whole job when one rank fails
outside a collective that the others would notice.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any

ABORT_GRACE_S = 0.5
"""Seconds a failing rank waits between printing its error and MPI Abort (the launcher's
output forwarding; see install_abort_on_error)."""


def launch_rank() -> tuple[int, int]:
    """(rank, size) of this process as its launcher set them, before any initialisation:
    MPI's (MPICH, Open MPI, PMIx), Slurm's, or torchrun's variables; (0, 1) alone."""
    for r, s in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMIX_RANK", "PMIX_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                 ("RANK", "WORLD_SIZE")):
        if r in os.environ and s in os.environ:
            try:
                return int(os.environ[r]), int(os.environ[s])
            except ValueError:
                continue
    return 0, 1


def mpi_world() -> Any | None:
    """COMM_WORLD if mpi4py imports and this process was started by an MPI launcher."""
    if os.environ.get("PLEXGT_NO_MPI"):
        return None
    try:
        # imported here, not at the top: importing mpi4py.MPI initialises MPI, which a
        # torchrun-launched process (or one told PLEXGT_NO_MPI) must never do
        from mpi4py import MPI
    except (ImportError, RuntimeError):  # RuntimeError: mpi4py present, no MPI library
        return None
    return MPI.COMM_WORLD


def end_job(code: int) -> None:
    """End every rank of the job now: MPI Abort when launched by MPI, else exit this process
    (torchrun's peers then fail at their next collective, bounded by its timeout)."""
    sys.stderr.flush()
    comm = mpi_world()
    if comm is not None and comm.Get_size() > 1:
        comm.Abort(code)
    os._exit(code)


def release_process_group() -> None:
    """Destroy torch.distributed's default group, if this process made one, without waiting
    for peers: the exit of a job whose ranks agreed on an error. Left to the interpreter's
    exit, gloo's threads are torn down in no set order and sometimes call std::terminate
    (measured: 2 exits in 6 of a 3-rank job ended by SIGABRT instead of status 2). Imports
    nothing: a command that never loaded torch has no group."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def install_abort_on_error(rank: int, comm: Any | None) -> None:
    """Make an uncaught exception on this rank end the whole job (MPI Abort), not hang it.
    ``comm``: the job's MPI communicator, or None to find it (if any) when it is needed."""

    def _abort(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        msg = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write(f"plexgt: rank {rank}: uncaught {exc_type.__name__}: {exc}\n{msg}")
        sys.stderr.flush()
        if comm is not None and comm.Get_size() > 1:
            # The line is in the pipe to the launcher's proxy, which forwards it in its own
            # time; Abort reaches mpiexec by another socket and the job is torn down at once.
            # A fresh-clone CI run under load lost the line (and MPICH's own abort message)
            # that way: the user is left not knowing which rank failed. A moment first.
            time.sleep(ABORT_GRACE_S)
            comm.Abort(1)
        end_job(1)

    sys.excepthook = _abort

    def _thread_abort(args: threading.ExceptHookArgs) -> None:
        _abort(args.exc_type, args.exc_value, args.exc_traceback)

    threading.excepthook = _thread_abort
