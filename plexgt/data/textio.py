"""Chunked parsing of numeric text files (plain or gzip): SNAP edge lists, OGB csv.gz, .mtx bodies.

Why chunked: a text edge list can be larger than memory, and numpy's C parser (``np.loadtxt``)
is fast on a block of lines but reports errors relative to that block. We feed it blocks of
whole lines and, only when it fails, re-scan the failing block line by line to name the exact
line number and field, so every error is one line naming the file, the line and the problem.

Splitting a file over parts (MPI ranks), :func:`iter_blocks`: every line goes to exactly one
part. A plain file is cut into ``nparts`` byte ranges; a part seeks to its range and reads only
the lines that *start* in it (the line straddling a boundary belongs to the range holding its
first byte). Such a block does not know its line number: it is counted (a pass over the bytes
before it) only when an error message needs it. A gzip stream cannot seek, so there every part
decompresses the whole stream, counting lines as it goes, and keeps every ``nparts``-th block;
parsing, the costly step, is still split.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from plexgt.errors import DataError

#: bytes of text parsed per block (whole lines; a block holds ~4M short edge lines)
BLOCK_BYTES = 64 << 20
#: smallest block :func:`block_bytes_for` chooses
MIN_BLOCK_BYTES = 64 << 10
#: deflate expands at most ~1032:1 (bounds the text a .gz can hold)
GZIP_MAX_RATIO = 1032

LineRef = int | Callable[[], int]
"""A 1-based line number, or a function computing it (called only when an error needs it)."""
Comments = str | tuple[str, ...] | None
"""What starts a comment (to the end of its line): one marker, several, or None (no comments)."""

BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte order mark some editors and spreadsheet exports put before the first line."""
MTX_BANNER = b"%%matrixmarket"
"""How a MatrixMarket file's first line starts (any case): the file says what it is."""


def has_mtx_banner(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes) opens with the MatrixMarket banner; a reader of
    another format refuses such a file rather than read its size line as an edge."""
    return head.removeprefix(BOM)[: len(MTX_BANNER)].lower() == MTX_BANNER


def _markers(comments: Comments) -> tuple[bytes, ...]:
    if not comments:
        return ()
    return (comments.encode(),) if isinstance(comments, str) else \
        tuple(c.encode() for c in comments)


def strip_comment(raw: bytes, comments: Comments) -> bytes:
    """``raw`` up to its first comment marker (the whole line when it holds none), as
    ``np.loadtxt`` cuts it: full-line and trailing comments alike."""
    cut = len(raw)
    for m in _markers(comments):
        k = raw.find(m, 0, cut)
        if k >= 0:
            cut = k
    return raw[:cut]


def open_text(path: Path):  # noqa: ANN201 - a binary file object
    """Open ``path`` for binary reading, through gzip when it ends in ``.gz``."""
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if is_gzip(path):
        return gzip.open(path, "rb")
    return open(path, "rb")  # noqa: SIM115 - closed by the caller's with


@contextlib.contextmanager
def read_errors(path: Path) -> Iterator[None]:
    """Turn truncated/corrupt gzip streams and read failures into a one-line DataError."""
    try:
        yield
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: truncated or corrupt gzip stream ({e})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})") from None


def is_gzip(path: Path) -> bool:
    return path.suffix == ".gz"


def block_bytes_for(items: int, bytes_per_item: int) -> int:
    """Block size holding about ``items`` lines of ``bytes_per_item`` (bounded both ways)."""
    return int(min(BLOCK_BYTES, max(MIN_BLOCK_BYTES, items * max(1, bytes_per_item))))


class Block:
    """Whole lines of a text file (``data`` ends with a newline).

    ``offset``: byte offset of ``data[0]`` in the (decompressed) file; ``line``: its 1-based
    line number, or 0 when not counted yet (see :meth:`first_line`). ``mine``: whether the
    block belongs to the requested part (:func:`iter_blocks` with ``others=True``).
    """

    __slots__ = ("path", "data", "offset", "line", "mine")

    def __init__(self, path: Path, data: bytes, offset: int, line: int = 0,
                 mine: bool = True) -> None:
        self.path, self.data, self.offset, self.line, self.mine = path, data, offset, line, mine

    def first_line(self) -> int:
        """The 1-based line number of ``data[0]`` (counted from the file start if unknown)."""
        if not self.line:
            self.line = line_at(self.path, self.offset)
        return self.line

    def data_line(self, row: int, comments: Comments = "#") -> int:
        """Line number of the ``row``-th (0-based) data row: blank and comment lines skipped."""
        return data_line(self.data, self.first_line(), row, comments)


def line_at(path: Path, offset: int) -> int:
    """1-based number of the line starting at byte ``offset`` (reads the bytes before it)."""
    count, left = 0, offset
    with read_errors(path), open_text(path) as f:
        while left > 0:
            buf = f.read(min(left, 16 << 20))
            if not buf:
                break
            count += buf.count(b"\n")
            left -= len(buf)
    return count + 1


def _is_data(raw: bytes, comments: Comments) -> bool:
    return bool(strip_comment(raw, comments).strip())


def data_line(block: bytes, first_line: int, row: int, comments: Comments = "#") -> int:
    """Line number of the ``row``-th (0-based) data row of ``block`` (which starts at
    ``first_line``); blank and comment lines are not rows, as for ``np.loadtxt``."""
    seen = 0
    for k, raw in enumerate(block.split(b"\n")):
        if _is_data(raw, comments):
            if seen == row:
                return first_line + k
            seen += 1
    return first_line


def _seq_blocks(path: Path, block_bytes: int, start: int, start_line: int
                ) -> Iterator[tuple[int, int, bytes]]:
    """(offset, line, whole lines) of the file from ``start``, read sequentially."""
    line, pos, tail = start_line, start, b""
    with read_errors(path), open_text(path) as f:
        if start:
            f.seek(start)
        while True:
            buf = f.read(block_bytes)
            if not buf:
                break
            buf = tail + buf if tail else buf
            cut = buf.rfind(b"\n")
            if cut < 0:
                tail = buf
                continue
            block, tail = buf[: cut + 1], buf[cut + 1 :]
            yield pos, line, block
            pos += len(block)
            line += block.count(b"\n")
    if tail.strip():
        yield pos, line, tail + b"\n"


def _range_blocks(path: Path, lo: int, hi: int, start: int, block_bytes: int
                  ) -> Iterator[tuple[int, bytes]]:
    """(offset, whole lines) of the lines of a plain file that start in [lo, hi)."""
    with read_errors(path), open(path, "rb") as f:
        pos = lo
        if lo > start:
            f.seek(lo - 1)
            if f.read(1) != b"\n":  # the line holding byte lo began before it: not ours
                pos += len(f.readline())
        else:
            f.seek(lo)
        off, tail = pos, b""
        while pos < hi:
            buf = f.read(min(block_bytes, hi - pos))
            if not buf:
                break
            pos += len(buf)
            buf = tail + buf if tail else buf
            cut = buf.rfind(b"\n")
            if cut < 0:
                tail = buf
                continue
            yield off, buf[: cut + 1]
            off += cut + 1
            tail = buf[cut + 1 :]
        if tail:  # our last line runs past hi: read it to its end
            tail += f.readline()
    if tail.strip():
        yield off, tail if tail.endswith(b"\n") else tail + b"\n"


def iter_blocks(
    path: Path, part: int = 0, nparts: int = 1, *, block_bytes: int = BLOCK_BYTES,
    start: int = 0, start_line: int = 1, others: bool = False,
) -> Iterator[Block]:
    """Blocks of whole lines of part ``part`` of ``nparts`` of ``path``, from byte ``start``
    (line ``start_line``) on; see the module docstring for how lines are split over parts.

    ``others=True`` forces the sequential split and also yields the other parts' blocks,
    unparsed, with ``mine=False``: a part can then count rows before its own blocks. Truncated
    or corrupt gzip streams become :class:`DataError` naming the file.
    """
    if nparts > 1 and not others and not is_gzip(path):
        if not path.exists():
            raise DataError(f"{path}: no such file")
        size = path.stat().st_size
        body = max(0, size - start)
        lo, hi = start + body * part // nparts, start + body * (part + 1) // nparts
        line = start_line if lo == start else 0  # the first part knows where it starts
        for off, data in _range_blocks(path, lo, hi, start, block_bytes):
            yield Block(path, data, off, line)
            if line:
                line += data.count(b"\n")
        return
    for k, (off, line, data) in enumerate(_seq_blocks(path, block_bytes, start, start_line)):
        mine = k % nparts == part
        if mine or others:
            yield Block(path, data, off, line, mine)


def read_head(path: Path, nbytes: int) -> bytes:
    """The first ``nbytes`` (decompressed) bytes of ``path``, or all of a shorter file."""
    with read_errors(path), open_text(path) as f:
        return f.read(nbytes)


def first_data_line(path: Path, comments: Comments = "#", limit: int = 64 << 20) -> bytes:
    """The first non-blank, non-comment line of ``path`` (b"" if there is none)."""
    with read_errors(path), open_text(path) as f:
        while True:
            raw = f.readline(limit)
            if not raw:
                return b""
            if _is_data(raw, comments):
                return raw


def max_data_lines(path: Path, min_line_bytes: int = 4) -> int:
    """An upper bound on the data lines ``path`` can hold (caps counts claimed by headers)."""
    size = path.stat().st_size
    if is_gzip(path):
        size *= GZIP_MAX_RATIO
    return size // min_line_bytes + 1


def estimate_data_lines(path: Path, comments: Comments = "#", sample: int = 4 << 20) -> int:
    """Data lines of ``path`` estimated from its first ``sample`` bytes (exact if smaller)."""
    with read_errors(path), open_text(path) as f:
        head = f.read(sample)
        consumed = f.fileobj.tell() if isinstance(f, gzip.GzipFile) else len(head)
    rows = sum(1 for raw in head.split(b"\n") if _is_data(raw, comments))
    if len(head) < sample or not head:
        return rows
    total = path.stat().st_size * (len(head) / max(1, consumed))
    return max(rows, int(total / len(head) * rows))


def _resolve(first_line: LineRef) -> int:
    return first_line if isinstance(first_line, int) else first_line()


def _loadtxt(block: bytes, dtype: type, delimiter: str | None, comments: Comments
             ) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.loadtxt(io.BytesIO(block), dtype=dtype, delimiter=delimiter,
                          comments=comments, ndmin=2, encoding="latin-1")


def _number(field: bytes, conv: type) -> bool:
    if b"_" in field:  # 1_000: Python's int() and float() take it, np.loadtxt does not
        return False
    try:
        conv(field)
    except ValueError:
        return False
    return True


def _first_bad_line(
    path: Path, block: bytes, first_line: LineRef, ncols: int | None, delimiter: str | None,
    comments: Comments, dtype: type,
) -> str:
    """The error text of a block that the fast parser rejected: a rescan line by line names
    the line and the field; what it cannot explain, a bisection of the block with the fast
    parser itself pins to its line (a prefix that fails stays failing when it grows)."""
    conv = int if np.issubdtype(dtype, np.integer) else float
    sep = delimiter.encode() if delimiter else None
    lines = block.split(b"\n")
    want = ncols
    for k, raw in enumerate(lines):
        s = strip_comment(raw, comments).strip()
        if not s:
            continue
        fields = [f.strip() for f in s.split(sep)] if sep else s.split()
        where = f"{path}: line {_resolve(first_line) + k}"
        if want is None:
            want = len(fields)  # the first row fixes the width, as for np.loadtxt
        if len(fields) != want:
            return f"{where}: expected {want} fields, found {len(fields)}"
        for fld in fields:
            if not _number(fld, conv):
                text = fld.decode(errors="replace")[:40]
                return f"{where}: non-numeric field {text!r}"
    ok, bad = 0, len(lines)  # lines[:ok] parse, lines[:bad] do not
    while bad - ok > 1:
        mid = (ok + bad) // 2
        try:
            _loadtxt(b"\n".join(lines[:mid]) + b"\n", dtype, delimiter, comments)
            ok = mid
        except ValueError:
            bad = mid
    text = lines[bad - 1].strip(b" \t").decode(errors="replace")
    shown = text if len(text) <= 60 else text[:57] + "..."
    return f"{path}: line {_resolve(first_line) + bad - 1}: cannot parse {shown!r}"


def parse_block(
    path: Path, block: bytes, first_line: LineRef, *, ncols: int | None, dtype: type,
    delimiter: str | None = None, comments: Comments = "#",
) -> np.ndarray:
    """Parse one block of whole lines into an array [lines, ncols] (comment lines skipped).

    ``first_line`` may be a function: it is called only to name the line of an error.
    """
    try:
        arr = _loadtxt(block, dtype, delimiter, comments)
    except ValueError:
        raise DataError(_first_bad_line(path, block, first_line, ncols, delimiter, comments,
                                        dtype)) from None
    if arr.size == 0:
        return np.empty((0, ncols or 0), dtype=dtype)
    if ncols is not None and arr.shape[1] != ncols:
        line = data_line(block, _resolve(first_line), 0, comments)
        raise DataError(f"{path}: line {line}: expected {ncols} fields, found {arr.shape[1]}")
    return arr


def parse(blk: Block, *, ncols: int | None, dtype: type, delimiter: str | None = None,
          comments: Comments = "#") -> np.ndarray:
    """:func:`parse_block` of a :class:`Block` (its line number counted only for errors)."""
    return parse_block(blk.path, blk.data, blk.line or blk.first_line, ncols=ncols, dtype=dtype,
                       delimiter=delimiter, comments=comments)


def iter_rows(
    path: Path, *, ncols: int | None, dtype: type, delimiter: str | None = None,
    comments: Comments = "#", block_bytes: int = BLOCK_BYTES,
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (first line number, rows [k, ncols]) blocks of a numeric text file."""
    for blk in iter_blocks(path, block_bytes=block_bytes):
        arr = parse(blk, ncols=ncols, dtype=dtype, delimiter=delimiter, comments=comments)
        if ncols is None and arr.size:
            ncols = arr.shape[1]
        yield blk.line, arr


def lockstep(a: Iterator[np.ndarray], b: Iterator[np.ndarray], chunk: int, path_a: Path,
             path_b: Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Row blocks of two files, one row of each per item, re-cut into pairs of ``chunk``
    rows (the last shorter); a file with more rows than the other is an error naming both."""
    bufs: list[list[np.ndarray]] = [[], []]
    have = [0, 0]
    its = [a, b]
    done = [False, False]
    chunk = max(1, chunk)

    def take(i: int, k: int) -> np.ndarray:
        out, need = [], k
        while need:
            head = bufs[i][0]
            if head.shape[0] <= need:
                out.append(bufs[i].pop(0))
                need -= head.shape[0]
            else:
                out.append(head[:need])
                bufs[i][0] = head[need:]
                need = 0
        have[i] -= k
        return np.concatenate(out)

    while True:
        for i in (0, 1):
            while not done[i] and have[i] < chunk:
                try:
                    blk = next(its[i])
                except StopIteration:
                    done[i] = True
                    break
                if blk.shape[0]:
                    bufs[i].append(blk)
                    have[i] += blk.shape[0]
        k = min(chunk, have[0], have[1])
        if k == 0:
            if have[0] or have[1]:
                longer, shorter = (path_a, path_b) if have[0] else (path_b, path_a)
                raise DataError(f"{longer}: holds more rows than {shorter} (one row each "
                                "expected)")
            return
        yield take(0, k), take(1, k)


def read_all_rows(
    path: Path, *, ncols: int | None, dtype: type, delimiter: str | None = None,
    comments: Comments = "#",
) -> np.ndarray:
    """All rows of a numeric text file as one array [lines, ncols] (small files: node arrays)."""
    parts = [a for _, a in iter_rows(path, ncols=ncols, dtype=dtype, delimiter=delimiter,
                                     comments=comments)]
    parts = [p for p in parts if p.size]
    if not parts:
        return np.empty((0, ncols or 0), dtype=dtype)
    if len({p.shape[1] for p in parts}) > 1:
        raise DataError(f"{path}: rows have differing field counts")
    return np.concatenate(parts)


def empty_lines(block: bytes) -> int:
    """Lines of ``block`` (whole lines) that hold nothing at all (b"" between newlines)."""
    b = np.frombuffer(block, dtype=np.uint8)
    if b.size == 0:
        return 0
    nl = b == 10
    return int(nl[0]) + int(np.count_nonzero(nl[1:] & nl[:-1]))
