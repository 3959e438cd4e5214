"""Predictions files: one row per node of the raw input, in its node id order, written by
every rank of a job (``plexgt predict``) and read back by ``plexgt evaluate --predictions``.

Columns (N rows; row i is the node of original id i, its raw id ``node_id``):

==============  ====================  ======================================================
column          type                  what
==============  ====================  ======================================================
node_id         int64                 the node's id in the raw input (1-based inputs: +1)
split           'train' ... 'none'    the split the prepared directory puts it in
pred            int64                 argmax of the logits (class labels only)
prob            float [T]             sigmoid of the logits (multi-label tasks only)
logits          float [C]             the model's output (float32, or float64 runs' float64)
embedding       float [D]             ``--embeddings LAYER``: that layer's output (optional)
==============  ====================  ======================================================

Formats, by suffix: ``.parquet`` (vector columns as fixed-size lists; the run's description
in the schema metadata under ``plexgt``), ``.h5`` / ``.hdf5`` (one dataset a column; the
description in the file's ``plexgt`` attribute) and ``.npy`` (one structured array, a field a
column; no room for the description).

Why a rank's rows are one contiguous block of node ids (block r of P, ceil(N/P) each): each
rank then writes its own rows at a known offset — a slice of the ``.npy`` memmap, a hyperslab
of each HDF5 dataset, a part file of row groups for Parquet — and nothing is gathered to one
rank. Parquet cannot be written by several processes at once, so rank 0 assembles the parts
in rank order, one row group at a time (memory: one row group). HDF5 without MPI-IO is
written by one rank at a time, in rank order. Everything goes to a temporary name beside the
output and is renamed at the end: a failed run leaves no partial file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from plexgt.errors import DataError, UsageError

FORMATS = {".parquet": "parquet", ".h5": "hdf5", ".hdf5": "hdf5", ".npy": "npy"}
"""Output suffix -> format."""
SPLIT_NAMES = ("none", "train", "valid", "test")
"""Split code -> the name the split column holds (code 0: in no split)."""
META_KEY = "plexgt"
ROW_GROUP = 1 << 17
"""Rows per Parquet row group: bounds the memory of writing and of assembling the parts."""
PART = re.compile(r"part-\d{5,}\.parquet")


def output_format(path: Path) -> str:
    """The format of an output path by its suffix; UsageError for another suffix."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise UsageError(f"{path}: unknown output format '{Path(path).suffix}'; name the file "
                         f"with one of {', '.join(FORMATS)}")
    return fmt


@dataclass(frozen=True)
class Schema:
    """What a predictions file holds besides its N rows' ids and splits."""

    n: int
    """Rows (nodes)."""
    classes: int
    """C logits a row (T for multi-label tasks)."""
    multilabel: bool
    dtype: str
    """'float32' or 'float64': the float columns'."""
    embedding: int = 0
    """D columns of ``embedding``; 0: none."""
    meta: dict[str, Any] = field(default_factory=dict)
    """The run's description (checkpoint, epoch, dataset, model, layer...), stored as JSON."""

    def columns(self) -> list[str]:
        cols = ["node_id", "split", "prob" if self.multilabel else "pred", "logits"]
        return cols + (["embedding"] if self.embedding else [])

    def width(self, column: str) -> int:
        """Entries a row of ``column`` holds (1 for a scalar column)."""
        return {"prob": self.classes, "logits": self.classes,
                "embedding": self.embedding}.get(column, 1)

    def npy_dtype(self) -> np.dtype:
        f = np.dtype(self.dtype)
        fields: list[tuple[Any, ...]] = [("node_id", "<i8"), ("split", "S5")]
        fields.append(("prob", f, (self.classes,)) if self.multilabel else ("pred", "<i8"))
        fields.append(("logits", f, (self.classes,)))
        if self.embedding:
            fields.append(("embedding", f, (self.embedding,)))
        return np.dtype(fields)

    def arrow_schema(self) -> pa.Schema:
        f = pa.from_numpy_dtype(np.dtype(self.dtype))
        types = {"node_id": pa.int64(), "split": pa.string(), "pred": pa.int64(),
                 "prob": pa.list_(f, self.classes), "logits": pa.list_(f, self.classes),
                 "embedding": pa.list_(f, max(1, self.embedding))}
        return pa.schema([(c, types[c]) for c in self.columns()],
                         metadata={META_KEY: json.dumps(self.meta, sort_keys=True)})


@dataclass
class Block:
    """One rank's rows: nodes [lo, lo + k) of the original order, every column of the schema."""

    lo: int
    columns: dict[str, np.ndarray]
    """Column -> [k] or [k, width] ('split' as codes into :data:`SPLIT_NAMES`)."""

    @property
    def rows(self) -> int:
        return len(self.columns["node_id"])


def node_id_base(pg: Any) -> int:
    """What to add to an original node id (0 … N-1) to get the raw input's id of a prepared
    graph (a :class:`~plexgt.data.prepared_graph.PreparedGraph`): 1 where prep read the input
    as 1-based (``--one-based``), else 0."""
    return 1 if (pg.manifest.get("source") or {}).get("one_based") else 0


def split_names(codes: np.ndarray) -> np.ndarray:
    return np.asarray(SPLIT_NAMES)[np.asarray(codes, dtype=np.int64)]


def split_codes(values: np.ndarray, where: str) -> np.ndarray:
    """[k] split names (str or bytes) -> codes; DataError naming ``where`` for another name."""
    v = np.asarray(values)
    if v.dtype.kind == "S":
        v = v.astype("U")
    elif v.dtype.kind == "O":
        v = np.array([x.decode() if isinstance(x, bytes) else str(x) for x in v], dtype="U")
    out = np.full(v.shape, -1, dtype=np.int8)
    for code, name in enumerate(SPLIT_NAMES):
        out[v == name] = code
    if (out < 0).any():
        bad = v[np.flatnonzero(out < 0)[0]]
        raise DataError(f"{where}: split {bad!r} is not one of {', '.join(SPLIT_NAMES)}")
    return out


def _os_error(path: Path, e: OSError, doing: str) -> UsageError:
    return UsageError(f"{e.filename or path}: cannot {doing} ({e.strerror or e})")


class PredictionsWriter:
    """The output file of one job: rank 0 checks and creates it, every rank writes its
    :class:`Block`, rank 0 assembles and renames it (the caller agrees between the steps,
    and on failure rank 0 calls :meth:`discard`)."""

    def __init__(self, path: Path, rank: int, size: int, overwrite: bool = False,
                 schema: Schema | None = None) -> None:
        self.path = Path(path)
        self.format = output_format(self.path)
        self.schema = schema
        """Set before :meth:`begin` (:meth:`check` needs none)."""
        self.rank, self.size = rank, size
        self.overwrite = overwrite
        self.tmp = self.path.with_name(f".{self.path.name}.plexgt-tmp")
        self.parts = self.path.with_name(f".{self.path.name}.plexgt-parts")

    @property
    def sequential(self) -> bool:
        """Whether the ranks write one at a time, in rank order (HDF5 without MPI-IO)."""
        return self.format == "hdf5"

    def check(self) -> None:
        """Rank 0, before any work: the output does not exist (or ``overwrite``), its directory
        does and is writable."""
        p = self.path
        if p.is_dir():
            raise UsageError(f"{p}: is a directory; name the output file")
        if os.path.lexists(p) and not self.overwrite:
            raise UsageError(f"{p}: exists; pass --overwrite to replace it")
        if not p.parent.is_dir():
            raise UsageError(f"{p.parent}: no such directory for the output {p.name}")
        self._clear()
        try:
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            os.close(fd)
            os.unlink(self.tmp)
        except OSError as e:
            raise UsageError(f"{p}: cannot write the output ({e.strerror or e})") from None

    def _clear(self) -> None:
        """Remove what a killed run left under the temporary names (only plexgt's names)."""
        try:
            if os.path.lexists(self.tmp) and not self.tmp.is_dir():
                os.unlink(self.tmp)
            if self.parts.is_dir() and not self.parts.is_symlink():
                names = os.listdir(self.parts)
                if all(PART.fullmatch(n) for n in names):
                    shutil.rmtree(self.parts)
        except OSError as e:
            raise _os_error(self.tmp, e, "remove a temporary file") from None

    def begin(self) -> None:
        """Rank 0: create the temporary output the ranks write into."""
        s = self._schema()
        try:
            if self.format == "npy":
                np.lib.format.open_memmap(self.tmp, mode="w+", dtype=s.npy_dtype(),
                                          shape=(s.n,)).flush()
            elif self.format == "hdf5":
                with h5py.File(self.tmp, "w") as f:
                    f.attrs[META_KEY] = json.dumps(s.meta, sort_keys=True)
                    for c in s.columns():
                        w = s.width(c)
                        dt = {"node_id": "<i8", "pred": "<i8", "split": "S5"}.get(c, s.dtype)
                        f.create_dataset(c, shape=(s.n, w) if c in ("prob", "logits",
                                                                    "embedding") else (s.n,),
                                         dtype=dt)
            elif self.size > 1:
                self.parts.mkdir()
        except OSError as e:
            raise _os_error(self.tmp, e, "create the output") from None

    def _schema(self) -> Schema:
        if self.schema is None:
            raise ValueError("PredictionsWriter: set its schema before writing")
        return self.schema

    def write(self, block: Block) -> None:
        """This rank's rows, at their offset (HDF5: when its turn comes)."""
        lo, hi = block.lo, block.lo + block.rows
        cols = block.columns
        try:
            if self.format == "npy":
                if hi > lo:
                    m = np.load(self.tmp, mmap_mode="r+")
                    rows = np.empty(hi - lo, dtype=m.dtype)
                    for c in self._schema().columns():
                        rows[c] = split_names(cols[c]).astype("S5") if c == "split" else cols[c]
                    m[lo:hi] = rows
                    m.flush()
                    del m
            elif self.format == "hdf5":
                if hi > lo:
                    with h5py.File(self.tmp, "r+") as f:
                        for c in self._schema().columns():
                            v = split_names(cols[c]).astype("S5") if c == "split" else cols[c]
                            f[c][lo:hi] = v
            else:
                self._write_parquet(self.tmp if self.size == 1 else self._part(self.rank),
                                    block)
        except OSError as e:
            raise _os_error(self.tmp, e, "write the output") from None

    def _part(self, rank: int) -> Path:
        return self.parts / f"part-{rank:05d}.parquet"

    def _write_parquet(self, target: Path, block: Block) -> None:
        schema = self._schema().arrow_schema()
        with pq.ParquetWriter(target, schema) as w:
            for a in range(0, max(block.rows, 1), ROW_GROUP):
                b = min(block.rows, a + ROW_GROUP)
                w.write_table(self._table(block, a, b, schema))

    def _table(self, block: Block, a: int, b: int, schema: pa.Schema) -> pa.Table:
        arrays = []
        for c in self._schema().columns():
            v = block.columns[c][a:b]
            if c == "split":
                arrays.append(pa.array(split_names(v), type=pa.string()))
            elif v.ndim == 2:
                arrays.append(pa.FixedSizeListArray.from_arrays(
                    pa.array(np.ascontiguousarray(v).reshape(-1)), v.shape[1]))
            else:
                arrays.append(pa.array(v))
        return pa.Table.from_arrays(arrays, schema=schema)

    def finish(self) -> None:
        """Rank 0, once every rank has written: assemble (Parquet parts, in rank order, one
        row group at a time) and rename the temporary output to the output."""
        try:
            if self.format == "parquet" and self.size > 1:
                schema = self._schema().arrow_schema()
                with pq.ParquetWriter(self.tmp, schema) as w:
                    for r in range(self.size):
                        part = pq.ParquetFile(self._part(r))
                        for g in range(part.num_row_groups):
                            t = part.read_row_group(g)
                            if t.num_rows:
                                w.write_table(t)
                shutil.rmtree(self.parts)
            if os.path.lexists(self.path) and not self.overwrite:
                raise UsageError(f"{self.path}: appeared while predicting; pass --overwrite "
                                 "to replace it")
            os.replace(self.tmp, self.path)
        except OSError as e:
            raise _os_error(self.path, e, "write the output") from None

    def discard(self) -> None:
        """Rank 0 after a failure: remove the temporaries (the output is never touched)."""
        try:
            self._clear()
        except UsageError:
            pass


class PredictionsFile:
    """A predictions file opened for reading, column chunks at a time."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise UsageError(f"{self.path}: no such predictions file")
        self.format = output_format(self.path)
        try:
            if self.format == "npy":
                self._npy = np.load(self.path, mmap_mode="r")
                if self._npy.dtype.names is None or self._npy.ndim != 1:
                    raise DataError(f"{self.path}: not a plexgt predictions array (a 1-D "
                                    "structured array)")
                self.n = len(self._npy)
                self.columns = list(self._npy.dtype.names)
                self.meta: dict[str, Any] = {}
            elif self.format == "hdf5":
                with h5py.File(self.path, "r") as f:
                    self.columns = [c for c in f.keys()]
                    self.n = len(f["node_id"]) if "node_id" in f else 0
                    self.meta = json.loads(f.attrs.get(META_KEY, "{}"))
            else:
                pf = pq.ParquetFile(self.path)
                self.n = pf.metadata.num_rows
                self.columns = pf.schema_arrow.names
                raw = (pf.schema_arrow.metadata or {}).get(META_KEY.encode(), b"{}")
                self.meta = json.loads(raw)
        except (OSError, ValueError) as e:
            raise DataError(f"{self.path}: not a readable predictions file ({e})") from None
        for need in ("node_id", "split"):
            if need not in self.columns:
                raise DataError(f"{self.path}: has no '{need}' column (columns: "
                                f"{', '.join(self.columns)})")

    def chunks(self, names: list[str], rows: int = ROW_GROUP
               ) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """(first row, {column: [k] or [k, w] array}) for consecutive row ranges; 'split' as
        codes."""
        missing = [c for c in names if c not in self.columns]
        if missing:
            raise DataError(f"{self.path}: has no '{missing[0]}' column (columns: "
                            f"{', '.join(self.columns)})")

        def fix(c: str, v: np.ndarray) -> np.ndarray:
            return split_codes(v, str(self.path)) if c == "split" else np.asarray(v)

        if self.format == "parquet":
            pf = pq.ParquetFile(self.path)
            lo = 0
            for batch in pf.iter_batches(batch_size=rows, columns=names):
                out = {}
                for c in names:
                    col = batch.column(c)
                    if pa.types.is_fixed_size_list(col.type):
                        out[c] = col.flatten().to_numpy().reshape(len(col), col.type.list_size)
                    else:
                        out[c] = fix(c, col.to_numpy(zero_copy_only=False))
                yield lo, out
                lo += batch.num_rows
        elif self.format == "hdf5":
            with h5py.File(self.path, "r") as f:
                for lo in range(0, self.n, rows):
                    yield lo, {c: fix(c, f[c][lo:lo + rows]) for c in names}
        else:
            for lo in range(0, self.n, rows):
                part = self._npy[lo:lo + rows]
                yield lo, {c: fix(c, part[c]) for c in names}
