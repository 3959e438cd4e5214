"""``plexgt prep --split-file`` (tunedGNN's split npz) and ``--normalize-features row``."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from plexgt.cli import main
from plexgt.data.formats.split_file import read_split_file
from plexgt.data.graph import GraphData
from plexgt.data.loader import PreparedGraph
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.errors import DataError
from tests.datagen import small_graph, write_gnn_benchmark

N = 40


def _split(path, **arrays):
    np.savez(path, **arrays)
    return path


def _ids(perm, a, b):
    return np.sort(perm[a:b]).astype(np.int64)


@pytest.fixture
def split_npz(tmp_path):
    perm = np.random.default_rng(1).permutation(N)
    return _split(tmp_path / "g_split.npz", train=_ids(perm, 0, 24), valid=_ids(perm, 24, 32),
                  test=_ids(perm, 32, 40)), perm


def _masks_in_original_order(pg: PreparedGraph) -> dict[str, np.ndarray]:
    p = pg.read_perm("P")
    out = {}
    for k, m in pg.read_masks().items():
        orig = np.zeros(pg.N, dtype=bool)
        orig[p[m]] = True
        out[k] = np.flatnonzero(orig)
    return out


def test_split_file_replaces_the_split_and_is_recorded(tmp_path, split_npz):
    path, perm = split_npz
    g = small_graph(N, 160)
    gb = write_gnn_benchmark(tmp_path / "g.npz", g)
    out = tmp_path / "o"
    assert main(["prep", "--input", str(gb), "--split-file", str(path), "--out", str(out),
                 "--quiet", "--tiles", "2"]) == 0
    with PreparedGraph(out) as pg:
        got = _masks_in_original_order(pg)
        split = pg.manifest["split"]
    # the file's nodes, not the dataset's own split (small_graph has a 50/25/25 one)
    assert np.array_equal(got["train"], _ids(perm, 0, 24))
    assert np.array_equal(got["valid"], _ids(perm, 24, 32))
    assert np.array_equal(got["test"], _ids(perm, 32, 40))
    assert not np.array_equal(got["train"], g.splits["train"])
    assert split["origin"] == "file" and split["path"] == str(path.resolve())
    assert split["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert split["sizes"] == {"train": 24, "valid": 8, "test": 8}


def test_boolean_masks_read_as_ids(tmp_path):
    m = np.zeros((3, N), dtype=bool)
    m[0, :20], m[1, 20:30], m[2, 30:] = True, True, True
    s = read_split_file(_split(tmp_path / "m.npz", train=m[0], valid=m[1], test=m[2]), N)
    assert np.array_equal(s["valid"], np.arange(20, 30))


@pytest.mark.parametrize("arrays, message", [
    ({"train": [0, 1], "valid": [2]}, "keys train, valid; expected exactly train, valid, test"),
    ({"train": [0, 1], "valid": [2], "test": [3], "extra": [4]}, "keys extra, test, train"),
    ({"train": [0, N], "valid": [2], "test": [3]}, f"node id {N}, outside \\[0, {N}\\)"),
    ({"train": [0, -1], "valid": [2], "test": [3]}, "node id -1, outside"),
    ({"train": [0, 1], "valid": [1, 2], "test": [3]}, "node 1 is in both the 'train' and "
     "the 'valid' split"),
    ({"train": [0, 0, 1], "valid": [2], "test": [3]}, "'train' lists 1 node\\(s\\) more than"),
    ({"train": np.zeros(N - 1, bool), "valid": [2], "test": [3]}, f"mask of {N - 1} entries "
     f"for a graph of {N} nodes"),
    ({"train": [[0, 1]], "valid": [2], "test": [3]}, "shape \\(1, 2\\); expected 1-D"),
    ({"train": [0.0, 1.0], "valid": [2], "test": [3]}, "dtype float64; expected integer"),
])
def test_bad_split_files_one_line(tmp_path, arrays, message):
    path = _split(tmp_path / "bad.npz", **{k: np.asarray(v) for k, v in arrays.items()})
    with pytest.raises(DataError, match=message) as e:
        read_split_file(path, N)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_cli_refuses_a_bad_split_file_and_leaves_nothing(tmp_path, capsys):
    gb = write_gnn_benchmark(tmp_path / "g.npz", small_graph(N, 160))
    bad = _split(tmp_path / "bad.npz", train=np.arange(10), valid=np.arange(5, 15),
                 test=np.arange(20, 30))
    out = tmp_path / "o"
    assert main(["prep", "--input", str(gb), "--split-file", str(bad), "--out", str(out),
                 "--quiet"]) != 0
    assert "node 5 is in both" in capsys.readouterr().err
    assert not out.exists()
    assert main(["prep", "--input", str(tmp_path / "none.npz"), "--format", "gnn-benchmark",
                 "--split-file", str(tmp_path / "missing.npz"), "--out", str(out),
                 "--quiet"]) != 0


def test_split_file_refused_by_other_formats(tmp_path, split_npz, capsys):
    from tests.datagen import write_snap

    snap = write_snap(tmp_path / "g.txt.gz", small_graph(N, 160))
    assert main(["prep", "--format", "snap", "--input", str(snap), "--split-file",
                 str(split_npz[0]), "--out", str(tmp_path / "o"), "--quiet"]) != 0
    assert "--split-file replaces the split of --format gnn-benchmark, not snap" in \
        capsys.readouterr().err


@pytest.mark.parametrize("sparse", ["yes", "no"])
def test_row_normalised_features_dense_and_csr(tmp_path, sparse):
    g = small_graph(N, 160, f=6)
    x = np.abs(g.features)
    x[::3, 2:] = 0.0  # sparse-ish rows
    x[5] = 0.0  # a row summing to 0 stays 0
    g = GraphData("g", N, g.src, g.dst, x.astype(np.float32), g.labels, g.splits)
    out = tmp_path / f"o{sparse}"
    m = prepare(MemorySource(g), PrepOptions(out=out, tiles=2, sparse_features=sparse,
                                             normalize_features="row", progress=False))
    assert m["feature_normalization"] == "row"
    assert m["feature_layout"] == ("csr" if sparse == "yes" else "dense")
    with PreparedGraph(out) as pg:
        q = pg.read_perm("Q")
        got = (pg.read_features_csr().toarray() if sparse == "yes" else pg.read_features())
    want = x / np.where(x.sum(1, keepdims=True) == 0, 1.0, x.sum(1, keepdims=True))
    np.testing.assert_allclose(got, want[q], rtol=1e-6)
    assert np.all(got[np.flatnonzero(q == 5)[0]] == 0)
    sums = got.sum(1)
    assert np.allclose(sums[q != 5], 1.0, atol=1e-6)


def test_normalize_features_default_none_and_bad_value(tmp_path):
    g = small_graph(N, 160)
    m = prepare(MemorySource(g), PrepOptions(out=tmp_path / "a", tiles=2, progress=False))
    assert m["feature_normalization"] == "none" and "normalize_features" not in m["params"]
    with PreparedGraph(tmp_path / "a") as pg:
        np.testing.assert_array_equal(pg.read_features(), g.features[pg.read_perm("Q")])
    with pytest.raises(DataError, match="--normalize-features l2: expected none\\|row"):
        prepare(MemorySource(g), PrepOptions(out=tmp_path / "b", normalize_features="l2",
                                             progress=False))


def test_cli_normalize_features(tmp_path):
    gb = write_gnn_benchmark(tmp_path / "g.npz", small_graph(N, 160))
    out = tmp_path / "o"
    assert main(["prep", "--input", str(gb), "--normalize-features", "row", "--out", str(out),
                 "--quiet", "--tiles", "2"]) == 0
    with PreparedGraph(out) as pg:
        assert pg.manifest["feature_normalization"] == "row"
        assert pg.manifest["params"]["normalize_features"] == "row"
