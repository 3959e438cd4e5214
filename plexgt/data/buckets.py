"""Out-of-core bucketing: records appended to disk grouped by key, read back one key at a time.

Why: prep must route every edge to its tile (and every feature row to its row block) without
holding the edge list. Each producer (MPI rank) buffers records up to ``flush_items``, then
sorts the buffer by key and appends it to one data file per stream, recording each key's
segment (key, offset, count) in an index. A consumer reads key k by concatenating its segments
from every producer. Files per producer: one per stream plus the index, whatever the number of
keys (T^2 tiles would otherwise mean millions of files at scale).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class BucketWriter:
    """Buffered, key-sorted appends of parallel record streams to ``base.<stream>.bin``."""

    def __init__(self, base: Path, nkeys: int,
                 streams: dict[str, tuple[np.dtype, int | None]], flush_items: int) -> None:
        self.base, self.nkeys, self.streams = base, nkeys, streams
        self.flush_items = max(1, flush_items)
        self._buf: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
        self._n = 0
        self._files = {s: open(f"{base}.{s}.bin", "wb") for s in streams}  # noqa: SIM115
        self._idx = open(f"{base}.idx", "wb")  # noqa: SIM115 - closed in close()
        self._offset = 0

    def add(self, keys: np.ndarray, **arrays: np.ndarray) -> None:
        """Queue records: ``keys`` [k] in [0, nkeys), per stream an array [k] (width None) or
        [k, width]."""
        if keys.size == 0:
            return
        self._buf.append((keys, arrays))
        self._n += keys.size
        if self._n >= self.flush_items:
            self.flush()

    def flush(self) -> None:
        if not self._buf:
            return
        keys = np.concatenate([k for k, _ in self._buf])
        ktype = np.uint16 if self.nkeys <= 1 << 16 else np.int64
        order = np.argsort(keys.astype(ktype, copy=False), kind="stable")  # radix for uint16
        for s, (dtype, width) in self.streams.items():
            arr = np.concatenate([a[s] for _, a in self._buf])
            arr = arr.reshape(-1, width) if width is not None else arr
            try:
                np.ascontiguousarray(arr[order], dtype=dtype).tofile(self._files[s])
            except OSError as e:  # numpy's short write names neither the file nor the cause
                raise OSError(e.errno, e.strerror or str(e), self._files[s].name) from e
        counts = np.bincount(keys, minlength=self.nkeys)
        nz = np.nonzero(counts)[0]
        offs = self._offset + np.concatenate([[0], np.cumsum(counts)[:-1]])[nz]
        np.stack([nz, offs, counts[nz]], axis=1).astype(np.int64).tofile(self._idx)
        self._offset += keys.size
        self._buf, self._n = [], 0

    def close(self) -> None:
        try:
            self.flush()
        finally:  # a flush that fails (a full disk) must not leave the files open
            self.discard()

    def discard(self) -> None:
        """Close the files without writing what is queued (after a failure: a full disk must
        not be asked for more, and open files would keep their space)."""
        for f in self._files.values():
            f.close()
        self._idx.close()
        self._buf, self._n = [], 0

    def __enter__(self) -> BucketWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


class BucketReader:
    """Read every segment of one key from the files of several producers."""

    def __init__(self, bases: list[Path],
                 streams: dict[str, tuple[np.dtype, int | None]]) -> None:
        self.bases, self.streams = bases, streams
        self._index = []
        for b in bases:
            idx = np.fromfile(f"{b}.idx", dtype=np.int64).reshape(-1, 3)
            self._index.append(idx)

    def count(self, key: int) -> int:
        return int(sum(idx[idx[:, 0] == key, 2].sum() for idx in self._index))

    def read(self, key: int) -> dict[str, np.ndarray]:
        """{stream: concatenated records of ``key``} (order: producer, then flush)."""
        out: dict[str, list[np.ndarray]] = {s: [] for s in self.streams}
        for base, idx in zip(self.bases, self._index):
            for _, off, cnt in idx[idx[:, 0] == key]:
                for s, (dtype, width) in self.streams.items():
                    dt = np.dtype(dtype)
                    w = 1 if width is None else width
                    a = np.fromfile(f"{base}.{s}.bin", dtype=dt, count=int(cnt) * w,
                                    offset=int(off) * w * dt.itemsize)
                    out[s].append(a.reshape(-1, width) if width is not None else a)
        res = {}
        for s, (dtype, width) in self.streams.items():
            if out[s]:
                res[s] = np.concatenate(out[s])
            else:
                res[s] = np.empty((0, width) if width is not None else 0, dtype=dtype)
        return res
