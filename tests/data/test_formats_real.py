"""Readers, prep and verify on the real public graphs in ../shared/datasets (skipped without it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from plexgt.cli import main
from plexgt.data.formats.gnn_benchmark import read_gnn_benchmark
from plexgt.data.formats.ogb import read_ogb
from plexgt.data.formats.snap import read_snap
from plexgt.data.graph import symmetrize
from plexgt.data.loader import PreparedGraph, read_rank_blocks
from plexgt.distributed.grid import Grid3D

DATASETS = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"
pytestmark = [
    pytest.mark.data,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not DATASETS.is_dir(),
                       reason=f"real datasets not present at {DATASETS} (clone without ../shared)"),
]

# file -> (nodes, nnz as stored, features, classes), from datasets/README.md
GNN_BENCHMARK = {
    "ms_academic_phy.npz": (34_493, 495_924, 8_415, 5),
    "ms_academic_cs.npz": (18_333, 163_788, 6_805, 15),
    "amazon_electronics_computers.npz": (13_752, 287_209, 767, 10),
    "amazon_electronics_photo.npz": (7_650, 143_663, 745, 8),
    "dblp.npz": (17_716, 105_734, 1_639, 4),
    "cora.npz": (2_708, 5_429, 1_433, 7),
    "citeseer.npz": (3_312, 4_715, 3_703, 6),
}


@pytest.mark.parametrize("name", sorted(GNN_BENCHMARK))
def test_gnn_benchmark_sizes(name):
    g = read_gnn_benchmark(DATASETS / "gnn-benchmark" / name)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == GNN_BENCHMARK[name]


def test_ogb_csv_amazon_computers_equals_gnn_benchmark_copy():
    g = read_ogb(DATASETS / "ogb" / "amazon-computers")
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (13_752, 245_861, 767, 10)
    assert {k: v.size for k, v in g.splits.items()} == {"train": 8251, "valid": 2750,
                                                       "test": 2751}
    ref = read_gnn_benchmark(DATASETS / "gnn-benchmark" / "amazon_electronics_computers.npz")
    a, b = symmetrize(g), symmetrize(ref)
    assert np.array_equal(a.src, b.src) and np.array_equal(a.dst, b.dst)
    np.testing.assert_array_equal(g.labels, ref.labels)
    np.testing.assert_array_equal(g.features, ref.features)


def test_ogb_npz_dblp_equals_gnn_benchmark_copy():
    g = read_ogb(DATASETS / "ogb" / "dblp")
    assert g.features.dtype == np.float16 and g.features.shape == (17_716, 1_639)
    assert {k: v.size for k, v in g.splits.items()} == {"train": 10629, "valid": 3543,
                                                       "test": 3544}
    ref = read_gnn_benchmark(DATASETS / "gnn-benchmark" / "dblp.npz")
    np.testing.assert_array_equal(g.src, ref.src)
    np.testing.assert_array_equal(g.dst, ref.dst)
    np.testing.assert_array_equal(g.labels, ref.labels)
    np.testing.assert_allclose(g.features.astype(np.float32), ref.features, atol=1e-3)


@pytest.mark.parametrize("name,n,e", [("ego-twitter.txt.gz", 81_306, 1_342_310),
                                      ("soc-slashdot0902.txt.gz", 82_168, 948_464)])
def test_snap_sizes(name, n, e):
    g = read_snap(DATASETS / "snap" / name)
    assert (g.num_nodes, g.num_edges) == (n, e)


def test_prep_ogb_npz_streamed_then_verify_and_load(tmp_path):
    out = tmp_path / "dblp"
    assert main(["prep", "--format", "ogb", "--input", str(DATASETS / "ogb" / "dblp"),
                 "--out", str(out), "--symmetrize", "--tiles", "3", "--quiet"]) == 0
    assert main(["verify", str(out)]) == 0
    g = symmetrize(read_ogb(DATASETS / "ogb" / "dblp"))
    with PreparedGraph(out) as pg:
        assert pg.manifest["dtypes"]["features"] == "float16"
        assert pg.E == g.num_edges + 17_716 - int(np.sum(g.src == g.dst))
        rb = read_rank_blocks(pg, Grid3D(2, 1, 1), 1, 2)
        q = pg.read_perm("Q")
        lo, hi = rb.feature_rows
        np.testing.assert_array_equal(rb.features, g.features[q[lo:hi]])
        assert pg.manifest["splits"] == {"train": 10629, "valid": 3543, "test": 3544}


def test_prep_gnn_benchmark_cora(tmp_path):
    out = tmp_path / "cora"
    assert main(["prep", "--format", "gnn-benchmark", "--input",
                 str(DATASETS / "gnn-benchmark" / "cora.npz"), "--out", str(out),
                 "--symmetrize", "--quiet"]) == 0
    assert main(["verify", str(out)]) == 0


@pytest.mark.parametrize("name", ["ego-twitter.txt.gz", "soc-slashdot0902.txt.gz"])
def test_prep_balances_small_power_law_graphs_by_default(tmp_path, name):
    """No --permutation flag: 'auto' refines these graphs (< 2e7 nonzeros) to balanced, so
    every block of an 8 x 8 split holds the same nonzeros to 1% (random: 1.04-1.08)."""
    out = tmp_path / "g"
    assert main(["prep", "--format", "snap", "--input", str(DATASETS / "snap" / name),
                 "--out", str(out), "--quiet"]) == 0
    with PreparedGraph(out) as pg:
        assert pg.manifest["permutation"]["method"] == "balanced"
        assert pg.manifest["permutation"]["asked"] == "auto"
        bounds = [(-(-pg.N // 8) * i, min(pg.N, -(-pg.N // 8) * (i + 1))) for i in range(8)]
        for which in ("A1", "A2"):
            nnz = np.array([[pg.read_adjacency(which, r, c).nnz for c in bounds]
                            for r in bounds], dtype=np.float64)
            assert nnz.max() / nnz.mean() <= 1.01, (which, nnz.max() / nnz.mean())
