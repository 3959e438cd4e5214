"""MatrixMarket ``.mtx`` (SuiteSparse collection), coordinate format only, plain or ``.gz``.

An entry ``i j [value]`` (1-based) is A[i-1, j-1] = 1, i.e. the message j -> i; values are
ignored (the pattern is the graph). ``symmetric``/``skew-symmetric``/``hermitian`` files store
one triangle: the mirror of every off-diagonal entry is added. The header's sizes are checked,
never trusted: entries are accumulated as they are parsed (nothing is allocated from the claimed
nnz), a file with more or fewer entries than claimed is refused, and so is a non-square matrix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from plexgt.data.graph import DataError, GraphData
from plexgt.data.textio import iter_raw_blocks, parse_block

_FIELDS = {"pattern": 2, "real": 3, "integer": 3, "double": 3, "complex": 4}
_SYMM = ("general", "symmetric", "skew-symmetric", "hermitian")


def _parse_header(path: Path, block: bytes) -> tuple[str, str, int, int, int, int]:
    """(field, symmetry, n, nnz, byte offset of the body, lines consumed) from the first block."""
    lines = block.split(b"\n")
    head = lines[0].decode("latin-1").strip().split()
    if len(head) != 5 or head[0].lower() != "%%matrixmarket" or head[1].lower() != "matrix":
        raise DataError(f"{path}: line 1: not a MatrixMarket matrix header")
    fmt, field, symm = (h.lower() for h in head[2:])
    if fmt != "coordinate":
        raise DataError(f"{path}: line 1: format {fmt!r} unsupported (only 'coordinate')")
    if field not in _FIELDS or symm not in _SYMM:
        raise DataError(f"{path}: line 1: unknown field/symmetry {field!r}/{symm!r}")
    offset = len(lines[0]) + 1
    for k, raw in enumerate(lines[1:], start=2):
        s = raw.strip()
        offset += len(raw) + 1
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
        return field, symm, n, nnz, offset, k
    raise DataError(f"{path}: no size line after the header")


def read_mtx(path: str | Path) -> GraphData:
    """Read a coordinate MatrixMarket file into a validated :class:`GraphData`."""
    path = Path(path)
    header = None
    parts: list[np.ndarray] = []
    count = 0
    for first, block in iter_raw_blocks(path):
        if header is None:
            header = _parse_header(path, block)
            field, symm, n, nnz, offset, used = header
            block, first = block[offset:], used + 1
        arr = parse_block(path, block, first, ncols=_FIELDS[header[0]], dtype=np.float64,
                          comments="%")
        if not arr.size:
            continue
        count += arr.shape[0]
        if count > header[3]:
            raise DataError(f"{path}: header claims {header[3]} entries but the file holds more")
        ij = arr[:, :2]
        if np.any(ij != np.round(ij)):
            raise DataError(f"{path}: non-integer row/column index near line {first}")
        ij = ij.astype(np.int64)
        bad = (ij < 1) | (ij > header[2])
        if bad.any():
            r = int(np.nonzero(bad.any(axis=1))[0][0])
            v = int(ij[r][bad[r]][0])
            raise DataError(f"{path}: index {v} is outside [1, {header[2]}] "
                            f"(entry {count - arr.shape[0] + r + 1})")
        parts.append(ij - 1)
    if header is None:
        raise DataError(f"{path}: empty file")
    field, symm, n, nnz, _, _ = header
    if count != nnz:
        raise DataError(f"{path}: header claims {nnz} entries but the file holds {count} "
                        "(truncated?)")
    if count == 0:
        raise DataError(f"{path}: empty graph (no entries)")
    ij = np.concatenate(parts)
    dst, src = ij[:, 0], ij[:, 1]
    if symm != "general":
        off = dst != src
        dst, src = np.concatenate([dst, src[off]]), np.concatenate([src, dst[off]])
    g = GraphData(str(path), n, src.copy(), dst.copy())
    g.validate()
    return g
