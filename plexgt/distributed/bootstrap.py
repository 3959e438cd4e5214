"""Start torch.distributed from MPI (mpiexec, srun) or from torchrun-style environment variables.

Why MPI first: on Slurm machines the launcher already knows every rank, and mpi4py gives us a
broadcast before any rendezvous exists. Rank 0 opens a TCPStore on a free port of its own address
and broadcasts (address, port), so two jobs sharing a node never collide on a fixed port.

The node-local rank comes from splitting COMM_WORLD by shared memory (MPI_COMM_TYPE_SHARED), not
from launcher-specific variables, so device selection is right under mpiexec and srun alike.

An uncaught exception on any rank calls MPI Abort (after printing the rank and the error), so a
failing rank ends the whole job within seconds instead of leaving the others in a collective.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from plexgt.distributed.launch import install_abort_on_error, mpi_world
from plexgt.distributed.mpiwait import arrive
from plexgt.errors import DeviceError

BACKENDS = ("auto", "nccl", "gloo")


@dataclass
class DistContext:
    """What one process knows about the job after :func:`init_distributed`."""

    rank: int
    """Global rank."""
    world_size: int
    """Number of ranks."""
    local_rank: int
    """Rank among the processes on this node (selects the GPU)."""
    local_size: int
    """Processes on this node."""
    backend: str
    """'nccl' (NCCL on NVIDIA, RCCL on ROCm) or 'gloo'."""
    device: Any
    """torch.device the rank computes on."""
    launcher: str
    """'mpi' or 'env' (torchrun-style variables)."""
    comm: Any = None
    """mpi4py COMM_WORLD when launched through MPI, else None."""
    timeout: datetime.timedelta = datetime.timedelta(seconds=300)
    """The collective timeout every group of this run is created with."""


def _host_address() -> str:
    """An address of this host that the other nodes can reach (the default route's source)."""
    override = os.environ.get("PLEXGT_MASTER_ADDR")
    if override:
        return override
    host = socket.gethostname()
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        addr = "127.0.0.1"
    return addr


def choose_backend(requested: str, cuda_available: bool) -> str:
    """'auto' means nccl when GPUs are visible, gloo otherwise."""
    if requested not in BACKENDS:
        raise DeviceError(f"unknown backend {requested!r}; expected one of "
                          f"{', '.join(BACKENDS)}")
    if requested == "auto":
        return "nccl" if cuda_available else "gloo"
    if requested == "nccl" and not cuda_available:
        raise DeviceError("backend nccl requested but no GPU is visible to this process "
                          "(parallel.backend: gloo or auto on CPUs)")
    return requested


def pick_gpu(local_rank: int, local_size: int, visible: int, host: str = "",
             gpu_map: str = "") -> int:
    """The index (among the visible GPUs) of the GPU of node-local rank ``local_rank``.

    One visible GPU: the launcher bound one to each rank (``srun --gpus-per-task=1``, per-rank
    ``CUDA_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES``); whether two ranks were bound to the
    same one is :func:`check_distinct_gpus`'s question. Several: rank i takes GPU i, or
    ``gpu_map``'s i-th entry (``PLEXGT_GPU_MAP=3,2,1,0``: the GPU nearest each rank's cores
    where the numbering runs against the NUMA domains, as on Perlmutter); more ranks than GPUs
    is an error here rather than NCCL's "Duplicate GPU detected" mid-run.
    """
    where = f"node {host}: " if host else ""
    if visible < 1:
        raise DeviceError(f"{where}backend nccl but this rank sees no GPU")
    if gpu_map and visible > 1:
        try:
            order = [int(v) for v in gpu_map.split(",")]
        except ValueError:
            raise DeviceError(f"PLEXGT_GPU_MAP={gpu_map!r} is not a comma-separated list of "
                              "GPU indices") from None
        if len(order) < local_size or not all(0 <= g < visible for g in order):
            raise DeviceError(f"{where}PLEXGT_GPU_MAP={gpu_map!r} does not give each of "
                              f"{local_size} ranks one of the {visible} visible GPUs")
        return order[local_rank]
    if visible == 1:
        return 0
    if local_size > visible:
        raise DeviceError(f"{where}{local_size} ranks but {visible} visible GPUs: launch one "
                          "rank per GPU (srun --ntasks-per-node=<GPUs per node> "
                          "--gpus-per-task=1)")
    return local_rank


def check_distinct_gpus(gpus: list[str], host: str = "") -> None:
    """``gpus[i]``: the physical GPU (UUID) of node-local rank i; two ranks on one GPU is an
    error naming both (NCCL would stop with "Duplicate GPU detected" at the first collective,
    and sharing silently halves each rank's memory)."""
    seen: dict[str, int] = {}
    for i, g in enumerate(gpus):
        if g in seen:
            where = f"node {host}: " if host else ""
            raise DeviceError(f"{where}local ranks {seen[g]} and {i} were given the same GPU "
                              f"{g}: bind one GPU per rank (srun --gpus-per-task=1, or "
                              "--gpu-bind=closest / map_gpu)")
        seen[g] = i


def gpu_identity(index: int) -> str:
    """A physical GPU's identity: its UUID (CUDA and ROCm), else its PCI address."""
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        return str(uuid)
    return (f"pci {getattr(props, 'pci_domain_id', 0)}:{getattr(props, 'pci_bus_id', 0)}:"
            f"{getattr(props, 'pci_device_id', index)}")


def init_distributed(
    backend: str = "auto", timeout_s: float = 300.0, abort_on_error: bool = True
) -> DistContext:
    """Initialise torch.distributed for this process and return its :class:`DistContext`.

    Under MPI (mpiexec, ``srun --mpi=pmi2``): rank/size from COMM_WORLD. Otherwise from
    ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (torchrun), or a single process.
    ``timeout_s`` bounds every collective, so a lost peer becomes an error, never a hang.
    """

    comm = mpi_world()
    timeout = datetime.timedelta(seconds=timeout_s)
    env_launch = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if comm is not None and (comm.Get_size() > 1 or not env_launch):
        from mpi4py import MPI

        rank, world = comm.Get_rank(), comm.Get_size()
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        local_rank, local_size = node.Get_rank(), node.Get_size()
        launcher = "mpi"
    elif env_launch:
        comm = None
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        launcher = "env"
        node = None
    else:
        rank, world, local_rank, local_size, launcher = 0, 1, 0, 1, "single"
        node = None

    if abort_on_error:
        install_abort_on_error(rank, comm)

    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    name = choose_backend(backend, cuda)
    host = socket.gethostname()
    if name == "nccl":
        device = torch.device("cuda", pick_gpu(local_rank, local_size,
                                               torch.cuda.device_count(), host,
                                               os.environ.get("PLEXGT_GPU_MAP", "")))
        if node is not None:  # MPI: the node's ranks compare the GPUs they were given
            check_distinct_gpus(node.allgather(gpu_identity(device.index)), host)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        threads = cpu_threads(local_size, os.environ)
        if threads is not None:
            torch.set_num_threads(threads)
    if node is not None:
        node.Free()

    # device_id binds the world group to this GPU: NCCL creates its communicator now (not at
    # the first collective), and sub-groups are split from it instead of bootstrapped anew
    bind = {"device_id": device} if name == "nccl" else {}
    if launcher == "env":
        dist.init_process_group(name, rank=rank, world_size=world, timeout=timeout, **bind)
    else:
        store = _mpi_store(comm, rank, world, timeout)
        dist.init_process_group(name, store=store, rank=rank, world_size=world, timeout=timeout,
                                **bind)
    if abort_on_error:
        # init_process_group wraps sys.excepthook in its own printer, which runs ours only after
        # buffering the traceback; put ours back on top so the abort always says who failed.
        install_abort_on_error(rank, comm)
    return DistContext(rank, world, local_rank, local_size, name, device, launcher, comm,
                       timeout)


def cpu_threads(local_size: int, env: Any, cores: int | None = None) -> int | None:
    """Threads for each of ``local_size`` CPU ranks on a node: its cores shared out (at least
    one), unless ``OMP_NUM_THREADS`` in ``env`` says otherwise (then None: torch already
    follows it). torch's own default, every core for every rank, oversubscribes a node with
    more than one rank; the planner prices this split (:class:`plexgt.plan.host.Host`)."""
    if env.get("OMP_NUM_THREADS"):
        return None
    if cores is None:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
    return max(1, cores // max(1, local_size))


def _mpi_store(comm: Any | None, rank: int, world: int, timeout: datetime.timedelta) -> Any:
    """A TCPStore served by rank 0 on a port the OS picked, its address broadcast over MPI."""

    if rank == 0:
        addr = "127.0.0.1" if world == 1 else _host_address()
        store = dist.TCPStore(addr, 0, world, True, timeout=timeout, wait_for_workers=False)
        where = (addr, store.port)
    else:
        where = None
    if comm is not None and world > 1:
        where = comm.bcast(where, root=0)
    if rank != 0:
        store = dist.TCPStore(where[0], where[1], world, False, timeout=timeout)
    return store


def shutdown(ctx: DistContext | None = None) -> None:
    """Tear down cleanly: wait for every rank, then destroy all process groups."""

    if dist.is_available() and dist.is_initialized():
        if ctx is not None and ctx.comm is not None:
            arrive(ctx.comm)
        dist.destroy_process_group()
