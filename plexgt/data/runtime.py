"""What prep needs from its surroundings: an MPI communicator (or none), progress, atomic files.

Why a wrapper around mpi4py: prep runs the same code as one process or under ``mpiexec``; the
wrapper turns every stage boundary into an *agreement* (all ranks exchange their error, if any),
so a bad input found by one rank stops every rank at the same point instead of leaving the
others waiting in a barrier.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tqdm import tqdm

from plexgt.distributed.mpiwait import arrive
from plexgt.errors import DataError, mark_agreed

T = TypeVar("T")


class Comm:
    """Rank, size and the few collectives prep uses; ``Comm(None)`` is a world of one."""

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

    def agree(self, err: BaseException | None) -> None:
        """Collective: re-raise on every rank the first rank's error (DataError stays DataError)."""
        info = None if err is None else (isinstance(err, DataError), f"{err}")
        if self.c is None:
            if err is not None:
                raise err
            return
        infos = self.allgather(info)
        for r, i in enumerate(infos):
            if i is not None:
                # every rank raises; the command line prints only rank r's (one copy)
                out = err if err is not None else (
                    DataError(i[1]) if i[0] else RuntimeError(f"rank {r} failed: {i[1]}"))
                mark_agreed(out, r)
                raise out


def world_comm() -> Comm:
    """COMM_WORLD when mpi4py imports and the job has several ranks, else a world of one."""
    if os.environ.get("PLEXGT_NO_MPI"):
        return Comm(None)
    try:
        from mpi4py import MPI
    except ImportError:
        return Comm(None)
    return Comm(MPI.COMM_WORLD)


class Progress:
    """A progress bar on stderr: tqdm's on a TTY; in a batch log (Slurm's output file, not a
    TTY) a plain line every ``every_s`` seconds instead, since tqdm redraws one line with
    carriage returns, which a log file keeps as one unreadable line."""

    def __init__(self, label: str, total: float, enabled: bool = True, every_s: float = 5.0,
                 start: float = 0.0) -> None:
        self.label, self.total, self.done = label, max(total, 1.0), start
        self.start = start
        self.tty = sys.stderr.isatty()
        self.enabled = enabled
        self.every = 0.2 if self.tty else every_s
        self.t0 = self.last = time.monotonic()
        self.info = ""
        self._bar = None
        if enabled and self.tty:
            self._bar = tqdm(total=self.total, initial=start, desc=label, file=sys.stderr,
                             mininterval=self.every, dynamic_ncols=True, leave=True)

    def update(self, amount: float, info: str | None = None) -> None:
        """Advance by ``amount``; ``info`` (e.g. the latest loss) is shown after the bar."""
        self.done += amount
        if info is not None:
            self.info = info
        if self._bar is not None:
            if info is not None:
                self._bar.set_postfix_str(info, refresh=False)
            self._bar.update(amount)
            return
        now = time.monotonic()
        if self.enabled and now - self.last >= self.every:
            self.last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = min(1.0, self.done / self.total)
        el = now - self.t0
        run = (self.done - self.start) / self.total  # ETA from this run's own rate (resume)
        eta = el / run * (1.0 - frac) if run > 0 else float("nan")
        bar = "#" * int(frac * 30)
        text = f"{self.label} [{bar:<30}] {100 * frac:5.1f}% {el:6.1f}s eta {eta:6.1f}s"
        if self.info:
            text += " " + self.info
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def physical_memory() -> int | None:
    """Bytes of RAM on this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def sha256_file(path: Path, block: int = 8 << 20) -> str:
    """Hex sha256 of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(block)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path.tmp``, fsync, then rename: readers see all of it or nothing."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: corrupt JSON ({e})") from None
