"""Writing one HDF5 file of a prepared directory: under a temporary name, renamed when whole,
every dataset with chunk checksums, and a full disk an ordinary OSError.

Why a module of its own: HDF5 2.0 cannot close a file whose writes failed. On a full disk
h5py printed a traceback for every object it freed and then closing the file segfaulted (3 of
3 runs of ``plexgt prep`` onto a full disk, exit 139). Here HDF5 writes through a Python file
(h5py's ``fileobj`` driver) that records a failed write and reports it done; the writer raises
the recorded error at the next dataset, HDF5 closes cleanly, and the temporary file goes.
"""

from __future__ import annotations

import errno
import io
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from plexgt.util.files import sha256_file


class _Unfailing(io.RawIOBase):
    """The file h5py writes through: a write that fails (a full disk) is recorded and, to
    HDF5, reported done (the file is garbage from then on, and removed)."""

    def __init__(self, f: io.FileIO) -> None:
        super().__init__()
        self.f = f
        self.error: OSError | None = None

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()

    def readinto(self, b: Any) -> int | None:
        return self.f.readinto(b)

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        n = view.nbytes
        end = self.f.tell() + n
        try:
            while self.error is None and view.nbytes:
                done = self.f.write(view)
                if not done:
                    raise OSError(errno.ENOSPC, "no byte written")
                view = view[done:]
        except OSError as e:
            self.error = OSError(e.errno, e.strerror or str(e), self.f.name)
        self.f.seek(end)  # the rest is skipped: HDF5 must see the whole write done
        return n

    def truncate(self, size: int | None = None) -> int:
        try:
            return self.f.truncate(size)
        except OSError as e:
            self.error = self.error or OSError(e.errno, e.strerror, self.f.name)
            return self.f.tell() if size is None else size

    def flush(self) -> None:
        pass  # unbuffered

    def check(self) -> None:
        """Raise the first failed write's error (a full disk: ENOSPC, naming the file)."""
        if self.error is not None:
            raise self.error


_WRITING: ContextVar[_Unfailing | None] = ContextVar("_WRITING", default=None)
"""The file :func:`write_h5_atomic` is writing, whose failure :func:`dataset` checks for."""


def write_h5_atomic(path: Path, fill: Callable[[h5py.File], None]) -> dict[str, Any]:
    """Create ``path`` via ``fill(h5file)`` under a temporary name; return its record. A write
    that fails stops ``fill`` at its next dataset, and the temporary file goes."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # an interrupted run's, or a symlink: never written through
    with open(tmp, "w+b", buffering=0) as raw:
        sink = _Unfailing(raw)
        token = _WRITING.set(sink)
        try:
            with h5py.File(sink, "w", libver="v108", track_order=False) as f:
                fill(f)
            sink.check()  # the last writes (metadata, at close)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            _WRITING.reset(token)
    out = {"bytes": tmp.stat().st_size, "sha256": sha256_file(tmp)}
    tmp.replace(path)
    return out


def dataset(f: h5py.Group, name: str, data: np.ndarray, **kw: Any) -> None:
    """One dataset, with a Fletcher-32 checksum per chunk: HDF5 verifies it on every read, so
    a damaged tile is an error where it is read, never silently wrong training data (an empty
    dataset has no chunk to sum)."""
    if data.size:
        kw.setdefault("fletcher32", True)
    f.create_dataset(name, data=data, track_times=False, **kw)
    sink = _WRITING.get()
    if sink is not None:
        sink.check()
