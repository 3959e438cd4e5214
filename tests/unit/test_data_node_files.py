"""From raw node files to a prepared graph with commands alone: class names in a node table,
a split column, sparse feature files (JSON, JSON lines, COO triples), the split's origin."""

from __future__ import annotations

import json

import numpy as np
import pytest

from plexgt.cli import main
from plexgt.data.loader import PreparedGraph

pytestmark = pytest.mark.timeout(120)

N, F = 30, 40
NAMES = ["company", "government", "politician", "tvshow"]


def _graph(seed: int = 0):
    """(edges, class name per node ('' for two unlabelled ones), feature id lists)."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, N, (2, 90))
    cls = [NAMES[k] for k in rng.integers(0, 4, N)]
    cls[5] = cls[17] = ""
    feats = {i: sorted(set(rng.integers(0, F, rng.integers(0, 4)).tolist())) for i in range(N)}
    feats[3] = [F - 1]  # F is the largest id + 1, whoever holds it
    return (src, dst), cls, feats


def _write(tmp_path, split: list[str] | None = None):
    (src, dst), cls, feats = _graph()
    edges = tmp_path / "edges.csv"
    edges.write_text("id_1,id_2\n" + "".join(f"{s},{d}\n" for s, d in zip(src, dst)))
    order = np.random.default_rng(1).permutation(N)  # rows in any order
    rows = ["id,name,page_type" + (",split" if split else "")]
    for i in order:
        rows.append(f"{i},node {i},{cls[i]}" + (f",{split[i]}" if split else ""))
    target = tmp_path / "target.csv"
    target.write_text("\n".join(rows) + "\n")
    fj = tmp_path / "features.json"
    fj.write_text(json.dumps({str(i): feats[i] for i in order}))
    return edges, target, fj, cls, feats


def _dense(feats) -> np.ndarray:
    x = np.zeros((N, F), np.float32)
    for i, ids in feats.items():
        x[i, ids] = 1
    return x


def _prep(edges, out, *extra):
    return main(["prep", "--input", str(edges), "--out", str(out), "--quiet", "--tiles", "2",
                 *extra])


def _manifest(out):
    return json.loads((out / "manifest.json").read_text())


def test_class_names_map_to_sorted_ids_and_the_manifest_keeps_them(tmp_path):
    edges, target, fj, cls, feats = _write(tmp_path)
    assert _prep(edges, tmp_path / "o", "--node-table", str(target), "--label-column",
                 "page_type", "--feature-file", str(fj)) == 0
    m = _manifest(tmp_path / "o")
    assert m["label_names"] == NAMES and m["C"] == 4 and (m["N"], m["F"]) == (N, F)
    assert m["feature_layout"] == "csr"  # 0-3 ids of 40: below 10%
    assert m["split"] == {"origin": "random", "fractions": [0.6, 0.2, 0.2], "seed": 0}
    want = np.array([NAMES.index(c) if c else -1 for c in cls])
    with PreparedGraph(tmp_path / "o") as pg:
        q = pg.read_perm("Q")
        np.testing.assert_array_equal(pg.read_labels(None, "Q"), want[q])
        np.testing.assert_array_equal(pg.read_features(), _dense(feats)[q])
    assert main(["verify", str(tmp_path / "o")]) == 0


def test_a_split_column_is_the_split_and_its_origin_is_recorded(tmp_path, capsys):
    split = (["train", "TRAIN ", "val", "validation", "valid", "test", "Test", ""] * 4)[:N]
    edges, target, fj, _, _ = _write(tmp_path, split)
    assert _prep(edges, tmp_path / "o", "--node-table", str(target), "--label-column",
                 "page_type", "--split-column", "split") == 0
    m = _manifest(tmp_path / "o")
    assert m["split"] == {"origin": "column", "column": "split", "file": str(target)}
    assert m["source"]["split_column"] == "split"
    want = {"train": [i for i, s in enumerate(split) if s.strip().lower() == "train"],
            "valid": [i for i, s in enumerate(split) if s.lower() in ("val", "validation",
                                                                       "valid")],
            "test": [i for i, s in enumerate(split) if s.lower() == "test"]}
    assert m["splits"] == {k: len(v) for k, v in want.items()}
    with PreparedGraph(tmp_path / "o") as pg:
        p = pg.read_perm("P")
        for k, ids in want.items():
            assert sorted(p[pg.read_mask(k, None, "P")].tolist()) == ids
    # the split column is part of the source: a resume without it is another run
    assert _prep(edges, tmp_path / "o", "--node-table", str(target), "--label-column",
                 "page_type", "--resume") == 2
    assert "prepared with different options or input" in capsys.readouterr().err


def test_every_feature_file_layout_prepares_the_same_files(tmp_path):
    """JSON mapping, JSON lines (both shapes), COO triples with and without header or value."""
    edges, target, fj, _, feats = _write(tmp_path)
    jl = tmp_path / "f.jsonl"
    jl.write_text("".join(json.dumps({"id": i, "features": v}) + "\n" for i, v in feats.items()))
    jl2 = tmp_path / "f2.json"  # several values in a .json: read as lines
    jl2.write_text("".join(json.dumps({str(i): v}) + "\n" for i, v in feats.items()))
    coo = tmp_path / "f.csv"
    coo.write_text("node,feature,value\n" + "".join(f"{i},{j},1\n" for i, v in feats.items()
                                                    for j in v))
    pairs = tmp_path / "f.tsv"
    pairs.write_text("".join(f"{i}\t{j}\n" for i, v in feats.items() for j in v))
    files = []
    for k, f in enumerate((fj, jl, jl2, coo, pairs)):
        assert _prep(edges, tmp_path / f"o{k}", "--node-table", str(target), "--label-column",
                     "page_type", "--feature-file", str(f)) == 0, f
        m = _manifest(tmp_path / f"o{k}")
        files.append({k: v for k, v in m["files"].items()})
    assert all(f == files[0] for f in files)


def test_a_feature_file_without_a_node_table_and_coo_values(tmp_path):
    """N from the edge list; a triple's value is kept; --one-based shifts node ids only."""
    edges = tmp_path / "e.txt"
    edges.write_text("1 2\n2 3\n3 4\n")
    coo = tmp_path / "x.csv"
    coo.write_text("1,0,2.5\n4,3,-1\n")
    assert _prep(edges, tmp_path / "o", "--one-based", "--feature-file", str(coo)) == 0
    with PreparedGraph(tmp_path / "o") as pg:
        x = pg.read_features()[np.argsort(pg.read_perm("Q"))]
    np.testing.assert_array_equal(x, [[2.5, 0, 0, 0], [0] * 4, [0] * 4, [0, 0, 0, -1]])


@pytest.mark.parametrize("name,text,msg", [
    ("list.json", "[[1, 2]]", "must map node ids to lists of feature ids (found a list)"),
    ("neg.json", '{"0": [1, -2]}', "node 0: feature id -2 is negative"),
    ("far.json", '{"30": [1]}', "node id 30 is not among the 30 nodes of the node table"),
    ("word.json", '{"x": [1]}', "node id 'x' is not a whole number"),
    ("float.json", '{"0": [1.5]}', "node 0: feature ids must be whole numbers"),
    ("notlist.json", '{"0": 3}', "node 0: features must be a list of feature ids"),
    ("twice.json", '{"0": [1], "0": [2]}', "node 0 is listed twice"),
    ("twice.jsonl", '{"0": [1]}\n{"id": 0, "features": [2]}\n',
     "line 2: node 0 is listed twice (first at line 1)"),
    ("shape.jsonl", '{"a": 1, "b": 2}\n', 'line 1: expected {"id": ..., "features"'),
    ("broken.json", '{"0": [1,', "line 1: not JSON"),
    ("dup.csv", "0,1,1\n2,3,1\n0,1,2\n", "line 3: node 0, feature 1 is given twice"),
    ("negc.csv", "n,f,v\n0,1,1\n2,-3,1\n", "line 3: feature id -3 is negative"),
    ("huge.csv", "0,99999999,1\n", "would make 100000000 feature columns"),
    ("empty.json", "{}", "lists no node"),
])
def test_bad_feature_files_are_one_line_errors(tmp_path, capsys, name, text, msg):
    edges, target, _, _, _ = _write(tmp_path)
    bad = tmp_path / name
    bad.write_text(text)
    assert _prep(edges, tmp_path / "o", "--node-table", str(target), "--feature-file",
                 str(bad)) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1 and str(bad) in err
    assert not (tmp_path / "o").exists()


def test_bad_node_table_input_is_one_line_errors(tmp_path, capsys):
    split = ["train", "dev"] + ["test"] * (N - 2)
    edges, target, fj, _, _ = _write(tmp_path, split)
    row = list(np.random.default_rng(1).permutation(N)).index(1) + 1  # node 1's row
    base = ["--node-table", str(target)]
    cases = [
        ([*base, "--split-column", "split"],
         f"row {row}: split 'dev' in column 'split' is not train, valid (val, validation) or test"),
        ([*base, "--split-column", "id"], "split column 'id' has type int64; expected text"),
        ([*base, "--split-column", "nope"], "no split column 'nope'"),
        ([*base, "--label-column", "page_type,split"], "label column 'page_type' has type"),
        ([*base, "--feature-columns", "id", "--feature-file", str(fj)],
         "--feature-file and --feature-columns both give the features"),
        (["--split-column", "split"], "--split-column names a column of the --node-table"),
    ]
    for extra, msg in cases:
        assert _prep(edges, tmp_path / "o", *extra) == 2, extra
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1, (extra, err)
        assert not (tmp_path / "o").exists()
    snap = tmp_path / "g.txt"
    snap.write_text("0\t1\n")
    assert main(["prep", "--format", "snap", "--input", str(snap), "--feature-file", str(fj),
                 "--out", str(tmp_path / "o")]) == 2
    assert "--feature-file goes with --format edgelist, not snap" in capsys.readouterr().err


def test_the_split_origin_of_every_kind_of_source(tmp_path):
    from tests.datagen import small_graph, write_ogb_npz

    assert main(["prep", "--format", "sbm", "--nodes", "200", "--edges", "1000", "--seed", "3",
                 "--out", str(tmp_path / "sbm"), "--quiet"]) == 0
    assert _manifest(tmp_path / "sbm")["split"] == {
        "origin": "random", "fractions": [0.6, 0.2, 0.2], "seed": 3}
    g = small_graph(20, 60, f=2)
    masks = np.random.default_rng(0).random((2, 20)) < 0.5
    npz = tmp_path / "s.npz"
    np.savez(npz, edges=np.stack([g.src, g.dst], 1), node_labels=g.labels, train_masks=masks,
             val_masks=~masks)
    assert main(["prep", "--input", str(npz), "--split-index", "1", "--out",
                 str(tmp_path / "npz"), "--quiet"]) == 0
    assert _manifest(tmp_path / "npz")["split"] == {"origin": "dataset", "split_index": 1}
    root = write_ogb_npz(tmp_path / "ogb", g)
    assert main(["prep", "--format", "ogb", "--input", str(root), "--out",
                 str(tmp_path / "ogb-out"), "--quiet"]) == 0
    assert _manifest(tmp_path / "ogb-out")["split"] == {
        "origin": "file", "path": str((root / "split" / "random").resolve())}
