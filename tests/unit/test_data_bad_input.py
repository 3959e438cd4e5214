"""Bad input: one line naming the file and the problem, exit status 2, no partial output."""

from __future__ import annotations

import gzip
import io
import zipfile

import numpy as np
import pytest

from plexgt.cli import main
from plexgt.data.loader import PreparedGraph, check_grid, read_rank_blocks
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.distributed.grid import Grid3D
from plexgt.errors import DataError
from tests.datagen import small_graph, write_gnn_benchmark, write_ogb_csv, write_ogb_npz

pytestmark = pytest.mark.timeout(60)


def _run(capsys, tmp_path, fmt, path, *extra):
    out = tmp_path / "out"
    argv = ["prep", "--format", fmt, "--out", str(out), "--quiet", *extra]
    if path is not None:
        argv += ["--input", str(path)]
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("plexgt prep: error: "), err
    assert not out.exists(), "partial output left behind"
    return err


def _text(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


SNAP_CASES = [
    ("0 1\n-3 2\n", "negative node id -3"),
    ("0 1\n1 x\n", "line 2: non-numeric field 'x'"),
    ("# c\n0 1\n1 2 3\n", "line 3: expected 2 fields, found 3"),
    ("# only a comment\n", "empty graph"),
    ("# Nodes: 3 Edges: 10\n0 1\n1 2\n", "header claims 10 edges but the file holds 2"),
    # Python's int() takes 1_0, numpy's parser does not: the rescan must not pass it
    ("0 1\n1_0 2\n", "line 2: non-numeric field '1_0'"),
    # a lone carriage return splits the line for numpy's parser only: the line and its text
    ("0 1\n1 2\n2\r 0\n", "line 3: cannot parse '2\\r 0'"),
]


@pytest.mark.parametrize("text,msg", SNAP_CASES)
def test_snap_bad(capsys, tmp_path, text, msg):
    p = _text(tmp_path, "g.txt", text)
    err = _run(capsys, tmp_path, "snap", p)
    assert str(p) in err and msg in err


def test_snap_id_beyond_given_n(capsys, tmp_path):
    p = _text(tmp_path, "g.txt", "0 1\n0 5\n")
    assert "node id 5 is outside [0, 3)" in _run(capsys, tmp_path, "snap", p, "--nodes", "3")


def test_truncated_gzip(capsys, tmp_path):
    p = tmp_path / "g.txt.gz"
    p.write_bytes(gzip.compress(b"".join(b"%d %d\n" % (i, i + 1) for i in range(5000)))[:-40])
    assert "truncated or corrupt gzip" in _run(capsys, tmp_path, "snap", p)


MTX_CASES = [
    ("%%MatrixMarket matrix coordinate pattern general\n3 3 1000000000000\n1 2\n2 3\n3 1\n",
     "header claims 1000000000000 entries but the file holds 3"),
    ("%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 2\n2 3\n3 1\n",
     "header claims 2 entries but the file holds more"),
    ("%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 2\n7 3\n",
     "index 7 is outside [1, 3]"),
    ("%%MatrixMarket matrix coordinate pattern general\n3 4 1\n1 2\n", "not square"),
    ("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n", "format 'array'"),
    ("hello\n1 2\n", "not a MatrixMarket matrix header"),
    ("%%MatrixMarket matrix coordinate real general\n3 3 1\n1 2 abc\n",
     "line 3: non-numeric field 'abc'"),
    ("%%MatrixMarket matrix coordinate pattern general\n3 3 0\n", "empty graph"),
]


@pytest.mark.parametrize("text,msg", MTX_CASES)
def test_mtx_bad(capsys, tmp_path, text, msg):
    p = _text(tmp_path, "m.mtx", text)
    err = _run(capsys, tmp_path, "mtx", p)
    assert str(p) in err and msg in err


def test_mtx_header_claiming_huge_n_is_not_allocated(capsys, tmp_path):
    p = _text(tmp_path, "m.mtx",
              "%%MatrixMarket matrix coordinate pattern general\n10000000000000 10000000000000 1"
              "\n1 2\n")
    assert "N=10000000000000 nodes need" in _run(capsys, tmp_path, "mtx", p)


def _ogb_csv(tmp_path, edit):
    g = small_graph(20, 50, f=3)
    root = write_ogb_csv(tmp_path / "ogb", g)
    raw = root / "raw"
    name, lines = edit(g)
    with gzip.open(raw / name, "wt") as f:
        f.write("".join(line + "\n" for line in lines))
    return root


OGB_CSV_CASES = [
    (lambda g: ("node-feat.csv.gz", ["1,2,3"] * 5 + ["1,nan,3"] + ["0,0,0"] * 14),
     "node-feat.csv.gz: non-finite feature value in row 5"),
    (lambda g: ("node-label.csv.gz", ["1"] * 19), "19 labels disagree with N=20"),
    (lambda g: ("node-feat.csv.gz", ["1,2,3"] * 21), "21 feature rows disagree with N=20"),
    (lambda g: ("edge.csv.gz", ["0,1"] * 49 + ["3,20"]), "edge destination id 20 is outside"),
    (lambda g: ("edge.csv.gz", ["0,1"] * 40), "holds 40 edges but num-edge-list.csv.gz claims"),
    (lambda g: ("edge.csv.gz", ["0,1"] * 48 + ["0;1", "1,2"]), "line 49: expected 2 fields"),
]


@pytest.mark.parametrize("edit,msg", OGB_CSV_CASES)
def test_ogb_csv_bad(capsys, tmp_path, edit, msg):
    root = _ogb_csv(tmp_path, edit)
    assert msg in _run(capsys, tmp_path, "ogb", root)


def test_ogb_npz_errors_found_while_streaming_leave_no_output(capsys, tmp_path):
    g = small_graph(20, 50, f=3)
    g.dst[30] = 25
    root = write_ogb_npz(tmp_path / "a", g)
    assert "edge destination id 25 is outside [0, 20)" in _run(capsys, tmp_path, "ogb", root)
    g = small_graph(20, 50, f=3)
    g.features[7, 1] = np.inf
    root = write_ogb_npz(tmp_path / "b", g)
    assert "non-finite feature value in row 7" in _run(capsys, tmp_path, "ogb", root)


def test_ogb_npz_truncated(capsys, tmp_path):
    root = write_ogb_npz(tmp_path / "a", small_graph(20, 50, f=3))
    p = root / "raw" / "data.npz"
    p.write_bytes(p.read_bytes()[:300])
    assert "not a readable npz file" in _run(capsys, tmp_path, "ogb", root)


def test_npz_header_claiming_more_than_it_holds(capsys, tmp_path):
    root = write_ogb_npz(tmp_path / "a", small_graph(20, 50, f=3))
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<i8", "fortran_order": False, "shape": (2, 10**12)})
    buf.write(np.zeros(8, dtype=np.int64).tobytes())
    with zipfile.ZipFile(root / "raw" / "data.npz", "w") as z:
        z.writestr("edge_index.npy", buf.getvalue())
        for k, v in (("num_nodes_list", [20]), ("num_edges_list", [10**12])):
            b = io.BytesIO()
            np.save(b, np.array(v))
            z.writestr(f"{k}.npy", b.getvalue())
    assert "header claims shape (2, 1000000000000)" in _run(capsys, tmp_path, "ogb", root)


def test_gnn_benchmark_bad(capsys, tmp_path):
    g = small_graph(20, 50, f=3)
    p = write_gnn_benchmark(tmp_path / "g.npz", g)
    p.write_bytes(p.read_bytes()[:500])
    assert "not a readable npz file" in _run(capsys, tmp_path, "gnn-benchmark", p)
    g.features[3, 0] = np.nan
    p = write_gnn_benchmark(tmp_path / "h.npz", g)
    assert "non-finite feature value in row 3" in _run(capsys, tmp_path, "gnn-benchmark", p)
    p = tmp_path / "pickled.npz"
    np.savez(p, adj_data=np.ones(1), adj_indices=np.zeros(1, dtype=np.int64),
             adj_indptr=np.array([0, 1]), adj_shape=np.array([1, 1]),
             labels=np.array([object()], dtype=object))
    assert "allow_pickle" in _run(capsys, tmp_path, "gnn-benchmark", p)
    assert "no such file" in _run(capsys, tmp_path, "gnn-benchmark", tmp_path / "nope.npz")


def test_output_dir_rules(capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    argv = ["prep", "--format", "sbm", "--nodes", "100", "--edges", "400", "--out", str(out),
            "--quiet"]
    assert main(argv) == 2
    assert "output directory exists" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert (out / "precious.txt").read_text() == "keep me"
    assert main([*argv[:-3], "--out", str(tmp_path / "t"), "--tiles", "101"]) == 2
    assert "--tiles 101: must be in [1, N=100]" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
    assert main(["prep", "--format", "rmat", "--out", str(tmp_path / "r")]) == 2
    assert "needs --nodes and --edges" in capsys.readouterr().err
    assert main(["verify", str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err


def test_loader_bad_requests_and_corrupt_tiles(tmp_path):
    out = tmp_path / "p"
    prepare(MemorySource(small_graph(37, 150)), PrepOptions(out=out, tiles=2, progress=False))
    with PreparedGraph(out) as pg:
        with pytest.raises(DataError, match="more blocks than nodes"):
            check_grid(pg, Grid3D(1, 1, 40))
        with pytest.raises(DataError, match="more blocks than nodes"):
            read_rank_blocks(pg, Grid3D(38, 1, 1), 0, 2)
        with pytest.raises(DataError, match="at least one layer"):
            read_rank_blocks(pg, Grid3D(1, 1, 1), 0, 0)
        with pytest.raises(DataError, match=r"row range \[0, 40\) is outside"):
            pg.read_adjacency("A1", (0, 40))
        with pytest.raises(DataError, match="expected 'A1' or 'A2'"):
            pg.read_adjacency("A3")
    tile = out / "A1" / "rows_00001.h5"
    tile.write_bytes(tile.read_bytes()[:1000])
    with PreparedGraph(out) as pg:
        pg.read_adjacency("A1", (0, 10))  # tile row 0 is intact
        with pytest.raises(DataError, match="rows_00001.h5: corrupt HDF5"):
            pg.read_adjacency("A1", (20, 30))
    tile.unlink()
    with PreparedGraph(out) as pg, pytest.raises(DataError, match="missing file"):
        pg.read_adjacency("A1", (20, 30))


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_node_table_without_its_id_column_or_with_a_column_twice(capsys, tmp_path, kind):
    """The table's columns are checked before prep starts: a missing id column had been a
    pyarrow traceback (CSV), the id among the features a KeyError in the middle of prep."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    edges = _text(tmp_path, "e.csv", "0,1\n1,2\n2,0\n")
    t = tmp_path / f"nodes.{kind}"
    (pq.write_table if kind == "parquet" else pacsv.write_csv)(
        pa.table({"id": [0, 1, 2], "f0": [1.0, 2.0, 3.0], "y": [0, 1, 0]}), t)
    base = ("--node-table", str(t))
    err = _run(capsys, tmp_path, "edgelist", edges, *base, "--id-column", "node",
               "--feature-columns", "f0")
    assert f"{t}: no id column 'node' (columns: id, f0, y)" in err
    err = _run(capsys, tmp_path, "edgelist", edges, *base, "--feature-columns", "id,f0")
    assert "column 'id' is named as the id column and as a feature column" in err
    err = _run(capsys, tmp_path, "edgelist", edges, *base, "--feature-columns", "f0,f0")
    assert "column 'f0' is named twice" in err
    err = _run(capsys, tmp_path, "edgelist", edges, *base, "--label-column", "y",
               "--feature-columns", "f0,y")
    assert "column 'y' is named as a label column and as a feature column" in err


def _npz_bytes_cut(p, keep):
    p.write_bytes(p.read_bytes()[:keep])
    return p


def test_edge_index_npz_unreadable_members(capsys, tmp_path):
    """Each had been a traceback: BadZipFile, numpy's ValueError for an object array, a
    float conversion of a string edge_feat."""
    edges = np.array([[0, 1], [1, 2], [2, 0]])
    p = tmp_path / "t.npz"
    np.savez(p, edges=edges)
    assert f"{p}: not a readable npz" in _run(capsys, tmp_path, "npz",
                                               _npz_bytes_cut(p, p.stat().st_size - 30))
    p = tmp_path / "c.npz"
    np.savez(p, edges=np.arange(2000).reshape(-1, 2))
    b = bytearray(p.read_bytes())
    b[200:260] = b"x" * 60  # inside the member: its CRC no longer matches
    p.write_bytes(bytes(b))
    assert f"{p}: 'edges' is truncated or corrupt" in _run(capsys, tmp_path, "npz", p)
    p = tmp_path / "o.npz"
    np.savez(p, edges=edges.astype(object))
    assert f"{p}: 'edges' holds Python objects" in _run(capsys, tmp_path, "npz", p)
    p = tmp_path / "s.npz"
    np.savez(p, edges=edges, edge_feat=np.array(["a", "b", "c"]))
    assert f"{p}: 'edge_feat' has dtype <U1; edge features are numbers" in _run(
        capsys, tmp_path, "npz", p)


def test_split_index_the_source_does_not_hold(capsys, tmp_path):
    """--split-index 3 over 1-D masks had prepped split 0 without a word."""
    p = tmp_path / "m.npz"
    one = np.array([1, 1, 0, 0], bool)
    np.savez(p, edges=np.array([[0, 1], [1, 2], [2, 3]]), train_mask=one, val_mask=~one)
    assert "'train_mask' holds 1 split; --split-index 3 is not one of them" in _run(
        capsys, tmp_path, "npz", p, "--split-index", "3")
    q = tmp_path / "n.npz"
    np.savez(q, edges=np.array([[0, 1], [1, 2], [2, 3]]))
    assert "holds no split masks; --split-index 1 has none to choose" in _run(
        capsys, tmp_path, "npz", q, "--split-index", "1")
    s = _text(tmp_path, "g.txt", "0 1\n1 2\n")
    assert "--split-index chooses among an npz's stored splits; --format snap" in _run(
        capsys, tmp_path, "snap", s, "--split-index", "1")


def test_missing_npz_arrays_are_named(capsys, tmp_path):
    """numpy's KeyError text had been taken for the key: "missing key 'adj_data is not a
    file in the archive'"."""
    p = tmp_path / "g.npz"
    np.savez(p, adj_indices=np.zeros(1, np.int64), adj_indptr=np.array([0, 1]),
             adj_shape=np.array([1, 1]))
    assert f"{p}: no array 'adj_data' (keys: adj_indices, adj_indptr, adj_shape)" in _run(
        capsys, tmp_path, "gnn-benchmark", p)
    root = write_ogb_npz(tmp_path / "ogb", small_graph(20, 50, f=3))
    data = root / "raw" / "data.npz"
    with np.load(data) as z:
        kept = {k: z[k] for k in z.files if k != "num_nodes_list"}
    np.savez(data, **kept)
    assert f"{data}: no array 'num_nodes_list' (keys: edge_index, node_feat, " \
        "num_edges_list)" in _run(capsys, tmp_path, "ogb", root)


@pytest.mark.parametrize("fmt,option,msg", [
    ("sbm", "--features", "sbm: --features 10000000000000: drawing 100 nodes x "
     "10000000000000 float32 features takes 8000000000000000 bytes"),
    ("sbm", "--edge-features", "sbm: --edge-features 10000000000000: drawing 400 edges x "
     "10000000000000 float32 edge features takes 24000000000000000 bytes"),
    ("rmat", "--features", "--features 10000000000000: drawing a chunk of 100 rows x "
     "10000000000000 float32 features takes 4000000000000000 bytes"),
    ("rmat", "--edge-features", "rmat: --edge-features 10000000000000: drawing a chunk of "
     "400 edges x 10000000000000 float32 edge features takes 16000000000000000 bytes"),
])
def test_generated_arrays_beyond_memory_are_refused_before_allocating(capsys, tmp_path, fmt,
                                                                     option, msg):
    """These had been numpy's MemoryError tracebacks (rmat's inside prep, leaving output)."""
    err = _run(capsys, tmp_path, fmt, None, "--nodes", "100", "--edges", "400", option,
               str(10**13))
    assert msg in err and "more than this machine's" in err


def _split_npz(p, y):
    train = np.array([1, 1, 0, 0, 0, 0], bool)
    np.savez(p, edges=np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]), y=y,
             train_mask=train, val_mask=np.roll(train, 2), test_mask=np.roll(train, 4))
    return p


def test_labels_with_none_in_the_train_split_are_refused(capsys, tmp_path):
    """Multi-label tasks with no labelled train entry had 'trained' (loss 0, ROC-AUC nan,
    best validation epoch -1, exit 0); class ids likewise trained on no node."""
    y = np.full((6, 3), np.nan)
    p = _split_npz(tmp_path / "nan.npz", y)
    assert "the train split's 2 nodes hold no label (all -1, NaN or missing); 0 labelled " \
        "(node, task) entries in all" in _run(capsys, tmp_path, "npz", p)
    y[2:] = 1
    p = _split_npz(tmp_path / "ml.npz", y)
    assert "12 labelled (node, task) entries in all: nothing to train on" in _run(
        capsys, tmp_path, "npz", p)
    p = _split_npz(tmp_path / "sl.npz", np.array([-1, -1, 0, 1, 0, 1]))
    assert "the train split's 2 nodes hold no label" in _run(capsys, tmp_path, "npz", p)
    y[1, 2] = 0  # one labelled train entry is enough
    assert main(["prep", "--input", str(_split_npz(tmp_path / "ok.npz", y)), "--out",
                 str(tmp_path / "ok"), "--quiet"]) == 0


def test_options_the_format_would_ignore_are_refused(capsys, tmp_path):
    g = _text(tmp_path, "g.txt", "0 1\n1 2\n")
    for fmt, extra, msg in (
            ("snap", ("--split", "random"), "--split names an OGB split directory; --format "
             "snap has none"),
            ("snap", ("--one-based",), "--one-based goes with --format edgelist, not snap"),
            ("snap", ("--delimiter", "tab"), "--delimiter goes with --format edgelist"),
            ("snap", ("--no-header",), "--header/--no-header goes with --format edgelist"),
            ("edgelist", ("--label-column", "y"), "--label-column names a column of the "
             "--node-table; none is given"),
            ("edgelist", ("--id-column", "node"), "--id-column names a column")):
        assert msg in _run(capsys, tmp_path, fmt, g, *extra)


def test_format_auto_says_what_it_found_and_what_it_looked_for(capsys, tmp_path):
    """What each format looks for is its spec's; the message gathers them all, after what the
    path showed (an npz's keys)."""
    p = tmp_path / "odd.npz"
    np.savez(p, weights=np.zeros(2))
    err = _run(capsys, tmp_path, "auto", p)
    assert f"{p}: an npz with keys weights; --format auto cannot tell its format; it looked " \
        "for a directory holding raw/data.npz or raw/edge.csv.gz (ogb); " in err
    for looked in ("adj_data/adj_indices/adj_indptr (gnn-benchmark)",
                   "an .npz with edges or edge_index (npz)", "%%MatrixMarket banner (mtx)",
                   "'# Nodes: N Edges: E' header (snap)", ".edgelist[.gz] (edgelist)"):
        assert looked in err
    assert "--format auto needs --input PATH (or name a generator: --format rmat|sbm)" in \
        _run(capsys, tmp_path, "auto", None)
    assert "--input is not used with --format sbm" in _run(capsys, tmp_path, "sbm", p)
    assert "--format mtx needs --input PATH" in _run(capsys, tmp_path, "mtx", None)
    assert "--nodes 0: must be positive" in _run(capsys, tmp_path, "sbm", None, "--nodes", "0")
    assert "--nodes/--edges do not apply to --format mtx" in _run(
        capsys, tmp_path, "mtx", _text(tmp_path, "m.mtx", ""), "--nodes", "3")
