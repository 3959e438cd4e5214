"""Node attributes from a separate table (CSV or Parquet), mapped onto an edge list's ids.

The table has one row per node: an id column, optionally label columns, a split column, and
feature columns, each named in a list (``a,b,c``) or by a prefix (``feat_*``: every column
whose name starts so, in file order). One label column holds class ids, or class names (text:
the sorted distinct names become ids 0..C-1, and the manifest keeps them as ``label_names``);
several hold a multi-label task each (0/1, empty = unlabelled: ogbn-proteins' layout). The
split column says train, valid (or val, validation) or test; an empty cell leaves the node in
no split. Ids must be 0 … N-1 (1 … N with ``one_based``), each exactly once: N is the table's
row count, so an edge naming an id beyond it is refused by the edge reader. Read with pyarrow
in record batches (Parquet by row groups, CSV by blocks), batch k to part k % nparts, never
whole; the labels and the split (node-sized) are read whole.
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
                    "row count): their labels, split and features", type=Path)
ID_COLUMN = option("--id-column", "--node-table: the node id column", default="id",
                   requires="node_table", refused=_NO_TABLE)
LABEL_COLUMN = option("--label-column", "--node-table: the class column (class ids, or class "
                      "names: their sorted list becomes ids 0..C-1, kept in the manifest), or "
                      "several (a,b,c or prefix*): one 0/1 task each (multi-label)",
                      requires="node_table", refused=_NO_TABLE)
SPLIT_COLUMN = option("--split-column", "--node-table: the column saying train, valid (val, "
                      "validation) or test for each node (an empty cell: in no split); without "
                      "it, and for any source without a split of its own, prep draws a random "
                      "60/20/20 train/valid/test split from --seed",
                      requires="node_table", refused=_NO_TABLE)
FEATURE_COLUMNS = option("--feature-columns", "--node-table: feature columns, 'a,b,c' or a "
                         "prefix 'feat_*'", requires="node_table", refused=_NO_TABLE)
TABLE_OPTIONS = (NODE_TABLE, ID_COLUMN, LABEL_COLUMN, FEATURE_COLUMNS, SPLIT_COLUMN)
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
    split_column: str | None = None
    """train / valid / test of each node (:data:`SPLIT_VALUES`); None: not in the table."""

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


SPLIT_VALUES = {"train": "train", "valid": "valid", "val": "valid", "validation": "valid",
                "test": "test"}
"""A split column's values (any case, spaces around ignored) -> the split."""


def _is_text(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _text_or_empty(path: Path, schema: pa.Schema, name: str, what: str) -> None:
    """Refuse a missing column, or one that holds neither text nor only empty cells."""
    if name not in schema.names:
        raise DataError(f"{path}: no {what} column {name!r} (columns: "
                        f"{', '.join(schema.names)})")
    t = schema.field(name).type
    if not (_is_text(t) or pa.types.is_null(t)):
        raise DataError(f"{path}: {what} column {name!r} has type {t}; expected text "
                        "(train, valid, test)")


def _strings(col: Any) -> list[str | None]:
    """A text (or all-empty) column's cells, stripped; None for an empty one."""
    vals = col.to_pylist()
    return [None if v is None or not str(v).strip() else str(v).strip() for v in vals]


def _numeric(path: Path, schema: pa.Schema, name: str, what: str, integer: bool,
             text: bool = False) -> None:
    """Refuse a missing column, or one whose type is not numbers (integers: ``integer``;
    text also: ``text``, a class column of names)."""
    if name not in schema.names:
        raise DataError(f"{path}: no {what} column {name!r} (columns: "
                        f"{', '.join(schema.names)})")
    t = schema.field(name).type
    if text and _is_text(t):
        return
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
            one = len(self.label_columns) == 1
            _numeric(table.path, schema, c, "label", one, text=one)
        self._names: list[str] | None = None
        self._splits: dict[str, np.ndarray] = {}
        if table.split_column:  # read now: a bad value is refused before any work is done
            _text_or_empty(table.path, schema, table.split_column, "split")
        self.columns = (column_names(table.path, schema, table.feature_columns, "feature")
                        if table.feature_columns else [])
        for c in self.columns:
            _numeric(table.path, schema, c, "feature", False)
        _distinct(table.path, [(table.id_column, "the id column")]
                  + [(c, "a label column") for c in self.label_columns]
                  + [(c, "a feature column") for c in self.columns]
                  + ([(table.split_column, "the split column")] if table.split_column else []))
        if table.split_column:
            self._splits = self._read_splits(table.split_column)
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
        if not multi and _is_text(self.table.schema().field(cols[0]).type):
            return self._named_labels(cols[0])
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

    def _column(self, name: str) -> tuple[np.ndarray, list[str | None]]:
        """(original ids, stripped text cells) of a text column, read whole."""
        ids, cells, row0 = [], [], 0
        for batch in self.table.batches([self.table.id_column, name]):
            ids.append(self._ids(batch, row0))
            cells += _strings(batch.column(name))
            row0 += batch.num_rows
        return (np.concatenate(ids) if ids else np.empty(0, np.int64)), cells

    def _named_labels(self, col: str) -> np.ndarray:
        """[N] class ids of a column of class names: the sorted distinct names are classes
        0..C-1 (so the ids do not depend on the row order); an empty cell: unlabelled."""
        ids, cells = self._column(col)
        self._names = sorted({c for c in cells if c is not None})
        index = {name: k for k, name in enumerate(self._names)}
        out = np.full(self.num_nodes, -1, dtype=np.int64)
        out[ids] = [-1 if c is None else index[c] for c in cells]
        return out

    def label_names(self) -> list[str] | None:
        if not self.label_columns:
            return None
        if self._names is None and _is_text(self.table.schema().field(
                self.label_columns[0]).type):
            self.labels()
        return self._names

    def splits(self) -> dict[str, np.ndarray]:
        """From the split column (:data:`SPLIT_VALUES`), else the base's."""
        return dict(self._splits) if self.table.split_column else self.base.splits()

    def _read_splits(self, col: str) -> dict[str, np.ndarray]:
        ids, cells = self._column(col)
        which = np.full(ids.size, -1, dtype=np.int8)
        names = ("train", "valid", "test")
        for r, c in enumerate(cells):
            if c is None:
                continue
            k = SPLIT_VALUES.get(c.lower())
            if k is None:
                raise DataError(f"{self.table.path}: row {r + 1}: split {c!r} in column "
                                f"{col!r} is not train, valid (val, validation) or test")
            which[r] = names.index(k)
        return {k: np.sort(ids[which == j]) for j, k in enumerate(names)}

    def split_origin(self) -> dict[str, Any]:
        if not self.table.split_column:
            return self.base.split_origin()
        return {"origin": "column", "column": self.table.split_column,
                "file": str(self.table.path)}


def count_rows(table: NodeTable) -> int:
    """The table's rows (its N), from Parquet metadata or one pass over a CSV's ids."""
    _numeric(table.path, table.schema(), table.id_column, "id", True)
    if table.parquet:
        try:
            return pq.ParquetFile(table.path).metadata.num_rows
        except (OSError, pa.ArrowInvalid) as e:
            raise DataError(f"{table.path}: not a readable Parquet table ({e})") from None
    return sum(b.num_rows for b in table.batches([table.id_column]))
