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

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from plexgt.data.graph import GraphData, first_id_error
from plexgt.data.runtime import Comm
from plexgt.data.source import TextEdgeSource, collect_edges
from plexgt.data.textio import (
    BLOCK_BYTES,
    block_bytes_for,
    estimate_data_lines,
    iter_blocks,
    max_data_lines,
    parse,
    read_head,
)
from plexgt.errors import DataError

_HEADER = re.compile(rb"^#.*?Nodes:\s*(\d+)\s+Edges:\s*(\d+)", re.MULTILINE)
#: bytes of a typical edge line ("1234567\t7654321\n"): sizes parse blocks from a chunk of edges
LINE_BYTES = 16


def _claims(path: Path) -> tuple[int | None, int | None]:
    """(N, E) claimed by a ``# Nodes: K Edges: M`` header line, else (None, None)."""
    m = _HEADER.search(read_head(path, 4096))
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


def _check_total(path: Path, count: int, claimed_e: int | None) -> None:
    if count == 0:
        raise DataError(f"{path}: empty graph (no edges)")
    if claimed_e is not None and claimed_e != count:
        raise DataError(f"{path}: header claims {claimed_e} edges but the file holds {count} "
                        "(truncated?)")


class SnapSource(TextEdgeSource):
    """A SNAP edge list streamed in chunks (see the module docstring).

    ``comm`` splits the counting pass over MPI ranks; ``chunk_edges`` sizes its parse blocks
    (the later passes take their chunk from :meth:`edge_chunks`). ``count_degrees``: the
    counting pass also counts this rank's share of the degrees, for :meth:`counted_degrees`
    ([N] int64 a rank, as prep's own degree pass holds).
    """

    def __init__(self, path: str | Path, num_nodes: int | None = None, comm: Comm | None = None,
                 chunk_edges: int = 1 << 21, count_degrees: bool = False) -> None:
        self.path = Path(path)
        self.name = str(self.path)
        self.files = [self.path]
        self.claimed_n, self.claimed_e = _claims(self.path)
        self.counted: int | None = None
        self.line_bytes = LINE_BYTES
        self._degrees: tuple[int, int, np.ndarray] | None = None
        if num_nodes is None:
            self.counted, hi = self._count(comm or Comm(None), chunk_edges, count_degrees)
            self.num_nodes = max(hi + 1, self.claimed_n or 0)
        else:
            self.num_nodes = num_nodes

    def _count(self, comm: Comm, chunk: int, degrees: bool) -> tuple[int, int]:
        """The counting pass: (edges, largest id) over all parts (collective over ``comm``);
        with ``degrees``, this rank's part's in + out degrees are kept too."""
        def count_part() -> tuple[int, int]:
            count, hi = 0, -1
            deg = np.zeros(0, dtype=np.int64)
            for arr in self._parsed(comm.rank, comm.size, block_bytes_for(chunk, LINE_BYTES),
                                    None):
                count += arr.shape[0]
                hi = max(hi, int(arr.max()))
                if degrees:
                    b = np.bincount(arr.ravel())
                    if b.size > deg.size:  # N unknown yet: grow by doubling
                        deg = np.concatenate(
                            [deg, np.zeros(max(b.size, 2 * deg.size) - deg.size, np.int64)])
                    deg[:b.size] += b
            if degrees:
                self._degrees = (comm.rank, comm.size, deg)
            return count, hi

        stats = comm.allgather(comm.run(count_part))
        count, hi = sum(s[0] for s in stats), max(s[1] for s in stats)
        _check_total(self.path, count, self.claimed_e)
        return count, hi

    def counted_degrees(self, part: int, nparts: int) -> np.ndarray | None:
        """This part's degrees from the counting pass, once (then freed), when it counted them
        over the same ``nparts`` parts."""
        if self._degrees is None or self._degrees[:2] != (part, nparts):
            return None
        deg = self._degrees[2]
        self._degrees = None
        out = np.zeros(self.num_nodes, dtype=np.int64)
        k = min(deg.size, self.num_nodes)
        out[:k] = deg[:k]
        return out

    def num_edges_hint(self) -> int:
        if self.counted is not None:
            return self.counted
        if self.claimed_e is not None:
            return min(self.claimed_e, max_data_lines(self.path))
        return estimate_data_lines(self.path)

    def _parsed(self, part: int, nparts: int, block_bytes: int, n: int | None
                ) -> Iterator[np.ndarray]:
        """[k, 2] int64 (src, dst) blocks of one part, ids checked against [0, n)."""
        return _edge_blocks(self.path, part, nparts, block_bytes, n)

    def _edge_blocks(self, part, nparts, block_bytes):  # noqa: ANN001, ANN202 - see base
        for arr in self._parsed(part, nparts, block_bytes, self.num_nodes):
            src, dst = np.ascontiguousarray(arr.T)
            yield src, dst, src.size

    def _check_total(self, count: int) -> None:
        _check_total(self.path, count, self.claimed_e)


def read_snap(path: str | Path, num_nodes: int | None = None) -> GraphData:
    """Read a SNAP edge list into memory (edges as stored: directed); one pass, same parser."""
    path = Path(path)
    claimed_n, claimed_e = _claims(path)
    blocks = _edge_blocks(path, 0, 1, BLOCK_BYTES, num_nodes)
    src, dst = collect_edges((a[:, 0], a[:, 1]) for a in blocks)
    _check_total(path, src.size, claimed_e)
    n = num_nodes if num_nodes is not None else \
        max(int(src.max()) + 1, int(dst.max()) + 1, claimed_n or 0)
    g = GraphData(str(path), n, src, dst)
    g.validate()
    return g
