"""SNAP edge lists: ``.txt`` or ``.txt.gz``, ``#`` comment lines, two whitespace-separated ids.

A line ``a b`` is the message a -> b (A[b, a] = 1). N is the header's ``# Nodes: K`` when
present (SNAP counts isolated nodes there), else max id + 1, or ``num_nodes`` when the caller
fixes it (ids >= N are then an error). A header ``Edges: M`` that disagrees with the lines
actually present means a truncated file and is refused. No features: prep generates them only
when asked.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from plexgt.data.graph import DataError, GraphData
from plexgt.data.textio import iter_raw_blocks, parse_block

_HEADER = re.compile(rb"^#.*?Nodes:\s*(\d+)\s+Edges:\s*(\d+)", re.MULTILINE)


def read_snap(path: str | Path, num_nodes: int | None = None) -> GraphData:
    """Read a SNAP edge list into memory (edges as stored: directed)."""
    path = Path(path)
    parts: list[np.ndarray] = []
    claimed_n = claimed_e = None
    for first, block in iter_raw_blocks(path):
        if first == 1:
            m = _HEADER.search(block[:4096])
            if m:
                claimed_n, claimed_e = int(m.group(1)), int(m.group(2))
        arr = parse_block(path, block, first, ncols=2, dtype=np.int64)
        if arr.size:
            parts.append(arr)
    edges = np.concatenate(parts) if parts else np.empty((0, 2), dtype=np.int64)
    if edges.shape[0] == 0:
        raise DataError(f"{path}: empty graph (no edges)")
    if claimed_e is not None and claimed_e != edges.shape[0]:
        raise DataError(f"{path}: header claims {claimed_e} edges but the file holds "
                        f"{edges.shape[0]} (truncated?)")
    lo, hi = int(edges.min()), int(edges.max())
    if lo < 0:
        line = _line_of(edges, lo)
        raise DataError(f"{path}: negative node id {lo} (edge {line})")
    if num_nodes is not None:
        n = num_nodes
        if hi >= n:
            raise DataError(
                f"{path}: node id {hi} is outside [0, {n}) (edge {_line_of(edges, hi)})")
    else:
        n = max(hi + 1, claimed_n or 0)
    g = GraphData(str(path), n, edges[:, 0].copy(), edges[:, 1].copy())
    g.validate()
    return g


def _line_of(edges: np.ndarray, value: int) -> int:
    """1-based index of the first edge holding ``value`` (for error messages)."""
    return int(np.nonzero((edges == value).any(axis=1))[0][0]) + 1
