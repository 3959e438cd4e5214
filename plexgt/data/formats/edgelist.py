"""Delimited edge lists: the way most graphs are published (``id_1,id_2`` CSV, TSV, spaces).

One edge a line, ``src <delimiter> dst [<delimiter> weight]`` (the message src -> dst), ``.gz``
or plain; ``#`` and ``%`` start comments (whole lines, or the rest of a line), a UTF-8 byte
order mark is skipped. What a file does not say is detected from its first lines, and each
guess can be fixed by a flag:

* the delimiter: a comma if the first data line has one, else a tab, else whitespace
  (``--delimiter``);
* a header row: the first non-comment line when its fields are not all numbers and it has as
  many as the next line (``id_1,id_2`` over ``0,1``); a first line that is neither is an error
  (``--header`` / ``--no-header``);
* the columns: 2, or 3 with a weight (read and checked, not stored: plexgt's operators are
  structural or degree-normalised);
* ids from 0, or from 1 with ``--one-based``.

Streamed and split over ranks exactly as SNAP files are (:class:`~plexgt.data.source.
CountedEdgeSource`, whose counting pass finds N unless ``--nodes`` fixes it): the header is
skipped by starting the split after it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plexgt.data.formats.feature_file import FEATURE_FILE, FeatureFileSource
from plexgt.data.formats.node_table import TABLE_OPTIONS, NodeTable, NodeTableSource, count_rows
from plexgt.data.formats.spec import (
    EDGE_LIST_SUFFIXES,
    NODES,
    FormatOption,
    FormatSpec,
    Probe,
    option,
)
from plexgt.data.graph import first_id_error
from plexgt.data.source import CountedEdgeSource, GraphSource
from plexgt.data.textio import BOM, has_mtx_banner, iter_blocks, parse, read_head, strip_comment
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import DataError, UsageError

DELIMITERS = {"comma": ",", "tab": "\t", "space": None}
"""--delimiter names -> the separator (None: any whitespace)."""


@dataclass(frozen=True)
class EdgeListLayout:
    """How an edge list file is laid out (detected, or as the flags fix it)."""

    delimiter: str | None
    """',', '\\t' or None (runs of whitespace)."""
    header: bool
    """The first non-comment line names the columns."""
    columns: int
    """2 (src, dst) or 3 (src, dst, weight)."""
    one_based: bool
    """Ids count from 1."""
    start: int = 0
    """Byte offset of the first data line (after the header)."""
    start_line: int = 1
    """Its 1-based line number."""


COMMENTS = ("#", "%")
"""What starts a comment, on a line of its own or after an edge (``%``: KONECT's lists)."""


def _fields(line: bytes, delimiter: str | None) -> list[bytes]:
    return [f.strip() for f in (line.split(delimiter.encode()) if delimiter else line.split())]


def _numeric(field: bytes) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _guess_sep(line: bytes) -> str | None:
    return "," if b"," in line else "\t" if b"\t" in line else None


def _shown(line: bytes) -> str:
    text = line.decode(errors="replace")
    return repr(text if len(text) <= 60 else text[:57] + "...")


def detect_layout(path: Path, delimiter: str | None = None, header: bool | None = None,
                  one_based: bool = False) -> EdgeListLayout:
    """The layout of ``path`` from its first 64 KiB; ``delimiter`` (a :data:`DELIMITERS` key)
    and ``header`` fix those guesses.

    A first line is taken for a header only on evidence: its fields are not all numbers *and*
    it has as many as the line after it (``id_1,id_2`` over ``0,1``). A first line that is
    neither an edge nor such a header is an error naming it: guessed away, it would drop an
    edge without a word. A UTF-8 byte order mark before it is skipped; a MatrixMarket file
    (its banner, whatever its name) is refused, for its size line would read as an edge.
    """
    if delimiter is not None and delimiter not in DELIMITERS:
        raise DataError(f"--delimiter {delimiter!r}: expected {', '.join(DELIMITERS)}")
    head = read_head(path, 1 << 16)
    if has_mtx_banner(head):
        raise DataError(f"{path}: a MatrixMarket file (line 1 is its %%MatrixMarket banner), "
                        "not an edge list: give --format mtx")
    bom = len(BOM) if head.startswith(BOM) else 0
    lines = head[bom:].split(b"\n")
    if len(lines) > 1 and len(head) == 1 << 16:
        lines = lines[:-1]  # the cut-off last line
    offset, data = bom, []
    for k, raw in enumerate(lines):
        text = strip_comment(raw, COMMENTS).strip()
        if text:
            data.append((k, offset, raw, text))
            if len(data) == 2:
                break
        offset += len(raw) + 1
    if not data:
        raise DataError(f"{path}: no edge lines (empty, or only comments)")
    k0, off0, first, text0 = data[0]
    first_sep = _guess_sep(text0)
    numeric = all(_numeric(f) for f in _fields(text0, first_sep))
    # the separator is the edges': the second line's when the first may be a header
    sep = DELIMITERS[delimiter] if delimiter else \
        _guess_sep(data[1][3]) if not numeric and len(data) > 1 else first_sep
    is_header = header
    if header is None and not numeric and len(data) > 1:
        k1, n0, n1 = data[1][0], len(_fields(text0, sep)), len(_fields(data[1][3], sep))
        if n0 != n1:
            raise DataError(f"{path}: line {k0 + 1}: {_shown(text0)} is no edge (not all its "
                            f"fields are numbers) and no header (its {n0} fields are not the "
                            f"{n1} of line {k1 + 1}); give --header to skip it")
        is_header = True
    elif header is None:
        is_header = not numeric  # a lone non-numeric line: no edges either way
    start, start_line = (off0 + len(first) + 1, k0 + 2) if is_header else (bom, 1)
    rows = [r for r in data if not is_header or r[0] != k0]
    if not rows:
        raise DataError(f"{path}: a header line and no edges")
    k, _, _, text = rows[0]
    n = len(_fields(text, sep))
    if n not in (2, 3):
        what = {",": "comma", "\t": "tab", None: "whitespace"}[sep]
        raise DataError(f"{path}: line {k + 1}: expected 2 or 3 {what}-separated fields "
                        f"(src, dst[, weight]), found {n}")
    return EdgeListLayout(sep, is_header, n, one_based, start, start_line)


LINE_BYTES = 16
"""Bytes of a typical line: sizes parse blocks from a chunk of edges."""


class EdgeListSource(CountedEdgeSource):
    """A delimited edge list streamed in chunks (module docstring); N from a counting pass
    (split over ``comm``) unless ``num_nodes`` is given."""

    comments = COMMENTS

    def __init__(self, path: str | Path, layout: EdgeListLayout, num_nodes: int | None = None,
                 comm: HostComm | None = None, chunk_edges: int = 1 << 21,
                 count_degrees: bool = False) -> None:
        self.layout = layout
        super().__init__(path, num_nodes, comm, chunk_edges, count_degrees, LINE_BYTES)

    def _parsed(self, part: int, nparts: int, block_bytes: int, n: int | None
                ) -> Iterator[np.ndarray]:
        lay, path = self.layout, self.path
        dtype = np.float64 if lay.columns == 3 else np.int64
        for blk in iter_blocks(path, part, nparts, block_bytes=block_bytes, start=lay.start,
                               start_line=lay.start_line):
            arr = parse(blk, ncols=lay.columns, dtype=dtype, delimiter=lay.delimiter,
                        comments=COMMENTS)
            if not arr.size:
                continue
            if lay.columns == 3:
                ids = arr[:, :2]
                bad = np.flatnonzero((ids != np.round(ids)).any(axis=1)
                                     | ~np.isfinite(arr).all(axis=1))
                if bad.size:
                    line = blk.data_line(int(bad[0]), COMMENTS)
                    raise DataError(f"{path}: line {line}: ids must be whole numbers and the "
                                    "weight finite")
                arr = ids.astype(np.int64)
            if lay.one_based:
                arr = arr - 1
            bad_id = first_id_error(arr[:, 0], arr[:, 1], 0, n)
            if bad_id is not None:
                r, _, v = bad_id
                line = blk.data_line(r, COMMENTS)
                if v < 0:
                    shown = v + 1 if lay.one_based else v
                    raise DataError(f"{path}: line {line}: node id {shown} is below "
                                    f"{1 if lay.one_based else 0}"
                                    + (" (ids read as 1-based: --one-based)"
                                       if lay.one_based else ""))
                raise DataError(f"{path}: line {line}: node id "
                                f"{v + 1 if lay.one_based else v} is outside the {n} nodes")
            yield arr


DELIMITER = option("--delimiter", "field separator (default: detected from the first line)",
                   choices=tuple(DELIMITERS))
HEADER = FormatOption("header", "--header/--no-header", (
    ("--header", {"dest": "header", "action": "store_const", "const": True,
                  "help": "the first line names the columns"}),
    ("--no-header", {"dest": "header", "action": "store_const", "const": False,
                     "help": "the first line is an edge"})))
ONE_BASED = option("--one-based", "ids count from 1", action="store_true")


def _recognise(probe: Probe) -> bool:
    return not probe.is_dir and probe.stem.endswith(EDGE_LIST_SUFFIXES)


def _open(args: argparse.Namespace, comm: HostComm | None) -> GraphSource:
    if args.feature_file is not None and args.feature_columns is not None:
        raise UsageError("--feature-file and --feature-columns both give the features; "
                         "choose one")
    layout = detect_layout(args.input, args.delimiter, args.header, args.one_based)
    table = None
    if args.node_table is not None:
        table = NodeTable(args.node_table, args.id_column, args.label_column,
                          args.feature_columns, args.one_based, args.split_column)
    n = args.nodes if table is None else count_rows(table)
    src: GraphSource = EdgeListSource(args.input, layout, n, comm=comm,
                                      chunk_edges=args.chunk_edges,
                                      count_degrees=args.permutation == "degree")
    if table is not None:
        src = NodeTableSource(src, table, n)
    if args.feature_file is not None:
        nodes_from = (f"the node table {table.path.name}" if table is not None else
                      "--nodes" if args.nodes is not None else
                      "the edge list (its largest id + 1; --nodes or a --node-table sets N)")
        src = FeatureFileSource(src, args.feature_file, args.one_based, nodes_from)
    return src


SPEC = FormatSpec(
    "edgelist", "delimited src,dst[,weight] lines (delimiter and header row detected unless "
    "given), streamed; nodes' labels (ids or names), split and features from a --node-table, "
    "sparse features from a --feature-file", _open,
    input="a delimited edge list", recognise=_recognise, order=60,
    looked_for=f"any other edge list {'/'.join(EDGE_LIST_SUFFIXES)}[.gz]",
    options=(NODES, DELIMITER, HEADER, ONE_BASED, *TABLE_OPTIONS, FEATURE_FILE))
