"""--sparse-features auto decides from the density prep measures, for every source: a node
table's bag-of-words columns, OGB's streamed rows, a source that reads rows by id."""

from __future__ import annotations

import json

import numpy as np
import pytest

from plexgt.cli import main
from plexgt.data.graph import GraphData
from plexgt.data.loader import PreparedGraph
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.verify import verify
from tests.datagen import small_graph, sparsified

pytestmark = pytest.mark.timeout(120)


def _bow_table(tmp_path, g):
    """The edge list and a CSV node table of ``g`` (features in columns w0..)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    edges = tmp_path / "e.csv"
    edges.write_text("src,dst\n" + "".join(f"{s},{d}\n" for s, d in zip(g.src, g.dst)))
    cols = {"id": np.arange(g.num_nodes), "y": g.labels}
    cols.update({f"w{j}": g.features[:, j] for j in range(g.num_features)})
    table = tmp_path / "nodes.csv"
    pacsv.write_csv(pa.table(cols), table)
    return edges, table


def test_a_node_tables_bag_of_words_is_stored_csr(tmp_path, capsys):
    """A node table declares no density: its columns had been stored dense whatever their
    zeros (431 MB for 7 MB of nonzeros in issue 39). Measured on the bucketing pass now."""
    g = sparsified(small_graph(70, 300, f=40), density=0.04)
    edges, table = _bow_table(tmp_path, g)
    base = ["prep", "--input", str(edges), "--node-table", str(table), "--label-column", "y",
            "--feature-columns", "w*", "--quiet", "--tiles", "2", "--no-symmetrize"]
    assert main([*base, "--out", str(tmp_path / "auto")]) == 0
    density = np.count_nonzero(g.features) / g.features.size
    assert f"features=csr ({100 * density:.3g}% nonzero)" in capsys.readouterr().err
    assert main([*base, "--sparse-features", "no", "--out", str(tmp_path / "dense")]) == 0
    m = json.loads((tmp_path / "auto" / "manifest.json").read_text())
    assert m["feature_layout"] == "csr" and m["params"]["feature_layout"] == "auto"
    assert m["feature_density"] == pytest.approx(density, abs=1e-6)
    assert m["feature_nnz"] == np.count_nonzero(g.features)
    with PreparedGraph(tmp_path / "auto") as a, PreparedGraph(tmp_path / "dense") as b:
        assert a.sparse_features and not b.sparse_features
        np.testing.assert_array_equal(a.read_features(), b.read_features())
    assert verify(tmp_path / "auto")["ok"]


def test_dense_columns_stay_dense(tmp_path):
    g = small_graph(40, 120, f=6)
    edges, table = _bow_table(tmp_path, g)
    assert main(["prep", "--input", str(edges), "--node-table", str(table), "--feature-columns",
                 "w*", "--quiet", "--out", str(tmp_path / "o")]) == 0
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["feature_layout"] == "dense" and m["feature_density"] == 1.0


def test_streamed_ogb_rows_measured_and_kept_over_a_resume(tmp_path):
    """OGB's npz rows go through the buckets: measured there; an interrupted run's measure is
    recorded with the buckets, so the resumed run (which skips that pass) keeps the layout."""
    from plexgt.data.formats.ogb import open_ogb
    from tests.datagen import write_ogb_npz

    g = sparsified(small_graph(53, 200, f=30), density=0.05)
    root = write_ogb_npz(tmp_path / "ogb", g)
    kw = dict(tiles=3, progress=False, chunk_edges=17, feature_block_bytes=300)
    with pytest.raises(RuntimeError, match="simulated interruption"):
        prepare(open_ogb(root), PrepOptions(out=tmp_path / "o", **kw), fail_after=1)
    m = prepare(open_ogb(root), PrepOptions(out=tmp_path / "o", resume=True, **kw))
    ref = prepare(open_ogb(root), PrepOptions(out=tmp_path / "r", **kw))
    assert m["feature_layout"] == ref["feature_layout"] == "csr"
    assert m["files"] == ref["files"]
    want = np.count_nonzero(g.features.astype(np.float16)) / g.features.size
    assert m["feature_density"] == pytest.approx(want, abs=1e-6)


class _Undeclared(MemorySource):
    """Rows by id, density not declared: prep counts them in a pass of its own."""

    def feature_density(self):
        return None


def test_a_source_that_reads_rows_by_id_is_counted(tmp_path):
    g = sparsified(small_graph(45, 150, f=20), density=0.05)
    g = GraphData("bow", 45, g.src, g.dst, g.features, g.labels)
    m = prepare(_Undeclared(g), PrepOptions(out=tmp_path / "o", tiles=2, progress=False))
    d = prepare(MemorySource(g), PrepOptions(out=tmp_path / "d", tiles=2, progress=False))
    assert m["feature_layout"] == d["feature_layout"] == "csr"
    assert m["files"] == d["files"]
    assert m["feature_density"] == pytest.approx(d["feature_density"])
