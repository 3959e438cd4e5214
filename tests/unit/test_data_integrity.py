"""No silent corruption: damaged tiles and edited manifests are found where they are read;
prep refuses non-integer ids and labels, absurd class counts and sizes, overlapping splits;
an output prep cannot create is a one-line error."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from plexgt.cli import main
from plexgt.data.formats.gnn_benchmark import read_gnn_benchmark
from plexgt.data.loader import PreparedGraph, read_adjacency_q
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.errors import DataError
from tests.datagen import small_graph, write_gnn_benchmark


@pytest.fixture
def prepared(tmp_path) -> Path:
    prepare(MemorySource(small_graph(60, 400)), PrepOptions(out=tmp_path / "o", tiles=2,
                                                            progress=False))
    return tmp_path / "o"


def test_a_damaged_tile_is_found_by_its_chunk_checksum(prepared):
    pg = PreparedGraph(prepared)
    good = read_adjacency_q(pg)
    pg.close()
    f = prepared / "A2" / "rows_00000.h5"
    with h5py.File(f, "r") as h:
        ds = h["t00000/indices"]
        assert ds.fletcher32
        off = ds.id.get_chunk_info(0).byte_offset
    data = bytearray(f.read_bytes())
    data[off + 3] ^= 0x40
    f.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"rows_00000.h5: corrupt dataset 't00000/indices'"):
        read_adjacency_q(PreparedGraph(prepared))
    assert good.nnz > 0


@pytest.mark.parametrize("key", ["N", "F", "C"])
def test_an_edited_manifest_is_refused(prepared, key):
    mpath = prepared / "manifest.json"
    m = json.loads(mpath.read_text())
    m[key] -= 1
    mpath.write_text(json.dumps(m))
    with pytest.raises(DataError, match=f"manifest.json: {key}={m[key]} but .*nodes.h5 was "
                                        f"written with {key}={m[key] + 1}"):
        PreparedGraph(prepared)


def _npz(tmp_path: Path, **change) -> Path:
    g = small_graph(30, 120)
    p = write_gnn_benchmark(tmp_path / "g.npz", g)
    z = dict(np.load(p))
    z.update(change)
    np.savez(p, **z)
    return p


def test_float_labels_are_refused_unless_whole(tmp_path):
    labels = small_graph(30, 120).labels.astype(np.float64)
    assert (read_gnn_benchmark(_npz(tmp_path, labels=labels)).labels == labels).all()
    labels[4] = 2.7
    with pytest.raises(DataError, match="label of node 4 is 2.7, not a whole number"):
        read_gnn_benchmark(_npz(tmp_path, labels=labels))


def test_float_indices_are_refused(tmp_path):
    z = np.load(write_gnn_benchmark(tmp_path / "h.npz", small_graph(30, 120)))
    with pytest.raises(DataError, match="adj_indices has dtype float64; indices must be"):
        read_gnn_benchmark(_npz(tmp_path, adj_indices=z["adj_indices"].astype(np.float64)))


def test_an_absurd_class_count_is_refused(tmp_path):
    g = small_graph(40, 200)
    g.labels[7] = 10**9
    with pytest.raises(DataError, match="label 1000000000 would make 1000000001 classes for "
                                        "40 nodes"):
        prepare(MemorySource(g), PrepOptions(out=tmp_path / "o", tiles=2, progress=False))
    assert not (tmp_path / "o").exists()


def test_overlapping_splits_are_refused(tmp_path):
    g = small_graph(40, 200)
    g.splits = {"train": np.arange(0, 20), "valid": np.arange(20, 30),
                "test": np.arange(29, 40)}
    with pytest.raises(DataError, match="node 29 is in both the 'valid' and the 'test' split"):
        prepare(MemorySource(g), PrepOptions(out=tmp_path / "o", tiles=2, progress=False))
    assert not (tmp_path / "o").exists()


def test_a_prep_larger_than_the_disk_is_refused_before_writing(tmp_path, capsys):
    out = tmp_path / "huge"
    rc = main(["prep", "--format", "rmat", "--nodes", "1000000", "--edges", str(10**14),
               "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "prep needs about" in err[0] and "GiB free" in err[0]
    assert not out.exists()


def test_an_output_that_cannot_be_created_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    rc = main(["prep", "--format", "sbm", "--nodes", "200", "--edges", "1000", "--out",
               str(tmp_path / "file" / "out"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "cannot create the output" in err[0], err


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs (root only: elsewhere the test skips)."""
    d = tmp_path / "disk"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip()})")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)  # lazy: never left mounted


def test_a_disk_that_fills_mid_prep_is_a_one_line_error_and_is_emptied(tiny_disk,
                                                                        monkeypatch):
    """The size check is an estimate: if the disk still fills, prep says so and removes what
    it wrote (the temporary files are what would keep the disk full)."""
    g = small_graph(3000, 60000, f=16)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(
        1 << 40, 0, 1 << 40))  # the estimate passes; the real disk does not
    with pytest.raises(DataError, match="the disk is full; prep needs about"):
        prepare(MemorySource(g), PrepOptions(out=tiny_disk / "o", tiles=2, progress=False))
    assert list(tiny_disk.iterdir()) == []
