"""Predictions files in one process: each format's writer as several ranks drive it, read
back; its refusals; the exchange into node-id blocks on one rank; evaluate of a file."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from plexgt.data.predictions import (
    Block,
    PredictionsFile,
    PredictionsWriter,
    Schema,
    output_format,
)
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.synthetic import sbm
from plexgt.distributed.grid import block_bounds
from plexgt.errors import DataError, UsageError
from plexgt.parallel.inference import ShardIndex, to_id_blocks
from plexgt.training.inference import evaluate_file

N, C, D = 23, 3, 2


def _schema(multilabel: bool = False, embedding: int = D, dtype: str = "float64") -> Schema:
    return Schema(N, C, multilabel, dtype, embedding, {"epoch": 7, "model": "gcn"})


def _blocks(p: int, schema: Schema, rng: np.random.Generator) -> list[Block]:
    """Rank r's rows of a random whole: block r of p (ceil(N/p) each; trailing ones short or
    empty, as the job's)."""
    out = []
    for r in range(p):
        lo, hi = block_bounds(N, p, r)
        k = hi - lo
        cols = {"node_id": np.arange(lo, hi, dtype=np.int64),
                "split": rng.integers(0, 4, k).astype(np.int8),
                "logits": rng.standard_normal((k, C)).astype(schema.dtype)}
        if schema.multilabel:
            cols["prob"] = rng.random((k, C)).astype(schema.dtype)
        else:
            cols["pred"] = rng.integers(0, C, k)
        if schema.embedding:
            cols["embedding"] = rng.standard_normal((k, schema.embedding)).astype(schema.dtype)
        out.append(Block(lo, cols))
    return out


def _write(path: Path, schema: Schema, blocks: list[Block], overwrite: bool = False) -> None:
    """What the job does, each rank's part in turn: check, begin (rank 0), write (every
    rank), finish (rank 0)."""
    p = len(blocks)
    ws = [PredictionsWriter(path, r, p, overwrite, schema) for r in range(p)]
    ws[0].check()
    ws[0].begin()
    for w, b in zip(ws, blocks):
        w.write(b)
    ws[0].finish()


def _read(path: Path, columns: list[str], rows: int = 5) -> dict[str, np.ndarray]:
    f = PredictionsFile(path)
    parts: dict[str, list[np.ndarray]] = {c: [] for c in columns}
    start = 0
    for lo, ch in f.chunks(columns, rows):
        assert lo == start
        start += len(ch["node_id"])
        for c in columns:
            parts[c].append(ch[c])
    assert start == N == f.n
    return {c: np.concatenate(v) for c, v in parts.items()}


@pytest.mark.parametrize("suffix", [".parquet", ".h5", ".npy"])
@pytest.mark.parametrize("p", [1, 4, 6])
@pytest.mark.parametrize("multilabel", [False, True])
def test_every_format_holds_every_ranks_rows_in_node_order(tmp_path, suffix, p, multilabel):
    """4 ranks split 23 rows 6+6+6+5, 6 ranks 4+4+4+4+4+3; read back in chunks of 5 rows the
    file is the ranks' blocks concatenated, every column, split names included."""
    schema = _schema(multilabel)
    blocks = _blocks(p, schema, np.random.default_rng(p))
    path = tmp_path / f"pred{suffix}"
    _write(path, schema, blocks)
    got = _read(path, schema.columns())
    for c in schema.columns():
        want = np.concatenate([b.columns[c] for b in blocks])
        assert got[c].dtype.kind == want.dtype.kind and np.array_equal(got[c], want), c
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporaries left


def test_parquet_schema_and_description(tmp_path):
    """Parquet through pyarrow alone: the columns' types (vectors as fixed-size lists of the
    run's float), the description under 'plexgt', one row group per part at most."""
    schema = _schema(dtype="float32")
    path = tmp_path / "p.parquet"
    _write(path, schema, _blocks(3, schema, np.random.default_rng(0)))
    t = pq.read_table(path)
    assert t.schema.names == ["node_id", "split", "pred", "logits", "embedding"]
    assert t.schema.field("node_id").type == pa.int64()
    assert t.schema.field("split").type == pa.string()
    assert t.schema.field("logits").type == pa.list_(pa.float32(), C)
    assert t.schema.field("embedding").type == pa.list_(pa.float32(), D)
    assert json.loads(t.schema.metadata[b"plexgt"]) == {"epoch": 7, "model": "gcn"}
    assert t.column("node_id").to_pylist() == list(range(N))
    assert set(t.column("split").to_pylist()) <= {"none", "train", "valid", "test"}
    assert pq.ParquetFile(path).num_row_groups == 3


def test_hdf5_and_npy_layouts(tmp_path):
    schema = _schema()
    _write(tmp_path / "p.h5", schema, _blocks(2, schema, np.random.default_rng(1)))
    with h5py.File(tmp_path / "p.h5") as f:
        assert sorted(f) == sorted(schema.columns())
        assert f["logits"].shape == (N, C) and f["embedding"].shape == (N, D)
        assert f["split"].dtype == np.dtype("S5")
        assert json.loads(f.attrs["plexgt"])["epoch"] == 7
    _write(tmp_path / "p.npy", schema, _blocks(2, schema, np.random.default_rng(1)))
    a = np.load(tmp_path / "p.npy")
    assert a.dtype.names == tuple(schema.columns()) and a["logits"].shape == (N, C)


def test_refusals_leave_the_directory_as_it_was(tmp_path):
    schema = _schema()
    with pytest.raises(UsageError, match=r"x\.csv: unknown output format '\.csv'"):
        output_format(tmp_path / "x.csv")
    old = tmp_path / "old.npy"
    old.write_text("mine")
    with pytest.raises(UsageError, match="old.npy: exists; pass --overwrite to replace it"):
        PredictionsWriter(old, 0, 1).check()
    with pytest.raises(UsageError, match="no such directory for the output x.npy"):
        PredictionsWriter(tmp_path / "nodir" / "x.npy", 0, 1).check()
    (tmp_path / "d.npy").mkdir()
    with pytest.raises(UsageError, match="d.npy: is a directory"):
        PredictionsWriter(tmp_path / "d.npy", 0, 1, overwrite=True).check()
    (tmp_path / "d.npy").rmdir()
    assert old.read_text() == "mine"
    _write(old, schema, _blocks(1, schema, np.random.default_rng(2)), overwrite=True)
    assert len(np.load(old)) == N
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.npy"]


@pytest.mark.parametrize("suffix", [".parquet", ".h5", ".npy"])
def test_a_failed_job_leaves_no_partial_output(tmp_path, suffix):
    """Rank 0's discard after some ranks wrote removes the temporaries; a killed job's
    leftovers under the temporary names are cleared by the next job's check."""
    schema = _schema()
    path = tmp_path / f"out{suffix}"
    blocks = _blocks(3, schema, np.random.default_rng(3))
    ws = [PredictionsWriter(path, r, 3, False, schema) for r in range(3)]
    ws[0].check()
    ws[0].begin()
    ws[1].write(blocks[1])
    ws[0].discard()
    assert list(tmp_path.iterdir()) == []
    ws[0].begin()
    ws[2].write(blocks[2])  # killed here: the temporaries stay ...
    assert list(tmp_path.iterdir())
    _write(path, schema, blocks)  # ... and the next job clears them
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_to_id_blocks_places_shards_by_node_id_and_column():
    """One rank: rows in a permuted order with padding ids (>= N) and padding columns (-1)
    land at their node id and column; the padding nowhere."""
    n = 5
    ids = torch.tensor([3, 0, 4, 9, 1, 2])  # 9: a padding row
    cols = torch.tensor([2, -1, 0])
    vals = torch.arange(18, dtype=torch.float64).reshape(6, 3)
    out = to_id_blocks(vals, ShardIndex(ids, cols, 3), n)
    want = torch.zeros(n, 3, dtype=torch.float64)
    for r, i in enumerate(ids.tolist()):
        if i < n:
            want[i, 2], want[i, 0] = vals[r, 0], vals[r, 2]
    assert torch.equal(out, want)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("prep") / "g"
    g = sbm(num_nodes=200, num_edges=1500, num_classes=3, num_features=4, seed=3)
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False))
    return g, out


def _predictions(path: Path, g, pred: np.ndarray, split: np.ndarray | None = None) -> None:
    n = g.num_nodes
    if split is None:
        split = np.zeros(n, dtype=np.int8)
        for code, s in enumerate(("train", "valid", "test"), start=1):
            split[g.splits[s]] = code
    schema = Schema(n, 3, False, "float32", 0, {})
    logits = np.eye(3, dtype=np.float32)[pred]
    _write_n(path, schema, Block(0, {"node_id": np.arange(n), "split": split, "pred": pred,
                                     "logits": logits}))


def _write_n(path: Path, schema: Schema, block: Block) -> None:
    w = PredictionsWriter(path, 0, 1, True, schema)
    w.check()
    w.begin()
    w.write(block)
    w.finish()


def test_evaluate_file_counts_against_the_prepared_labels(prepared, tmp_path):
    """Predictions right on every node but 7 test nodes: accuracy 1 on train and valid,
    1 - 7/|test| on test (the labels are read in the raw order, through the permutation)."""
    g, data = prepared
    pred = g.labels.copy()
    wrong = g.splits["test"][:7]
    pred[wrong] = (pred[wrong] + 1) % 3
    _predictions(tmp_path / "p.parquet", g, pred)
    got = evaluate_file(tmp_path / "p.parquet", data)
    assert got == {"train_acc": 1.0, "valid_acc": 1.0,
                   "test_acc": 1 - 7 / len(g.splits["test"])}


def test_evaluate_file_refuses_predictions_of_another_graph(prepared, tmp_path):
    g, data = prepared
    split = np.zeros(g.num_nodes, dtype=np.int8)
    _predictions(tmp_path / "s.npy", g, g.labels, split)
    with pytest.raises(DataError, match=r"s\.npy: node \d+ is in split none, .* puts it in"):
        evaluate_file(tmp_path / "s.npy", data)
    schema = Schema(50, 3, False, "float32", 0, {})
    _write_n(tmp_path / "n.h5", schema, Block(0, {
        "node_id": np.arange(50), "split": np.zeros(50, dtype=np.int8),
        "pred": np.zeros(50, dtype=np.int64), "logits": np.zeros((50, 3), np.float32)}))
    with pytest.raises(DataError, match=r"n\.h5: 50 rows, but .* has N=200 nodes"):
        evaluate_file(tmp_path / "n.h5", data)


def test_one_based_inputs_keep_their_ids(tmp_path):
    """A graph prepped from 1-based ids (--one-based): the file's node ids are the input's,
    1 … N, and a file of 0-based ids is refused as another order."""
    g = sbm(num_nodes=50, num_edges=300, num_classes=3, num_features=4, seed=4)
    data = tmp_path / "g"
    prepare(MemorySource(g), PrepOptions(out=data, tiles=1, progress=False,
                                         source_desc={"format": "edgelist",
                                                      "one_based": True}))
    split = np.zeros(50, dtype=np.int8)
    for code, s in enumerate(("train", "valid", "test"), start=1):
        split[g.splits[s]] = code
    cols = {"split": split, "pred": g.labels, "logits": np.zeros((50, 3), np.float32)}
    schema = Schema(50, 3, False, "float32", 0, {})
    _write_n(tmp_path / "p.npy", schema, Block(0, {"node_id": np.arange(1, 51), **cols}))
    assert evaluate_file(tmp_path / "p.npy", data)["test_acc"] == 1.0
    _write_n(tmp_path / "q.npy", schema, Block(0, {"node_id": np.arange(50), **cols}))
    with pytest.raises(DataError, match=r"row 0 holds node 0, not 1: not plexgt's node id "):
        evaluate_file(tmp_path / "q.npy", data)
