"""MatrixMarket ``.mtx`` (SuiteSparse collection), coordinate format only, plain or ``.gz``.

An entry ``i j [value]`` (1-based) is A[i-1, j-1] = 1, i.e. the message j -> i; values are
ignored (the pattern is the graph). ``symmetric``/``skew-symmetric``/``hermitian`` files store
one triangle: the mirror of every off-diagonal entry is added. The header's sizes are checked,
never trusted: nothing is allocated from the claimed nnz, a file with more or fewer entries than
claimed is refused, and so is a non-square matrix.

Streaming (:class:`MtxSource`, what ``plexgt prep --format mtx`` reads): N comes from the size
line, read first; the entries are parsed block by block as prep asks for them, each block
checked against N as it streams, the entry count against the claimed nnz at the end of a pass.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from plexgt.data.formats.spec import FormatSpec, Probe
from plexgt.data.graph import GraphData, first_id_error
from plexgt.data.source import GraphSource, TextEdgeSource, collect_edges
from plexgt.data.textio import (
    BLOCK_BYTES,
    BOM,
    has_mtx_banner,
    iter_blocks,
    max_data_lines,
    open_text,
    parse,
    read_errors,
)
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import DataError

_FIELDS = {"pattern": 2, "real": 3, "integer": 3, "double": 3, "complex": 4}
_SYMM = ("general", "symmetric", "skew-symmetric", "hermitian")
#: a header or comment line longer than this is refused
_MAX_HEADER_LINE = 1 << 20


def _parse_header(path: Path) -> tuple[str, str, int, int, int, int]:
    """(field, symmetry, n, nnz, byte offset of the body, its first line number)."""
    with read_errors(path), open_text(path) as f:
        first = f.readline(_MAX_HEADER_LINE)
        if not first:
            raise DataError(f"{path}: empty file")
        head = first.removeprefix(BOM).decode("latin-1").strip().split()
        if len(head) != 5 or head[0].lower() != "%%matrixmarket" or head[1].lower() != "matrix":
            raise DataError(f"{path}: line 1: not a MatrixMarket matrix header")
        fmt, field, symm = (h.lower() for h in head[2:])
        if fmt != "coordinate":
            raise DataError(f"{path}: line 1: format {fmt!r} unsupported (only 'coordinate')")
        if field not in _FIELDS or symm not in _SYMM:
            raise DataError(f"{path}: line 1: unknown field/symmetry {field!r}/{symm!r}")
        k = 1
        while True:
            raw = f.readline(_MAX_HEADER_LINE)
            if not raw:
                raise DataError(f"{path}: no size line after the header")
            k += 1
            s = raw.strip()
            if not s or s.startswith(b"%"):
                continue
            parts = s.split()
            if len(parts) != 3 or not all(p.isdigit() for p in parts):
                raise DataError(f"{path}: line {k}: size line must be 'rows cols nnz', got "
                                f"{s[:60].decode(errors='replace')!r}")
            m, n, nnz = (int(p) for p in parts)
            if m != n:
                raise DataError(f"{path}: line {k}: matrix is {m}x{n}, not square")
            if n <= 0:
                raise DataError(f"{path}: line {k}: empty graph (0 nodes)")
            return field, symm, n, nnz, f.tell(), k + 1


class MtxSource(TextEdgeSource):
    """A coordinate MatrixMarket file streamed in chunks (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = str(self.path)
        self.files = [self.path]
        (self.field, self.symm, self.num_nodes, self.nnz, self._body,
         self._body_line) = _parse_header(self.path)
        self.line_bytes = 12 if self.field == "pattern" else 24

    def num_edges_hint(self) -> int:
        nnz = min(self.nnz, max_data_lines(self.path))
        return nnz * (1 if self.symm == "general" else 2)

    def _check_total(self, count: int) -> None:
        if count > self.nnz:
            raise DataError(f"{self.path}: header claims {self.nnz} entries but the file holds "
                            f"more ({count})")
        if count != self.nnz:
            raise DataError(f"{self.path}: header claims {self.nnz} entries but the file holds "
                            f"{count} (truncated?)")
        if count == 0:
            raise DataError(f"{self.path}: empty graph (no entries)")

    def entries(self, part: int, nparts: int, block_bytes: int = BLOCK_BYTES
                ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(row, col) 0-based int64 of the stored entries of one part, block by block, checked
        (no mirrors; the total is left to :meth:`_check_total`)."""
        n, count = self.num_nodes, 0
        for blk in iter_blocks(self.path, part, nparts, block_bytes=block_bytes,
                               start=self._body, start_line=self._body_line):
            arr = parse(blk, ncols=_FIELDS[self.field], dtype=np.float64, comments="%")
            if not arr.size:
                continue
            count += arr.shape[0]
            if count > self.nnz:  # this part alone holds more: no need to read on
                raise DataError(f"{self.path}: header claims {self.nnz} entries but the file "
                                "holds more")
            ij = arr[:, :2]
            frac = ij != np.round(ij)
            if frac.any():
                r = int(np.argmax(frac.any(axis=1)))
                raise DataError(f"{self.path}: line {blk.data_line(r, '%')}: non-integer "
                                "row/column index")
            rows, cols = ij.T.astype(np.int64, order="C")
            bad = first_id_error(rows, cols, 1, n + 1)
            if bad is not None:
                r, _, v = bad
                raise DataError(f"{self.path}: index {v} is outside [1, {n}] "
                                f"(line {blk.data_line(r, '%')})")
            rows -= 1
            cols -= 1
            yield rows, cols

    def _edge_blocks(self, part, nparts, block_bytes):  # noqa: ANN001, ANN202 - see base
        for dst, src in self.entries(part, nparts, block_bytes):
            stored = dst.size
            if self.symm != "general":
                dst, src = _mirrored(dst, src)
            yield src, dst, stored


def _mirrored(dst: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A symmetric file's entries plus their mirrors (the diagonal once)."""
    off = dst != src
    return np.concatenate([dst, src[off]]), np.concatenate([src, dst[off]])


def read_mtx(path: str | Path) -> GraphData:
    """Read a coordinate MatrixMarket file into a validated :class:`GraphData` (one pass of
    :class:`MtxSource`: stored entries first, then the mirrors of a symmetric file)."""
    src = MtxSource(path)
    dst, src_ids = collect_edges(src.entries(0, 1))
    src._check_total(dst.size)
    if src.symm != "general":
        dst, src_ids = _mirrored(dst, src_ids)
    g = GraphData(str(src.path), src.num_nodes, src_ids, dst)
    g.validate()
    return g


def _recognise(probe: Probe) -> bool:
    """By its name, or by its banner whatever its name (a MatrixMarket file named .txt read as
    an edge list would take its size line for an edge)."""
    return not probe.is_dir and (probe.stem.endswith(".mtx") or has_mtx_banner(probe.head))


def _open(args: argparse.Namespace, comm: HostComm | None) -> GraphSource:
    return MtxSource(args.input)


SPEC = FormatSpec(
    "mtx", "MatrixMarket coordinate files (SuiteSparse), streamed", _open,
    input="a .mtx[.gz] file", recognise=_recognise, order=40,
    looked_for="a .mtx[.gz] file, or any file opening with the %%MatrixMarket banner")
