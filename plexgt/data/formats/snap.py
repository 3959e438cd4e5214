"""SNAP edge lists: ``.txt`` or ``.txt.gz``, ``#`` comment lines, two whitespace-separated ids.

A line ``a b`` is the message a -> b (A[b, a] = 1). N is the header's ``# Nodes: K`` when
present (SNAP counts isolated nodes there), else max id + 1, or ``num_nodes`` when the caller
fixes it (ids >= N are then an error). A header ``Edges: M`` that disagrees with the lines
actually present means a truncated file and is refused. No features: prep generates them only
when asked.

Streaming (:class:`SnapSource`, what ``plexgt prep --format snap`` reads): edges are parsed
block by block and never held whole. N must be known before prep's stages start, so unless
``num_nodes`` (``--nodes``) is given, the source first makes a *counting pass* over the whole
file that keeps only the edge count and the largest id (split over the MPI ranks when given a
communicator): the file is then parsed twice, once to count and once to shard. Pass ``--nodes``
to skip it on a very large file. With ``--permutation degree`` the counting pass also counts
every node's degree (``count_degrees``), which prep's degree stage would otherwise make a third
pass for.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from plexgt.data.formats.spec import EDGE_LIST_SUFFIXES, NODES, FormatSpec, Probe
from plexgt.data.graph import GraphData, first_id_error
from plexgt.data.source import CountedEdgeSource, GraphSource, check_edge_total, collect_edges
from plexgt.data.textio import BLOCK_BYTES, has_mtx_banner, iter_blocks, parse, read_head
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import DataError

_HEADER = re.compile(rb"^#.*?Nodes:\s*(\d+)\s+Edges:\s*(\d+)", re.MULTILINE)
#: bytes of a typical edge line ("1234567\t7654321\n"): sizes parse blocks from a chunk of edges
LINE_BYTES = 16


def _claims(path: Path) -> tuple[int | None, int | None]:
    """(N, E) claimed by a ``# Nodes: K Edges: M`` header line, else (None, None); a
    MatrixMarket file is refused (read as SNAP, its banner would be the first error)."""
    head = read_head(path, 4096)
    if has_mtx_banner(head):
        raise DataError(f"{path}: a MatrixMarket file (line 1 is its %%MatrixMarket banner), "
                        "not a SNAP edge list: give --format mtx")
    m = _HEADER.search(head)
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _edge_blocks(path: Path, part: int, nparts: int, block_bytes: int, n: int | None
                 ) -> Iterator[np.ndarray]:
    """Parsed [k, 2] int64 edge blocks of one part, ids checked against [0, n) (n None: >= 0)."""
    for blk in iter_blocks(path, part, nparts, block_bytes=block_bytes):
        arr = parse(blk, ncols=2, dtype=np.int64)
        if not arr.size:
            continue
        bad = first_id_error(arr[:, 0], arr[:, 1], 0, n)
        if bad is not None:
            r, _, v = bad
            line = blk.data_line(r)
            if v < 0:
                raise DataError(f"{path}: negative node id {v} (line {line})")
            raise DataError(f"{path}: node id {v} is outside [0, {n}) (line {line})")
        yield arr


class SnapSource(CountedEdgeSource):
    """A SNAP edge list streamed in chunks (see the module docstring and
    :class:`~plexgt.data.source.CountedEdgeSource`: the counting pass, split over ``comm``,
    and the degrees it can count on the way); N and E may come from its header."""

    def __init__(self, path: str | Path, num_nodes: int | None = None, comm: HostComm | None = None,
                 chunk_edges: int = 1 << 21, count_degrees: bool = False) -> None:
        self.claimed_n, self.claimed_e = _claims(Path(path))
        super().__init__(path, num_nodes, comm, chunk_edges, count_degrees, LINE_BYTES)

    def _parsed(self, part: int, nparts: int, block_bytes: int, n: int | None
                ) -> Iterator[np.ndarray]:
        return _edge_blocks(self.path, part, nparts, block_bytes, n)


def read_snap(path: str | Path, num_nodes: int | None = None) -> GraphData:
    """Read a SNAP edge list into memory (edges as stored: directed); one pass, same parser."""
    path = Path(path)
    claimed_n, claimed_e = _claims(path)
    blocks = _edge_blocks(path, 0, 1, BLOCK_BYTES, num_nodes)
    src, dst = collect_edges((a[:, 0], a[:, 1]) for a in blocks)
    check_edge_total(path, src.size, claimed_e)
    n = num_nodes if num_nodes is not None else \
        max(int(src.max()) + 1, int(dst.max()) + 1, claimed_n or 0)
    g = GraphData(str(path), n, src, dst)
    g.validate()
    return g


def _recognise(probe: Probe) -> bool:
    head = probe.head if not probe.is_dir and probe.stem.endswith(EDGE_LIST_SUFFIXES) else b""
    return b"Nodes:" in head and head.lstrip().startswith(b"#")


def _open(args: argparse.Namespace, comm: HostComm | None) -> GraphSource:
    return SnapSource(args.input, args.nodes, comm=comm, chunk_edges=args.chunk_edges,
                      count_degrees=args.permutation == "degree")


SPEC = FormatSpec(
    "snap", "SNAP edge lists (# comments, two ids a line), streamed; --nodes fixes N and "
    "skips the counting pass that otherwise parses the whole file once to find N", _open,
    input="a .txt[.gz] edge list", recognise=_recognise, order=50,
    looked_for=f"an edge list {'/'.join(EDGE_LIST_SUFFIXES)}[.gz] opening with a SNAP "
    "'# Nodes: N Edges: E' header", options=(NODES,))
