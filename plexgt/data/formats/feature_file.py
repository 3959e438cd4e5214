"""Sparse node features from a file of their own (``--feature-file``), as web graphs publish
them: each node's bag of feature ids, not a column per feature.

Three layouts, told apart by the file:

* a JSON mapping ``{"node id": [feature ids], ...}`` (``.json``: musae's ``*_features.json``);
* JSON lines, one node a line: ``{"id": 3, "features": [...]}`` or ``{"3": [...]}``
  (``.jsonl`` / ``.ndjson``, or a ``.json`` holding more than one value);
* COO triples ``node,feature,value`` (any other name: CSV or TSV, a header row detected;
  two columns ``node,feature`` mean value 1).

A listed feature id has the value 1 (an id listed twice in one node's list still 1: a bag of
ids is a set); a triple gives its value (a (node, feature) pair given twice is refused, for
which value is meant is not known). Node ids are the edge list's (1-based with
``--one-based``); feature ids count from 0, and F is the largest + 1. A node the file does
not list has no nonzero feature. The whole file becomes one CSR matrix in memory on every
rank (~12 bytes a nonzero: what the prepared CSR tiles hold), read by node id when the
feature blocks are built; its density decides ``--sparse-features auto`` without a pass.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import scipy.sparse as sp

from plexgt.data.formats.spec import option
from plexgt.data.source import GraphSource, NodeDataOver, parts_of
from plexgt.errors import DataError

MAX_FEATURES = 1 << 24
"""F beyond this is refused: a stray feature id (1e9) would make every dense feature row
(a feature block, the first layer's weight) gigabytes."""

FEATURE_FILE = option(
    "--feature-file", "sparse node features: a JSON {node id: [feature ids]}, JSON lines "
    "({\"id\": ..., \"features\": [...]} or {id: [...]} a line) or a CSV of node,feature,value "
    "triples; stored as CSR tiles (bag of words)", type=Path)


def _bad(path: Path, where: str, what: str) -> DataError:
    return DataError(f"{path}: {where}{': ' if where else ''}{what}")


def _node_id(path: Path, where: str, key: Any) -> int:
    """A node id given as a JSON key (text) or value (a whole number)."""
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise _bad(path, where, f"node id {key!r} is not a whole number")
    try:
        return int(key)
    except ValueError:
        raise _bad(path, where, f"node id {key!r} is not a whole number") from None


def _feature_ids(path: Path, where: str, node: int, ids: Any) -> np.ndarray:
    """One node's list of feature ids, checked: [k] int64, distinct."""
    if not isinstance(ids, list):
        raise _bad(path, where, f"node {node}: features must be a list of feature ids "
                   f"(found {type(ids).__name__})")
    arr = np.asarray(ids) if ids else np.empty(0, np.int64)
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise _bad(path, where, f"node {node}: feature ids must be whole numbers "
                   f"(found {ids[:5]!r}{'...' if len(ids) > 5 else ''})")
    if arr.size and arr.min() < 0:
        raise _bad(path, where, f"node {node}: feature id {int(arr.min())} is negative")
    return np.unique(arr.astype(np.int64))


def _lists_to_coo(path: Path, entries: Iterator[tuple[str, Any, Any]]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node ids, feature ids, values) of (where, node key, feature id list) entries."""
    nodes: list[int] = []
    rows, cols = [], []
    seen: dict[int, str] = {}
    for where, key, ids in entries:
        node = _node_id(path, where, key)
        if node in seen:
            raise _bad(path, where, f"node {node} is listed twice"
                       + (f" (first at {seen[node]})" if seen[node] else ""))
        seen[node] = where
        f = _feature_ids(path, where, node, ids)
        nodes.append(node)
        rows.append(np.full(f.size, node, dtype=np.int64))
        cols.append(f)
    if not nodes:
        raise _bad(path, "", "lists no node")
    r, c = np.concatenate(rows), np.concatenate(cols)
    return r, c, np.ones(r.size, dtype=np.float32)


def _json_entries(path: Path, text: str) -> Iterator[tuple[str, Any, Any]] | None:
    """The entries of a JSON mapping (None: the text is more than one JSON value)."""
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise _bad(path, "", f"node {dup} is listed twice")
        return dict(pairs)

    try:
        obj = json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":
            return None
        raise _bad(path, f"line {e.lineno}", f"not JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise _bad(path, "", f"a JSON feature file must map node ids to lists of feature ids "
                   f"(found a {type(obj).__name__})")
    return (("", k, v) for k, v in obj.items())


def _json_lines(path: Path, text: str) -> Iterator[tuple[str, Any, Any]]:
    """The entries of JSON lines: ``{"id": k, "features": [...]}`` or ``{"k": [...]}``."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise _bad(path, where, f"not JSON ({e.msg})") from None
        if isinstance(obj, dict) and set(obj) >= {"id", "features"}:
            yield where, obj["id"], obj["features"]
        elif isinstance(obj, dict) and len(obj) == 1:
            (k, v), = obj.items()
            yield where, k, v
        else:
            raise _bad(path, where, 'expected {"id": ..., "features": [...]} or '
                       '{"<node id>": [...]}')


def _numeric_field(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _triples(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node ids, feature ids, values) of a CSV/TSV of ``node,feature[,value]`` rows."""
    with open(path, "rb") as fh:
        first = fh.readline().decode(errors="replace").strip()
    sep = "\t" if "\t" in first and "," not in first else ","
    fields = [f.strip() for f in first.split(sep)]
    header = not all(_numeric_field(f) for f in fields)
    if len(fields) not in (2, 3):
        raise _bad(path, "line 1", f"expected node,feature[,value] (found {len(fields)} "
                   "fields)")
    names = ["node", "feature", "value"][:len(fields)]
    try:
        t = pacsv.read_csv(path, pacsv.ReadOptions(column_names=names,
                                                   skip_rows=1 if header else 0),
                           pacsv.ParseOptions(delimiter=sep),
                           pacsv.ConvertOptions(column_types={"node": pa.int64(),
                                                              "feature": pa.int64(),
                                                              "value": pa.float64()}))
    except (OSError, pa.ArrowException) as e:
        raise _bad(path, "", f"not a CSV of node,feature[,value] whole-number ids ({e})"
                   ) from None
    if any(t.column(c).null_count for c in names):
        raise _bad(path, "", "an empty cell (every row needs node,feature[,value])")
    rows = t.column("node").to_numpy()
    cols = t.column("feature").to_numpy()
    vals = (t.column("value").to_numpy().astype(np.float32) if "value" in names
            else np.ones(rows.size, np.float32))
    first_row = 2 if header else 1
    bad = np.flatnonzero(cols < 0)
    if bad.size:
        raise _bad(path, f"line {first_row + int(bad[0])}",
                   f"feature id {int(cols[bad[0]])} is negative")
    bad = np.flatnonzero(~np.isfinite(vals))
    if bad.size:
        raise _bad(path, f"line {first_row + int(bad[0])}", "the value is not finite")
    if rows.size:
        order = np.lexsort((cols, rows))
        dup = np.flatnonzero((np.diff(rows[order]) == 0) & (np.diff(cols[order]) == 0))
        if dup.size:
            i = int(order[dup[0] + 1])
            raise _bad(path, f"line {first_row + i}", f"node {int(rows[i])}, feature "
                       f"{int(cols[i])} is given twice")
    else:
        raise _bad(path, "", "lists no node")
    return rows, cols, vals


def read_feature_file(path: Path, num_nodes: int, one_based: bool, nodes_from: str
                      ) -> sp.csr_matrix:
    """The file's features as a [num_nodes, F] float32 CSR matrix (module docstring);
    ``nodes_from`` names where N came from, for the message of an id beyond it."""
    path = Path(path)
    try:
        if path.suffix.lower() in (".json", ".jsonl", ".ndjson"):
            text = path.read_text()
            entries = None if path.suffix.lower() != ".json" else _json_entries(path, text)
            rows, cols, vals = _lists_to_coo(
                path, _json_lines(path, text) if entries is None else entries)
        else:
            rows, cols, vals = _triples(path)
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read the feature file ({e})") from None
    if one_based:
        rows = rows - 1
    bad = np.flatnonzero((rows < 0) | (rows >= num_nodes))
    if bad.size:
        shown = int(rows[bad[0]]) + (1 if one_based else 0)
        raise DataError(f"{path}: node id {shown} is not among the {num_nodes} nodes of "
                        f"{nodes_from}" + (" (ids read as 1-based: --one-based)"
                                           if one_based else ""))
    f = int(cols.max()) + 1 if cols.size else 0
    if f == 0:
        raise DataError(f"{path}: lists no feature")
    if f > MAX_FEATURES:
        raise DataError(f"{path}: feature id {f - 1} would make {f} feature columns (at most "
                        f"{MAX_FEATURES}); feature ids must run 0..F-1")
    m = sp.csr_matrix((vals, (rows, cols)), shape=(num_nodes, f), dtype=np.float32)
    m.sort_indices()
    return m


class FeatureFileSource(NodeDataOver):
    """``base``'s edges, labels and split with the features of a ``--feature-file``."""

    random_access_features = True

    def __init__(self, base: GraphSource, path: Path, one_based: bool, nodes_from: str
                 ) -> None:
        self.base, self.path = base, Path(path)
        self.name = f"{base.name} + {self.path.name}"
        self.files = [*base.files, self.path]
        self.num_nodes = base.num_nodes
        self.num_edge_features = base.num_edge_features
        self.x = read_feature_file(self.path, self.num_nodes, one_based, nodes_from)
        self.num_features = int(self.x.shape[1])
        self.feature_dtype = np.dtype(np.float32)

    def feature_density(self) -> float | None:
        return self.x.nnz / max(1, self.num_nodes * self.num_features)

    def feature_rows(self, ids: np.ndarray) -> np.ndarray:
        return self.x[ids].toarray()

    def feature_chunks(self, part, nparts, chunk_rows):  # noqa: ANN001, ANN201 - see base
        for lo, hi in parts_of(self.num_nodes, chunk_rows, part, nparts):
            yield lo, self.x[lo:hi].toarray()
