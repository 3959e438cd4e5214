"""Chunked parsing of numeric text files (plain or gzip): SNAP edge lists, OGB csv.gz, .mtx bodies.

Why chunked: a text edge list can be larger than memory, and numpy's C parser (``np.loadtxt``)
is fast on a block of lines but reports errors relative to that block. We feed it blocks of
whole lines and, only when it fails, re-scan the failing block line by line to name the exact
line number and field, so every error is one line naming the file, the line and the problem.
"""

from __future__ import annotations

import gzip
import io
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from plexgt.data.graph import DataError

#: bytes of text parsed per block (whole lines; a block holds ~4M short edge lines)
BLOCK_BYTES = 64 << 20


def open_text(path: Path):  # noqa: ANN201 - a binary file object
    """Open ``path`` for binary reading, through gzip when it ends in ``.gz``."""
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return open(path, "rb")  # noqa: SIM115 - closed by the caller's with


def iter_raw_blocks(path: Path, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, bytes]]:
    """Yield (first line number, block of whole lines) from ``path``; line numbers are 1-based.

    Truncated or corrupt gzip streams become :class:`DataError` naming the file.
    """
    line = 1
    tail = b""
    try:
        with open_text(path) as f:
            while True:
                buf = f.read(block_bytes)
                if not buf:
                    break
                buf = tail + buf
                cut = buf.rfind(b"\n")
                if cut < 0:
                    tail = buf
                    continue
                block, tail = buf[: cut + 1], buf[cut + 1 :]
                yield line, block
                line += block.count(b"\n")
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: truncated or corrupt gzip stream ({e})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    if tail.strip():
        yield line, tail + b"\n"


def _first_bad_line(
    path: Path, block: bytes, first_line: int, ncols: int | None, delimiter: bytes | None,
    comments: bytes, conv: type,
) -> str:
    """Line-by-line rescan of a block that the fast parser rejected: the error text."""
    for k, raw in enumerate(block.split(b"\n")):
        s = raw.strip()
        if not s or s.startswith(comments):
            continue
        fields = s.split(delimiter) if delimiter else s.split()
        where = f"{path}: line {first_line + k}"
        if ncols is not None and len(fields) != ncols:
            return f"{where}: expected {ncols} fields, found {len(fields)}"
        for fld in fields:
            try:
                conv(fld.strip())
            except ValueError:
                text = fld.decode(errors="replace")[:40]
                return f"{where}: non-numeric field {text!r}"
    return f"{path}: unparseable block starting at line {first_line}"


def parse_block(
    path: Path, block: bytes, first_line: int, *, ncols: int | None, dtype: type,
    delimiter: str | None = None, comments: str = "#",
) -> np.ndarray:
    """Parse one block of whole lines into an array [lines, ncols] (comment lines skipped)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arr = np.loadtxt(
                io.BytesIO(block), dtype=dtype, delimiter=delimiter, comments=comments, ndmin=2,
                encoding="latin-1",
            )
    except ValueError:
        conv = int if np.issubdtype(dtype, np.integer) else float
        raise DataError(
            _first_bad_line(
                path, block, first_line, ncols, delimiter.encode() if delimiter else None,
                comments.encode(), conv,
            )
        ) from None
    if arr.size == 0:
        return np.empty((0, ncols or 0), dtype=dtype)
    if ncols is not None and arr.shape[1] != ncols:
        raise DataError(
            f"{path}: line {first_line}: expected {ncols} fields, found {arr.shape[1]}"
        )
    return arr


def iter_rows(
    path: Path, *, ncols: int | None, dtype: type, delimiter: str | None = None,
    comments: str = "#", block_bytes: int = BLOCK_BYTES,
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (first line number, rows [k, ncols]) blocks of a numeric text file."""
    for first, block in iter_raw_blocks(path, block_bytes):
        arr = parse_block(
            path, block, first, ncols=ncols, dtype=dtype, delimiter=delimiter, comments=comments
        )
        if ncols is None and arr.size:
            ncols = arr.shape[1]
        yield first, arr


def read_all_rows(
    path: Path, *, ncols: int | None, dtype: type, delimiter: str | None = None,
    comments: str = "#",
) -> np.ndarray:
    """All rows of a numeric text file as one array [lines, ncols]."""
    parts = [a for _, a in iter_rows(path, ncols=ncols, dtype=dtype, delimiter=delimiter,
                                     comments=comments)]
    parts = [p for p in parts if p.size]
    if not parts:
        return np.empty((0, ncols or 0), dtype=dtype)
    if len({p.shape[1] for p in parts}) > 1:
        raise DataError(f"{path}: rows have differing field counts")
    return np.concatenate(parts)
