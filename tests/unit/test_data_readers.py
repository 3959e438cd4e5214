"""Each reader on small files written in tmp_path: the graph read back equals the one written."""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from plexgt.cli import main
from plexgt.commands import prep
from plexgt.data.formats.detect import detect_format
from plexgt.data.formats.edgelist import EdgeListSource, detect_layout
from plexgt.data.formats.gnn_benchmark import read_gnn_benchmark
from plexgt.data.formats.mtx import read_mtx
from plexgt.data.formats.npz_edges import read_edge_npz
from plexgt.data.formats.ogb import open_ogb, read_ogb
from plexgt.data.formats.registry import default_registry
from plexgt.data.formats.snap import read_snap
from plexgt.data.formats.spec import FormatSpec, option
from plexgt.data.graph import GraphData, dedup_edges
from plexgt.data.loader import PreparedGraph
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.synthetic import RMAT_CHUNK, RmatSource, rmat, sbm
from plexgt.errors import DataError, UsageError
from tests.datagen import (
    multilabel,
    small_graph,
    write_gnn_benchmark,
    write_mtx,
    write_ogb_csv,
    write_ogb_npz,
    write_snap,
)

pytestmark = pytest.mark.timeout(60)


def _same_edges(g, src, dst):
    a = dedup_edges(g.src, g.dst, g.num_nodes)
    b = dedup_edges(src, dst, g.num_nodes)
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def test_gnn_benchmark_round_trip(tmp_path):
    g = small_graph()
    r = read_gnn_benchmark(write_gnn_benchmark(tmp_path / "g.npz", g))
    assert r.num_nodes == g.num_nodes and _same_edges(r, g.src, g.dst)
    np.testing.assert_array_equal(r.features, g.features)
    np.testing.assert_array_equal(r.labels, g.labels)


def test_ogb_csv_round_trip(tmp_path):
    g = small_graph()
    r = read_ogb(write_ogb_csv(tmp_path / "ogb", g))
    assert r.num_nodes == g.num_nodes and r.num_edges == g.num_edges
    np.testing.assert_array_equal(r.src, g.src)
    np.testing.assert_array_equal(r.dst, g.dst)
    np.testing.assert_allclose(r.features, g.features, rtol=1e-6)
    np.testing.assert_array_equal(r.labels, g.labels)
    for k in ("train", "valid", "test"):
        np.testing.assert_array_equal(r.splits[k], g.splits[k])


@pytest.mark.parametrize("compressed", [True, False])
def test_ogb_npz_round_trip_and_streaming(tmp_path, compressed):
    g = small_graph()
    g.labels[[1, 5]] = -1
    root = write_ogb_npz(tmp_path / "ogb", g, compressed)
    r = read_ogb(root)
    np.testing.assert_array_equal(r.src, g.src)
    np.testing.assert_array_equal(r.labels, g.labels)
    assert r.features.dtype == np.float16
    np.testing.assert_array_equal(r.features, g.features.astype(np.float16))
    s = open_ogb(root)
    try:
        # three parts of chunk 7: every edge exactly once, every feature row exactly once
        got = [c for p in range(3) for c in s.edge_chunks(p, 3, 7)]
        src = np.concatenate([c[0] for c in got])
        dst = np.concatenate([c[1] for c in got])
        assert sorted(zip(src, dst)) == sorted(zip(g.src, g.dst))
        rows = {}
        for p in range(3):
            for lo, x in s.feature_chunks(p, 3, 4):
                for k in range(x.shape[0]):
                    assert lo + k not in rows
                    rows[lo + k] = x[k]
        assert len(rows) == g.num_nodes
        np.testing.assert_array_equal(np.stack([rows[i] for i in range(g.num_nodes)]),
                                      r.features)
    finally:
        s.close()


@pytest.mark.parametrize("name", ["g.txt", "g.txt.gz"])
def test_snap_round_trip(tmp_path, name):
    g = small_graph()
    r = read_snap(write_snap(tmp_path / name, g))
    np.testing.assert_array_equal(r.src, g.src)
    np.testing.assert_array_equal(r.dst, g.dst)
    assert r.num_nodes == g.num_nodes and r.features is None


def test_snap_without_header_takes_max_id(tmp_path):
    p = tmp_path / "g.txt"
    p.write_text("# c\n0 5\n2 3\n\n")
    r = read_snap(p)
    assert r.num_nodes == 6 and r.num_edges == 2
    assert read_snap(p, num_nodes=10).num_nodes == 10


@pytest.mark.parametrize("field", ["pattern", "real"])
def test_mtx_general(tmp_path, field):
    g = small_graph()
    r = read_mtx(write_mtx(tmp_path / "g.mtx", g, field))
    np.testing.assert_array_equal(r.src, g.src)
    np.testing.assert_array_equal(r.dst, g.dst)


def test_mtx_symmetric_adds_mirror(tmp_path):
    p = tmp_path / "s.mtx"
    p.write_text("%%MatrixMarket matrix coordinate pattern symmetric\n3 3 3\n2 1\n3 3\n3 2\n")
    r = read_mtx(p)
    pairs = sorted(zip(r.dst.tolist(), r.src.tolist()))
    assert pairs == [(0, 1), (1, 0), (1, 2), (2, 1), (2, 2)]


def test_mtx_without_entries_is_refused(tmp_path):
    p = tmp_path / "m.mtx"
    p.write_text("%%MatrixMarket matrix coordinate pattern general\n3 3 0\n")
    with pytest.raises(DataError, match="no entries"):
        read_mtx(p)


def test_check_ids_names_the_first_bad_edge():
    from plexgt.data.source import check_ids, collect_edges

    src, dst = collect_edges([(np.array([0, 1]), np.array([2, 9])),
                              (np.array([-1], np.int32), np.array([0], np.int32))])
    assert src.dtype == dst.dtype == np.int64 and src.tolist() == [0, 1, -1]
    with pytest.raises(DataError, match=r"^e: edge destination id 9 is outside \[0, 3\)$"):
        check_ids(src, dst, 3, "e")
    check_ids(src[:1], dst[:1], 3, "e")
    assert [a.size for a in collect_edges([])] == [0, 0]


def test_rmat_is_seeded_and_chunk_independent():
    a = rmat(1000, 5000, seed=3)
    b = rmat(1000, 5000, seed=3)
    np.testing.assert_array_equal(a.src, b.src)
    assert a.src.max() < 1000 and a.dst.min() >= 0
    s = RmatSource(1 << 10, 3 * RMAT_CHUNK + 5, seed=1)
    one = np.concatenate([c[0] for c in s.edge_chunks(0, 1, 0)])
    two = [c for p in range(2) for c in s.edge_chunks(p, 2, 0)]
    assert one.size == 3 * RMAT_CHUNK + 5
    assert np.array_equal(np.sort(one), np.sort(np.concatenate([c[0] for c in two])))
    # skewed degrees: the busiest node has far more than the mean
    deg = np.bincount(one, minlength=1 << 10)
    assert deg.max() > 20 * deg.mean()


def test_sbm_is_learnable_and_fast():
    import time

    t0 = time.perf_counter()
    g = sbm(50_000, 1_000_000, 8, 64, seed=0)
    assert time.perf_counter() - t0 < 10
    assert g.num_edges == 1_000_000 and g.features.shape == (50_000, 64)
    homophily = np.mean(g.labels[g.src] == g.labels[g.dst])
    assert homophily > 0.75
    # nearest-centroid on raw features vs on neighbour-averaged features: the graph helps
    n = g.num_nodes
    agg = np.zeros_like(g.features)
    np.add.at(agg, g.dst, g.features[g.src])
    agg /= np.maximum(np.bincount(g.dst, minlength=n), 1)[:, None]
    tr = g.splits["train"]
    te = g.splits["test"]

    def acc(x):
        cent = np.stack([x[tr][g.labels[tr] == c].mean(0) for c in range(8)])
        pred = np.argmin(((x[te, None, :] - cent[None]) ** 2).sum(-1), axis=1)
        return float(np.mean(pred == g.labels[te]))

    raw, graph = acc(g.features), acc(agg)
    assert raw < 0.8 and graph > 0.9, (raw, graph)


def test_memory_source_rejects_edgeless_graph():
    g = small_graph()
    g.src, g.dst = g.src[:0], g.dst[:0]
    with pytest.raises(DataError, match="empty graph"):
        MemorySource(g)


def test_reddit_npz_pair(tmp_path):
    from tests.datagen import write_reddit

    g = small_graph()
    r = read_gnn_benchmark(write_reddit(tmp_path / "reddit", g))
    np.testing.assert_array_equal(r.src, g.src)
    np.testing.assert_array_equal(r.dst, g.dst)
    np.testing.assert_array_equal(r.features, g.features)
    for k in ("train", "valid", "test"):
        np.testing.assert_array_equal(r.splits[k], g.splits[k])
    (tmp_path / "reddit" / "reddit_graph.npz").write_bytes(b"PK\x03\x04broken")
    with pytest.raises(DataError, match="reddit_graph.npz: not a readable npz"):
        read_gnn_benchmark(tmp_path / "reddit")


@pytest.mark.parametrize("layout", ["csv", "npz"])
def test_ogb_edge_features_streamed_and_prepared_like_memory(tmp_path, layout):
    """OGB's edge features (edge-feat.csv.gz; data.npz edge_feat): read whole, streamed in
    parts (every edge once, with its own features), and prepared into the same tiles as the
    same graph from memory."""
    g = small_graph(37, 150, f=3)
    fe = np.random.default_rng(1).standard_normal((150, 4)).astype(np.float32)
    g.edge_attr = fe.astype(np.float16).astype(np.float32)  # what the npz layout can hold
    write = write_ogb_csv if layout == "csv" else write_ogb_npz
    root = write(tmp_path / "ogb", g)
    r = read_ogb(root)
    np.testing.assert_allclose(r.edge_attr, g.edge_attr, rtol=1e-6)
    s = open_ogb(root)
    try:
        assert s.num_edge_features == 4
        got = [c for p in range(3) for c in s.edge_attr_chunks(p, 3, 7)]
        have = {(int(a), int(b), tuple(f)) for src, dst, fs in got
                for a, b, f in zip(src, dst, fs.tolist())}
        assert len(have) == len({(int(a), int(b), tuple(f)) for a, b, f in
                                 zip(g.src, g.dst, r.edge_attr.tolist())})
        assert sum(c[0].size for c in got) == 150
    finally:
        s.close()
    opts = dict(progress=False, tiles=3, symmetrize=True)
    m1 = prepare(s := open_ogb(root), PrepOptions(out=tmp_path / "a", **opts))
    s.close()
    r.features = r.features.astype(np.float32) if layout == "csv" else r.features
    m2 = prepare(MemorySource(r), PrepOptions(out=tmp_path / "b", **opts))
    assert m1["FE"] == m2["FE"] == 4 and m1["files"] == m2["files"]


def test_ogb_edge_feature_rows_must_match_the_edges(tmp_path):
    g = small_graph(23, 40, f=2)
    g.edge_attr = np.ones((40, 2), dtype=np.float32)
    root = write_ogb_csv(tmp_path / "ogb", g)
    with gzip.open(root / "raw" / "edge-feat.csv.gz", "at") as f:
        f.write("1,2\n")
    with pytest.raises(DataError, match="edge-feat.csv.gz: holds more rows than"):
        read_ogb(root)


def _edge_lines(g, sep=",", header=None, one_based=False, weights=False):
    off = 1 if one_based else 0
    rows = [sep.join([str(s + off), str(d + off)] + (["0.5"] if weights else []))
            for s, d in zip(g.src, g.dst)]
    return "\n".join(([header] if header else []) + rows) + "\n"


@pytest.mark.parametrize("sep,header,one_based,weights,gz", [
    (",", "id_1,id_2", False, False, False),     # the common published CSV
    ("\t", None, True, True, True),              # TSV, 1-based, weighted, gzipped
    (" ", "# a comment\nsrc dst", False, False, False),
])
def test_delimited_edge_lists_prep_like_memory(tmp_path, sep, header, one_based, weights, gz):
    """Detected delimiter, header row, weight column and 1-based ids: prep of the file equals
    prep of the same graph from memory, on one part and split over three."""
    g = small_graph(37, 150, f=0)
    g.features = None
    text = _edge_lines(g, sep, header, one_based, weights)
    path = tmp_path / ("g.tsv.gz" if gz else "g.csv")
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    lay = detect_layout(path, one_based=one_based)
    assert lay.delimiter == (None if sep == " " else sep)
    assert lay.header == (header is not None) and lay.columns == (3 if weights else 2)
    src = EdgeListSource(path, lay)
    assert src.num_nodes == 37
    parts = [c for p in range(3) for c in src.edge_chunks(p, 3, 11)]
    got = sorted(zip(np.concatenate([c[0] for c in parts]).tolist(),
                     np.concatenate([c[1] for c in parts]).tolist()))
    assert got == sorted(zip(g.src.tolist(), g.dst.tolist()))
    opts = dict(progress=False, tiles=3)
    m1 = prepare(EdgeListSource(path, lay), PrepOptions(out=tmp_path / "a", **opts))
    ref = GraphData("mem", 37, g.src, g.dst)
    m2 = prepare(MemorySource(ref), PrepOptions(out=tmp_path / "b", **opts))
    assert m1["files"] == m2["files"]


def test_edge_list_bad_input_names_the_file_and_line(tmp_path):
    cases = {
        "header_only.csv": ("id_1,id_2\n", "a header line and no edges"),
        "ragged.csv": ("0,1\n1,2\n3\n", "line 3"),
        "wide.csv": ("0,1,2,3\n", "expected 2 or 3 comma-separated fields"),
        "zero.csv": ("0,1\n", "node id 0 is below 1 (ids read as 1-based: --one-based)"),
        "empty.csv": ("# nothing\n", "no edge lines"),
    }
    for name, (text, msg) in cases.items():
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(DataError, match=re.escape(msg)) as e:
            EdgeListSource(p, detect_layout(p, one_based=name == "zero.csv"))
        assert name in str(e.value)
    p = tmp_path / "beyond.csv"
    p.write_text("0,1\n1,9\n")
    with pytest.raises(DataError, match=re.escape("line 2: node id 9 is outside the 5 nodes")):
        list(EdgeListSource(p, detect_layout(p), num_nodes=5).edge_chunks(0, 1, 10))


def _edges_of(path, lay, parts=1):
    src = EdgeListSource(path, lay)
    chunks = [c for p in range(parts) for c in src.edge_chunks(p, parts, 2)]
    return src.num_nodes, sorted(zip(np.concatenate([c[0] for c in chunks]).tolist(),
                                     np.concatenate([c[1] for c in chunks]).tolist()))


EDGES_012 = [(0, 1), (1, 2), (2, 0)]


@pytest.mark.parametrize("name,data,header", [
    ("bom.csv", b"\xef\xbb\xbf0,1\n1,2\n2,0\n", False),            # Excel's 'CSV UTF-8'
    ("bom.csv.gz", b"\xef\xbb\xbf0,1\n1,2\n2,0\n", False),
    ("bomhdr.csv", b"\xef\xbb\xbfid_1,id_2\n0,1\n1,2\n2,0\n", True),
    ("trailing.txt", b"0 1 # c\n1 2\n2 0 % d\n", False),
    ("konect.tsv", b"% sym unweighted\n% 3 3 3\n0\t1\n1\t2\n2\t0\n", False),
    ("hdr.txt", b"# made by hand\nsrc dst # names\n0 1\n1 2\n2 0\n", True),
])
def test_edge_list_first_line_is_a_header_only_on_evidence(tmp_path, name, data, header):
    """A first line is a header when not all its fields are numbers and it has as many as
    the edges; a byte order mark and comments (whole or trailing, # or %) are not evidence:
    each of these files holds the edges 0->1, 1->2, 2->0, also read in three parts."""
    p = tmp_path / name
    p.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    lay = detect_layout(p)
    assert lay.header == header and lay.columns == 2
    for parts in (1, 3):
        assert _edges_of(p, lay, parts) == (3, EDGES_012)
    assert _edges_of(p, detect_layout(p, header=header), 3) == (3, EDGES_012)


def test_edge_list_first_line_neither_edge_nor_header_is_an_error(tmp_path):
    p = tmp_path / "g.txt"
    p.write_text("# c\na b c\n0 1\n1 2\n")
    with pytest.raises(DataError, match=re.escape(
            "g.txt: line 2: 'a b c' is no edge (not all its fields are numbers) and no header "
            "(its 3 fields are not the 2 of line 3); give --header to skip it")):
        detect_layout(p)
    assert _edges_of(p, detect_layout(p, header=True)) == (3, [(0, 1), (1, 2)])


def test_matrix_market_named_txt_is_read_as_mtx(tmp_path, capsys):
    """A weighted MatrixMarket file named .txt is MatrixMarket to --format auto (read as an
    edge list its size line '3 3 3' was an edge 3 -> 3 of weight 3); an edge list reader
    given it refuses it, naming --format mtx."""
    g = small_graph(9, 20, f=0)
    mm = write_mtx(tmp_path / "m.txt", g, field="real")
    assert detect_format(mm) == "mtx"
    shutil.copy(mm, tmp_path / "m.mtx")
    args = ["--quiet", "--tiles", "2", "--no-self-loops"]
    assert main(["prep", "--input", str(mm), "--out", str(tmp_path / "a"), *args]) == 0
    assert main(["prep", "--input", str(tmp_path / "m.mtx"), "--out", str(tmp_path / "b"),
                 *args]) == 0
    capsys.readouterr()
    bom = tmp_path / "bom.txt"  # a byte order mark before the banner is no obstacle
    bom.write_bytes(b"\xef\xbb\xbf" + mm.read_bytes())
    assert main(["prep", "--input", str(bom), "--out", str(tmp_path / "d"), *args]) == 0
    capsys.readouterr()
    m1, m2, m3 = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in "abd")
    assert m1["N"] == 9 and m1["files"] == m2["files"] == m3["files"]
    for fmt in ("edgelist", "snap"):
        assert main(["prep", "--format", fmt, "--input", str(mm), "--out",
                     str(tmp_path / "c")]) == 2
        err = capsys.readouterr().err
        assert "m.txt: a MatrixMarket file (line 1 is its %%MatrixMarket banner)" in err
        assert "give --format mtx" in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "c").exists()


def test_cli_prep_edgelist(tmp_path, capsys):
    p = tmp_path / "musae.csv"
    p.write_text("id_1,id_2\n0,1\n1,2\n2,0\n3,1\n")
    assert main(["prep", "--format", "edgelist", "--input", str(p), "--out",
                 str(tmp_path / "o"), "--symmetrize", "--features", "4", "--classes", "2",
                 "--quiet"]) == 0
    assert "N=4" in capsys.readouterr().err
    assert main(["prep", "--format", "edgelist", "--input", str(p), "--no-header", "--out",
                 str(tmp_path / "x")]) == 2
    assert "musae.csv: line 1" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("layout", ["[E,2]", "[2,E]"])
def test_edge_index_npz_with_several_splits_preps_like_memory(tmp_path, layout):
    g = small_graph(37, 150, f=3)
    e = np.stack([g.src, g.dst], axis=1 if layout == "[E,2]" else 0)
    rng = np.random.default_rng(2)
    masks = rng.random((3, 37)) < 0.4  # three stored splits
    ef = rng.standard_normal((150, 2)).astype(np.float32)
    p = tmp_path / "roman.npz"
    np.savez(p, edges=e, node_features=g.features, node_labels=g.labels,
             train_masks=masks, val_masks=~masks, test_masks=np.zeros((3, 37), bool),
             edge_feat=ef)
    r = read_edge_npz(p, split_index=2)
    assert r.num_nodes == 37 and r.num_edge_features == 2
    np.testing.assert_array_equal(r.splits["train"], np.flatnonzero(masks[2]))
    np.testing.assert_array_equal(r.src, g.src)
    ref = GraphData("mem", 37, g.src, g.dst, g.features, g.labels, r.splits, edge_attr=ef)
    opts = dict(progress=False, tiles=2, symmetrize=True)
    m1 = prepare(MemorySource(r), PrepOptions(out=tmp_path / "a", **opts))
    m2 = prepare(MemorySource(ref), PrepOptions(out=tmp_path / "b", **opts))
    assert m1["files"] == m2["files"]


def test_edge_index_npz_square_edges_read_as_their_key_says(tmp_path):
    """A [2, 2] array fits both layouts: 'edge_index' is PyG's [2, E] (it had been read as
    [E, 2]), 'edges' the heterophilous benchmarks' [E, 2]; other shapes go the way that fits."""
    e = np.array([[0, 1], [2, 3]])
    for key, (src, dst) in (("edge_index", ([0, 1], [2, 3])), ("edges", ([0, 2], [1, 3]))):
        np.savez(tmp_path / "e.npz", **{key: e})
        g = read_edge_npz(tmp_path / "e.npz")
        assert (g.src.tolist(), g.dst.tolist()) == (src, dst), key
        for arr in (np.array([[0, 1, 2], [3, 0, 1]]), np.array([[0, 3], [1, 0], [2, 1]])):
            np.savez(tmp_path / "e.npz", **{key: arr})
            g = read_edge_npz(tmp_path / "e.npz")
            assert (g.src.tolist(), g.dst.tolist()) == ([0, 1, 2], [3, 0, 1]), (key, arr.shape)


def test_edge_index_npz_bad_input(tmp_path):
    cases = {
        "nokey.npz": ({"adj": np.zeros(3)}, "missing key 'edges' or 'edge_index' (has adj)"),
        "shape.npz": ({"edges": np.zeros((4, 3), np.int64)}, "'edges' has shape (4, 3)"),
        "float.npz": ({"edges": np.zeros((4, 2))}, "indices must be integers"),
        "beyond.npz": ({"edges": np.array([[0, 1], [1, 7]]), "node_labels": np.arange(3)},
                       "'edges' row 1 holds node id 7, beyond the 3 nodes"),
        "split.npz": ({"edges": np.array([[0, 1]]), "train_masks": np.ones((2, 2), bool)},
                      "--split-index 5 is not one of them"),
    }
    for name, (arrays, msg) in cases.items():
        p = tmp_path / name
        np.savez(p, **arrays)
        with pytest.raises(DataError, match=re.escape(msg)):
            read_edge_npz(p, split_index=5 if name == "split.npz" else 0)


def test_format_auto_tells_every_layout_apart(tmp_path, capsys):
    g = small_graph(23, 60, f=2)
    assert detect_format(write_ogb_csv(tmp_path / "ogb", g)) == "ogb"
    np.savez(tmp_path / "e.npz", edge_index=np.stack([g.src, g.dst]))
    assert detect_format(tmp_path / "e.npz") == "npz"
    gb = tmp_path / "gb.npz"
    write_gnn_benchmark(gb, g)
    assert detect_format(gb) == "gnn-benchmark"
    assert detect_format(write_snap(tmp_path / "s.txt", g)) == "snap"
    (tmp_path / "c.csv").write_text("a,b\n0,1\n")
    assert detect_format(tmp_path / "c.csv") == "edgelist"
    (tmp_path / "x.bin").write_bytes(b"\0")
    with pytest.raises(DataError, match="cannot tell its format; it looked for a directory"):
        detect_format(tmp_path / "x.bin")
    assert main(["prep", "--input", str(tmp_path / "c.csv"), "--out", str(tmp_path / "o"),
                 "--quiet", "--features", "2", "--classes", "2"]) == 0
    assert main(["prep", "--input", str(tmp_path / "x.bin"), "--out", str(tmp_path / "p")]) \
        == 2
    assert "x.bin: --format auto cannot tell its format" in capsys.readouterr().err


def _node_table(tmp_path, g, kind, order, one_based=False):
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    cols = {"node": (order + (1 if one_based else 0)).astype(np.int64),
            "target": g.labels[order]}
    for j in range(g.features.shape[1]):
        cols[f"feat_{j}"] = g.features[order, j]
    cols["note"] = np.array(["x"] * order.size)
    t = pa.table(cols)
    path = tmp_path / f"nodes.{kind}"
    if kind == "parquet":
        pq.write_table(t, path, row_group_size=10)
    else:
        pacsv.write_csv(t, path)
    return path


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_node_table_maps_features_and_labels_onto_the_edge_list(tmp_path, kind):
    """A shuffled node table (CSV, or Parquet in row groups of 10) gives the edge list's nodes
    their features and labels: prep equals prep of the same graph from memory."""
    g = small_graph(37, 150, f=3)
    order = np.random.default_rng(5).permutation(37)
    table = _node_table(tmp_path, g, kind, order, one_based=True)
    edges = tmp_path / "e.csv"
    edges.write_text(_edge_lines(g, ",", "src,dst", one_based=True))
    assert main(["prep", "--input", str(edges), "--one-based", "--node-table", str(table),
                 "--id-column", "node", "--label-column", "target", "--feature-columns",
                 "feat_*", "--out", str(tmp_path / "a"), "--quiet", "--tiles", "3",
                 "--seed", "4"]) == 0
    gb = tmp_path / "same.npz"  # the same graph in gnn-benchmark npz, prepared alike
    write_gnn_benchmark(gb, GraphData("mem", 37, g.src, g.dst, g.features, g.labels))
    assert main(["prep", "--input", str(gb), "--out", str(tmp_path / "b"), "--quiet",
                 "--tiles", "3", "--seed", "4"]) == 0
    m1, m2 = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in "ab")
    assert (m1["N"], m1["F"], m1["C"]) == (37, 3, 3)
    assert m1["files"] == m2["files"]
    with PreparedGraph(tmp_path / "a") as pa_, PreparedGraph(tmp_path / "b") as pb:
        np.testing.assert_array_equal(pa_.read_labels(None, "Q"), pb.read_labels(None, "Q"))


def test_node_table_bad_input(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    g = small_graph(23, 60, f=2)
    edges = tmp_path / "e.csv"
    edges.write_text(_edge_lines(g, ","))
    order = np.arange(23)
    table = _node_table(tmp_path, g, "parquet", order)
    base = ["prep", "--input", str(edges), "--node-table", str(table), "--id-column", "node",
            "--out", str(tmp_path / "o")]
    cases = [
        (["--feature-columns", "feat_0,missing"], "no feature column 'missing'"),
        (["--feature-columns", "note"], "feature column 'note' has type string"),
        (["--label-column", "feat_0"], "label column 'feat_0' has type float; expected"),
    ]
    for extra, msg in cases:
        assert main(base + extra) == 2, extra
        assert msg in capsys.readouterr().err
        assert not (tmp_path / "o").exists()
    small = tmp_path / "small.parquet"  # 20 nodes: the edges name ids up to 22
    pq.write_table(pa.table({"node": np.arange(20), "feat_0": np.zeros(20)}), small)
    assert main(["prep", "--input", str(edges), "--node-table", str(small), "--id-column",
                 "node", "--feature-columns", "feat_*", "--out", str(tmp_path / "o")]) == 2
    assert "is outside the 20 nodes" in capsys.readouterr().err
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.table({"node": np.r_[np.arange(22), 3], "feat_0": np.zeros(23)}), dup)
    assert main(["prep", "--input", str(edges), "--node-table", str(dup), "--id-column",
                 "node", "--feature-columns", "feat_*", "--out", str(tmp_path / "o")]) == 2
    assert "do not cover every node once" in capsys.readouterr().err


def test_multilabel_tasks_prep_alike_from_every_reader(tmp_path):
    """[N, T] 0/1 task labels (unlabelled pairs: NaN in npz, an empty cell in a node table,
    -1 in OGB's csv) prep to the same files as the graph from memory, labels kept per task."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    g = multilabel(small_graph(37, 150, f=3), tasks=4)
    g = GraphData("mem", 37, g.src, g.dst, g.features, g.labels)  # the readers' random split
    opts = dict(progress=False, tiles=2, seed=4)
    ref = prepare(MemorySource(g), PrepOptions(out=tmp_path / "ref", **opts))
    assert (ref["C"], ref["multilabel"], ref["dtypes"]["labels"]) == (4, True, "int8")
    y = np.where(g.labels >= 0, g.labels, np.nan)
    np.savez(tmp_path / "e.npz", edges=np.stack([g.src, g.dst], 1), node_features=g.features,
             node_labels=y)
    cols = {"id": np.arange(37)} | {f"feat_{j}": g.features[:, j] for j in range(3)}
    cols |= {f"task_{t}": pa.array(y[:, t], mask=np.isnan(y[:, t])) for t in range(4)}
    pq.write_table(pa.table(cols), tmp_path / "nodes.parquet", row_group_size=8)
    (tmp_path / "e.csv").write_text(_edge_lines(g, ","))
    for src in (MemorySource(read_edge_npz(tmp_path / "e.npz")), MemorySource(read_ogb(
            write_ogb_csv(tmp_path / "ogb", g)))):
        m = prepare(src, PrepOptions(out=tmp_path / "x", **opts))
        assert m["files"] == ref["files"] and m["multilabel"]
        shutil.rmtree(tmp_path / "x")
    cli = ["--quiet", "--tiles", "2", "--seed", "4"]  # the CLI's defaults, both sides
    assert main(["prep", "--input", str(tmp_path / "e.csv"), "--node-table",
                 str(tmp_path / "nodes.parquet"), "--label-column", "task_*",
                 "--feature-columns", "feat_*", "--out", str(tmp_path / "t"), *cli]) == 0
    assert main(["prep", "--input", str(tmp_path / "e.npz"), "--out", str(tmp_path / "n"),
                 *cli]) == 0
    m1, m2 = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in "tn")
    assert m1["files"] == m2["files"] and m1["multilabel"]
    with PreparedGraph(tmp_path / "t") as pg:
        assert pg.multilabel and pg.C == 4
        back = np.empty_like(g.labels)
        back[pg.read_perm("Q")] = pg.read_labels(None, "Q")
        np.testing.assert_array_equal(back, g.labels)
    assert main(["verify", str(tmp_path / "t")]) == 0


def test_multilabel_bad_input_names_the_node_and_task(tmp_path):
    g = small_graph(9, 20, f=2)
    y = np.zeros((9, 3))
    y[4, 2] = 2.0
    np.savez(tmp_path / "e.npz", edges=np.stack([g.src, g.dst], 1), node_labels=y)
    with pytest.raises(DataError, match=re.escape("e.npz: 'node_labels': label of node 4 task "
                                                  "2 is 2.0; multi-label tasks hold 0 or 1")):
        read_edge_npz(tmp_path / "e.npz")


def _ring_open(args, comm):
    n = int(args.input.read_text())
    ids = np.arange(n, dtype=np.int64)
    return MemorySource(GraphData(f"ring({n})", n, ids, (ids + args.ring_step) % n),
                        [args.input])


RING_STEP = option("--ring-step", "ring: how far each edge reaches", type=int, default=1)
RING = FormatSpec("ring", "a ring of N nodes; the file holds N", _ring_open,
                  input="a .ring file", recognise=lambda probe: probe.stem.endswith(".ring"),
                  looked_for="a .ring file", order=5, options=(RING_STEP,))
"""A toy format as a format module would declare it: the test is its only file."""


def _prep_with(formats, argv):
    parser = argparse.ArgumentParser()
    prep.add_arguments(parser, formats)
    return prep.run(parser.parse_args(argv), formats)


def test_a_format_is_one_spec_and_one_registry_line(tmp_path, capsys):
    """Registering a FormatSpec is all prep needs: its name among --format's choices,
    recognised by --format auto, its option read by it and refused for the others."""
    formats = default_registry()
    formats.register(RING)
    (tmp_path / "g.ring").write_text("12")
    args = ["--out", str(tmp_path / "o"), "--quiet", "--tiles", "2", "--no-self-loops",
            "--no-symmetrize"]  # a one-sided ring: --symmetrize auto would add the reverse
    assert _prep_with(formats, ["--input", str(tmp_path / "g.ring"), "--ring-step", "5",
                                *args]) == 0
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert (m["name"], m["N"], m["E"]) == ("ring(12)", 12, 12)
    assert m["source"]["ring_step"] == 5 and m["source"]["format"] == "auto"
    with PreparedGraph(tmp_path / "o") as pg:
        a = pg.read_adjacency("A1").tocoo()  # P A Q^T
        p, q = pg.read_perm("P"), pg.read_perm("Q")
        pairs = sorted(zip(q[a.col].tolist(), p[a.row].tolist(), strict=True))
    assert pairs == [(i, (i + 5) % 12) for i in range(12)]  # message src -> dst: A[dst, src]
    assert detect_format(tmp_path / "g.ring", formats) == "ring"
    with pytest.raises(DataError, match="cannot tell its format"):  # the built-in lack it
        detect_format(tmp_path / "g.ring")
    snap = tmp_path / "s.txt"
    snap.write_text("0 1\n")
    with pytest.raises(UsageError, match=re.escape(
            "--ring-step goes with --format ring, not snap")):
        _prep_with(formats, ["--format", "snap", "--input", str(snap), "--ring-step", "2",
                             "--out", str(tmp_path / "x")])
    (tmp_path / "x.bin").write_bytes(b"\0")
    with pytest.raises(DataError, match=r"it looked for a \.ring file \(ring\); a directory"):
        detect_format(tmp_path / "x.bin", formats)
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit):  # the built-in parser has no such format
        _prep_with(default_registry(), ["--format", "ring", "--out", str(tmp_path / "y")])
    assert "invalid choice: 'ring'" in capsys.readouterr().err


def test_format_registry_refuses_clashes():
    formats = default_registry()
    with pytest.raises(ValueError, match="already registered"):
        formats.register(default_registry().get("snap"))
    with pytest.raises(ValueError, match="--format's own"):
        formats.register(FormatSpec("auto", "", _ring_open))
    twin = option("--ring-step", "another", type=int)
    with pytest.raises(ValueError, match="option --ring-step is declared twice"):
        formats.register(FormatSpec("ring", "", _ring_open, options=(RING_STEP,)))
        formats.register(FormatSpec("ring2", "", _ring_open, options=(twin,)))
    with pytest.raises(KeyError, match="unknown source format 'nope'; known: gnn-benchmark"):
        formats.get("nope")


def test_format_names_appear_only_in_the_formats_package():
    """The rule of the registry: a format's name is written in its own module alone (prep's
    choices, help, checks and detection come from the specs)."""
    root = Path(__file__).resolve().parents[2] / "plexgt"
    names = "|".join(re.escape(n) for n in default_registry().names())
    quoted = re.compile(rf"[\"']({names})[\"']")
    found = [f"{p.relative_to(root)}: {m.group(0)}" for p in sorted(root.rglob("*.py"))
             if "formats" not in p.relative_to(root).parts[:2]
             for m in quoted.finditer(p.read_text())]
    assert found == []


def test_the_split_index_is_recorded_with_the_source(tmp_path):
    """--split-index chooses the labels trained on, so --resume must see it: the source's
    description had left it out (a resume given another --split-index passed the check)."""
    g = small_graph(20, 60, f=2)
    masks = np.random.default_rng(0).random((2, 20)) < 0.5
    p = tmp_path / "s.npz"
    np.savez(p, edges=np.stack([g.src, g.dst], 1), node_labels=g.labels, train_masks=masks,
             val_masks=~masks)
    for k, extra in ((0, []), (1, ["--split-index", "1"])):
        out = tmp_path / f"o{k}"
        assert main(["prep", "--input", str(p), "--out", str(out), "--quiet", *extra]) == 0
        source = json.loads((out / "manifest.json").read_text())["source"]
        assert source.get("split_index") == (k or None)
