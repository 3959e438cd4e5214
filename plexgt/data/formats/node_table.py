"""Node attributes from a separate table (CSV or Parquet), mapped onto an edge list's ids.

The table has one row per node: an id column, optionally label columns, and feature columns,
each named in a list (``a,b,c``) or by a prefix (``feat_*``: every column whose name starts so,
in file order). One label column holds class ids; several hold a multi-label task each (0/1,
empty = unlabelled: ogbn-proteins' layout). Ids must be 0 … N-1 (1 … N with ``one_based``),
each exactly once: N is the table's row count, so an edge naming an id beyond it is refused
by the edge reader. Read with pyarrow in record batches (Parquet by row groups, CSV by
blocks), batch k to part k % nparts, never whole; the labels (node-sized) are read whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from plexgt.data.formats.spec import option
from plexgt.data.graph import node_labels
from plexgt.data.source import GraphSource, NodeDataOver, check_finite
from plexgt.errors import DataError

BATCH_ROWS = 1 << 16

_NO_TABLE = "{label} names a column of the --node-table; none is given"
NODE_TABLE = option("--node-table", "CSV or Parquet table of the nodes (one row each; N is its "
                    "row count): their labels and features", type=Path)
ID_COLUMN = option("--id-column", "--node-table: the node id column", default="id",
                   requires="node_table", refused=_NO_TABLE)
LABEL_COLUMN = option("--label-column", "--node-table: the class id column, or several "
                      "(a,b,c or prefix*): one 0/1 task each (multi-label)",
                      requires="node_table", refused=_NO_TABLE)
FEATURE_COLUMNS = option("--feature-columns", "--node-table: feature columns, 'a,b,c' or a "
                         "prefix 'feat_*'", requires="node_table", refused=_NO_TABLE)
TABLE_OPTIONS = (NODE_TABLE, ID_COLUMN, LABEL_COLUMN, FEATURE_COLUMNS)
"""What a format that takes a node table reads (the columns only with the table)."""


@dataclass(frozen=True)
class NodeTable:
    """Which columns of which file hold the nodes' id, label and features."""

    path: Path
    id_column: str = "id"
    label_column: str | None = None
    """One name (class ids), or several (a list or ``prefix*``: one 0/1 task each)."""
    feature_columns: str | None = None
    """Comma-separated names, or ``prefix*``; None: no features."""
    one_based: bool = False

    @property
    def parquet(self) -> bool:
        return self.path.suffix.lower() in (".parquet", ".pq")

    def schema(self) -> pa.Schema:
        try:
            if self.parquet:
                return pq.ParquetFile(self.path).schema_arrow
            with pacsv.open_csv(self.path) as r:
                return r.schema
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{self.path}: not a readable {'Parquet' if self.parquet else 'CSV'}"
                            f" table ({e})") from None

    def batches(self, columns: list[str]) -> Iterator[pa.RecordBatch]:
        """The table's record batches with ``columns`` only."""
        try:
            if self.parquet:
                yield from pq.ParquetFile(self.path).iter_batches(BATCH_ROWS, columns=columns)
                return
            opts = pacsv.ConvertOptions(include_columns=columns)
            with pacsv.open_csv(self.path, convert_options=opts) as r:
                yield from r
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{self.path}: {e}") from None


def column_names(path: Path, schema: pa.Schema, spec: str, what: str) -> list[str]:
    """The columns ``spec`` names: ``a,b,c`` or ``prefix*`` (in file order)."""
    if spec.endswith("*"):
        names = [c for c in schema.names if c.startswith(spec[:-1])]
        if not names:
            raise DataError(f"{path}: no {what} column starts with {spec[:-1]!r}")
        return names
    return [c.strip() for c in spec.split(",") if c.strip()]


def _distinct(path: Path, named: list[tuple[str, str]]) -> None:
    """Refuse a column named for two roles (``--feature-columns id,f0``): the id as a
    feature, or a label among the features, is never meant (the label would leak into the
    input), and a column read twice over is one pyarrow refuses."""
    seen: dict[str, str] = {}
    for name, what in named:
        if name in seen:
            also = "twice" if seen[name] == what else f"as {seen[name]} and as {what}"
            raise DataError(f"{path}: column {name!r} is named {also} (the id, label and "
                            "feature columns must be distinct)")
        seen[name] = what


def _numeric(path: Path, schema: pa.Schema, name: str, what: str, integer: bool) -> None:
    if name not in schema.names:
        raise DataError(f"{path}: no {what} column {name!r} (columns: "
                        f"{', '.join(schema.names)})")
    t = schema.field(name).type
    ok = pa.types.is_integer(t) if integer else (pa.types.is_integer(t)
                                                 or pa.types.is_floating(t))
    if not ok:
        raise DataError(f"{path}: {what} column {name!r} has type {t}; expected "
                        f"{'integers' if integer else 'numbers'}")


class NodeTableSource(NodeDataOver):
    """``base``'s edges with the nodes' features and labels from a :class:`NodeTable`."""

    def __init__(self, base: GraphSource, table: NodeTable, num_nodes: int) -> None:
        self.base, self.table = base, table
        self.name = f"{base.name} + {table.path.name}"
        self.files = [*base.files, table.path]
        self.num_nodes = num_nodes
        self.num_edge_features = base.num_edge_features
        schema = table.schema()
        _numeric(table.path, schema, table.id_column, "id", True)
        self.label_columns = (column_names(table.path, schema, table.label_column, "label")
                              if table.label_column else [])
        for c in self.label_columns:
            _numeric(table.path, schema, c, "label", len(self.label_columns) == 1)
        self.columns = (column_names(table.path, schema, table.feature_columns, "feature")
                        if table.feature_columns else [])
        for c in self.columns:
            _numeric(table.path, schema, c, "feature", False)
        _distinct(table.path, [(table.id_column, "the id column")]
                  + [(c, "a label column") for c in self.label_columns]
                  + [(c, "a feature column") for c in self.columns])
        self.num_features = len(self.columns)
        self.feature_dtype = np.dtype(np.float32) if self.columns else None

    def _ids(self, batch: pa.RecordBatch, row0: int) -> np.ndarray:
        ids = batch.column(self.table.id_column).to_numpy(zero_copy_only=False)
        if batch.column(self.table.id_column).null_count:
            raise DataError(f"{self.table.path}: an empty id in rows {row0}..")
        ids = ids.astype(np.int64) - (1 if self.table.one_based else 0)
        bad = np.flatnonzero((ids < 0) | (ids >= self.num_nodes))
        if bad.size:
            shown = int(ids[bad[0]]) + (1 if self.table.one_based else 0)
            raise DataError(f"{self.table.path}: row {row0 + int(bad[0]) + 1}: id {shown} is "
                            f"outside the table's {self.num_nodes} nodes")
        return ids

    def feature_chunks(self, part, nparts, chunk_rows):  # noqa: ANN001, ANN201 - see base
        """(original ids [k], rows [k, F] float32) of this part's batches."""
        if not self.columns:
            return
        row0 = 0
        for k, batch in enumerate(self.table.batches([self.table.id_column, *self.columns])):
            if k % nparts == part:
                cols = [batch.column(c) for c in self.columns]
                if any(c.null_count for c in cols):
                    raise DataError(f"{self.table.path}: an empty feature value in rows "
                                    f"{row0 + 1}..{row0 + batch.num_rows}")
                x = np.stack([c.to_numpy(zero_copy_only=False).astype(np.float32)
                              for c in cols], axis=1)
                check_finite(x, row0, f"{self.table.path}: features")
                yield self._ids(batch, row0), x
            row0 += batch.num_rows

    def labels(self) -> np.ndarray | None:
        cols = self.label_columns
        if not cols:
            return None
        multi = len(cols) > 1
        out = np.full((self.num_nodes, len(cols)), np.nan if multi else -1,
                      dtype=np.float64 if multi else np.int64)
        row0 = 0
        for batch in self.table.batches([self.table.id_column, *cols]):
            ids = self._ids(batch, row0)
            for j, c in enumerate(cols):
                lab: Any = batch.column(c)
                if multi:  # an empty cell: that task is unlabelled for the node
                    vals = lab.cast(pa.float64()).to_numpy(zero_copy_only=False)
                else:
                    vals = lab.to_numpy(zero_copy_only=False) if not lab.null_count else \
                        np.asarray(lab.fill_null(-1))
                out[ids, j] = vals
            row0 += batch.num_rows
        return node_labels(out, f"{self.table.path}: column{'s' if multi else ''} "
                                f"{', '.join(map(repr, cols))}")

    def splits(self) -> dict[str, np.ndarray]:
        return self.base.splits()


def count_rows(table: NodeTable) -> int:
    """The table's rows (its N), from Parquet metadata or one pass over a CSV's ids."""
    _numeric(table.path, table.schema(), table.id_column, "id", True)
    if table.parquet:
        try:
            return pq.ParquetFile(table.path).metadata.num_rows
        except (OSError, pa.ArrowInvalid) as e:
            raise DataError(f"{table.path}: not a readable Parquet table ({e})") from None
    return sum(b.num_rows for b in table.batches([table.id_column]))
