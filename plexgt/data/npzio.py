"""Streaming reads of arrays inside an ``.npz`` without loading them whole and without pickle.

Why: ogbn-papers100M's ``data.npz`` holds a [2, 1.6B] int64 edge index (26 GB) and a
[111M, 128] float16 feature matrix; ``np.load`` would read each member entirely. Here a member's
``.npy`` header is parsed (object dtypes refused: nothing is ever unpickled), its claimed size is
checked against the member's real size before anything is allocated, and rows are read in
chunks. Seeking inside a deflated member re-decompresses from the start, so readers walk rows
forward.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from plexgt.errors import DataError

NPZ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError)
"""What reading a damaged npz raises (numpy's own complaints are ValueErrors)."""


def require_arrays(path: Path, present: list[str], needed: tuple[str, ...]) -> None:
    """Refuse an npz that lacks one of ``needed``, naming the first missing and the arrays it
    holds (numpy's own KeyError reads 'X is not a file in the archive')."""
    missing = [k for k in needed if k not in present]
    if missing:
        raise DataError(f"{path}: no array {missing[0]!r} (keys: {', '.join(sorted(present))})")


class NpzArray:
    """One C-ordered array member ``key`` of an npz file, read by leading-axis ranges."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key
        try:
            self._zip = zipfile.ZipFile(path)
            name = key + ".npy"
            names = self._zip.namelist()
            require_arrays(path, [n[:-4] for n in names if n.endswith(".npy")], (key,))
            self._info = self._zip.getinfo(name)
            with self._zip.open(name) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                self._offset = f.tell()
        except DataError:
            raise
        except FileNotFoundError:
            raise DataError(f"{path}: no such file") from None
        except NPZ_ERRORS as e:
            raise DataError(f"{path}: not a readable npz file ({e})") from None
        if dtype.hasobject:
            raise DataError(f"{path}: array {key!r} holds Python objects; refusing to unpickle")
        if fortran and len(shape) > 1:
            raise DataError(f"{path}: array {key!r} is Fortran-ordered; expected C order")
        self.shape: tuple[int, ...] = tuple(int(s) for s in shape)
        self.dtype: np.dtype = dtype
        need = int(np.prod(self.shape, dtype=np.int64)) * dtype.itemsize
        have = self._info.file_size - self._offset
        if need != have:
            raise DataError(
                f"{path}: array {key!r} header claims shape {self.shape} ({need} bytes) but the "
                f"member holds {have} bytes"
            )

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def read_flat(self, start: int, count: int) -> np.ndarray:
        """``count`` elements from flat element index ``start`` (C order)."""
        if count == 0:
            return np.empty(0, dtype=self.dtype)
        try:
            with self._zip.open(self._info) as f:
                f.seek(self._offset + start * self.dtype.itemsize)
                buf = f.read(count * self.dtype.itemsize)
        except NPZ_ERRORS as e:
            raise DataError(f"{self.path}: array {self.key!r} is corrupt ({e})") from None
        if len(buf) != count * self.dtype.itemsize:
            raise DataError(f"{self.path}: array {self.key!r} is truncated")
        return np.frombuffer(buf, dtype=self.dtype).copy()

    def iter_flat(self, start: int, stop: int, chunk: int):  # noqa: ANN201 - a generator
        """Yield consecutive element blocks [start, stop) of at most ``chunk`` elements.

        One open handle walks forward, so a deflated member is decompressed once.
        """
        try:
            with self._zip.open(self._info) as f:
                f.seek(self._offset + start * self.dtype.itemsize)
                pos = start
                while pos < stop:
                    n = min(chunk, stop - pos)
                    buf = f.read(n * self.dtype.itemsize)
                    if len(buf) != n * self.dtype.itemsize:
                        raise DataError(f"{self.path}: array {self.key!r} is truncated")
                    yield np.frombuffer(buf, dtype=self.dtype)
                    pos += n
        except NPZ_ERRORS as e:
            raise DataError(f"{self.path}: array {self.key!r} is corrupt ({e})") from None

    def read_all(self) -> np.ndarray:
        n = int(np.prod(self.shape, dtype=np.int64))
        return self.read_flat(0, n).reshape(self.shape)

    def close(self) -> None:
        self._zip.close()


def npz_keys(path: Path) -> list[str]:
    """Array names in an npz file."""
    try:
        with zipfile.ZipFile(path) as z:
            return [n[:-4] for n in z.namelist() if n.endswith(".npy")]
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except NPZ_ERRORS as e:
        raise DataError(f"{path}: not a readable npz file ({e})") from None
