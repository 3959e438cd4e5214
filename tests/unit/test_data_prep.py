"""prep -> loader round trips against the in-memory permuted matrices, verify, and resume."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from plexgt.cli import main
from plexgt.data.graph import symmetrize
from plexgt.data.loader import PreparedGraph, read_rank_blocks, read_row_block
from plexgt.data.permute import inverse, permutations, processed_edges, reference_matrices
from plexgt.data.prepared import tile_file
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.verify import verify
from plexgt.distributed.grid import Grid3D, block_bounds, layer_roles
from plexgt.errors import DataError
from tests.datagen import small_graph

pytestmark = pytest.mark.timeout(120)

GRIDS = [(1, 1, 1), (3, 1, 1), (3, 2, 1), (1, 3, 2), (5, 1, 1), (2, 2, 2), (1, 1, 4), (2, 3, 1),
         (12, 1, 1), (1, 2, 12)]  # 12 blocks of ceil(37/12)=4 rows: the last two are empty


def _prep(g, out, **kw):
    kw.setdefault("tiles", 4)
    return prepare(MemorySource(g), PrepOptions(out=out, progress=False, **kw))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """N=37 (prime: no grid divides it), T=4 (tile 10: tiles never align with blocks)."""
    g = small_graph(37, 150, f=5)
    out = tmp_path_factory.mktemp("prep") / "p"
    # tiny chunks and buffers: many bucket flushes and segments per tile
    m = _prep(g, out, seed=5, chunk_edges=13, flush_items=17, feature_block_bytes=60)
    a1, a2 = reference_matrices(g, seed=5)
    return g, out, m, a1, a2


def test_manifest(prepared):
    g, out, m, a1, _ = prepared
    assert (m["N"], m["F"], m["C"], m["T"], m["tile_size"]) == (37, 5, 3, 4, 10)
    assert m["E"] == a1.nnz and m["self_loops"] and not m["symmetrized"]
    assert m["splits"] == {k: int(v.size) for k, v in g.splits.items()}
    assert m["feature_block_rows"] == 3 and m["num_feature_blocks"] == 13
    assert set(m["files"]) >= {"nodes.h5", "A1/rows_00003.h5", "A2/rows_00000.h5"}
    assert json.loads((out / "manifest.json").read_text())["E"] == m["E"]
    assert not (out / ".staging").exists()


@pytest.mark.parametrize("shape", GRIDS, ids=lambda s: "x".join(map(str, s)))
def test_rank_blocks_equal_reference(prepared, shape):
    g, out, _, a1, a2 = prepared
    grid = Grid3D(*shape)
    p, q = permutations(g.num_nodes, 5)
    deg = {"P": np.asarray(a1.sum(1)).ravel(), "Q": np.asarray(a2.sum(1)).ravel()}
    feats_q = g.features[q]
    with PreparedGraph(out) as pg:
        for rank in range(grid.size):
            rb = read_rank_blocks(pg, grid, rank, num_layers=3)
            c = dict(zip("xyz", grid.coords(rank)))
            for lb in rb.layers:
                a, _, cc = layer_roles(lb.layer)
                rows = block_bounds(37, grid.dim(cc), c[cc])
                cols = block_bounds(37, grid.dim(a), c[a])
                ref = (a1 if lb.layer % 2 == 0 else a2)[rows[0] : rows[1], cols[0] : cols[1]]
                assert (lb.rows, lb.cols) == (rows, cols)
                assert lb.adj.shape == ref.shape and (lb.adj != ref).nnz == 0
                assert lb.adj.has_sorted_indices
                o_out, o_in = ("P", "Q") if lb.layer % 2 == 0 else ("Q", "P")
                np.testing.assert_array_equal(lb.deg_rows, deg[o_out][rows[0] : rows[1]])
                np.testing.assert_array_equal(lb.deg_cols, deg[o_in][cols[0] : cols[1]])
            fr = block_bounds(37, grid.gx, c["x"])
            k0, k1 = block_bounds(5, grid.gy * grid.gz, c["y"] * grid.gz + c["z"])
            np.testing.assert_array_equal(rb.features,
                                          feats_q[fr[0] : fr[1], k0:k1])
            # 3 layers: the last (layer 2) uses A1, so output rows are in P order over z... roles
            last_c = layer_roles(2)[2]
            orow = block_bounds(37, grid.dim(last_c), c[last_c])
            assert rb.output_order == "P" and rb.output_rows == orow
            np.testing.assert_array_equal(rb.labels, g.labels[p][orow[0] : orow[1]])
            mask = np.zeros(37, bool)
            mask[g.splits["train"]] = True
            np.testing.assert_array_equal(rb.masks["train"], mask[p][orow[0] : orow[1]])
            assert rb.bytes_read > 0 or rb.features.size == 0


def test_even_layer_count_outputs_q_order(prepared):
    g, out, *_ = prepared
    _, q = permutations(37, 5)
    with PreparedGraph(out) as pg:
        rb = read_rank_blocks(pg, Grid3D(1, 2, 1), 1, num_layers=2)
        lo, hi = rb.output_rows
        assert rb.output_order == "Q"
        np.testing.assert_array_equal(rb.labels, g.labels[q][lo:hi])


def test_arbitrary_ranges_and_bytes(prepared):
    _, out, _, a1, a2 = prepared
    rng = np.random.default_rng(0)
    with PreparedGraph(out) as pg:
        for _ in range(40):
            r = np.sort(rng.integers(0, 38, 2))
            c = np.sort(rng.integers(0, 38, 2))
            for which, ref in (("A1", a1), ("A2", a2)):
                got = pg.read_adjacency(which, tuple(r), tuple(c))
                assert (got != ref[r[0] : r[1], c[0] : c[1]]).nnz == 0
        before = pg.bytes_read
        blk = pg.read_adjacency("A1", (0, 10), (0, 10))  # exactly tile (0, 0)
        # both anchors of the window (its start, and its end checked against the counts),
        # uint8 counts, int32 indices
        assert pg.bytes_read - before == 2 * 8 + 10 * 1 + blk.nnz * 4
        assert pg.read_adjacency("A1", (5, 5), (0, 37)).shape == (0, 37)
        assert pg.read_features((3, 3)).shape == (0, 5)


def test_permutations_map_back(prepared):
    g, out, *_ = prepared
    with PreparedGraph(out) as pg:
        p, q = pg.read_perm("P"), pg.read_perm("Q")
        np.testing.assert_array_equal(pg.to_original(pg.read_labels(order="P"), "P"), g.labels)
        np.testing.assert_array_equal(pg.to_original(pg.read_labels(order="Q"), "Q"), g.labels)
        np.testing.assert_array_equal(pg.to_original(pg.read_features(), "Q"), g.features)
    ep, eq = permutations(37, 5)
    np.testing.assert_array_equal(p, ep)
    np.testing.assert_array_equal(q, eq)


def test_row_block_is_q_a_qt(prepared):
    g, out, _, a1, _ = prepared
    p, q = permutations(37, 5)
    # Q A Q^T from A1 = P A Q^T: rows P -> Q
    pinv = inverse(p)
    aqq = a1[pinv[q]]
    with PreparedGraph(out) as pg:
        for i in range(4):
            rb = read_row_block(pg, i, 4)
            lo, hi = rb.rows
            assert (rb.adj != aqq[lo:hi]).nnz == 0
            np.testing.assert_array_equal(rb.features, g.features[q][lo:hi])
            np.testing.assert_array_equal(rb.labels, g.labels[q][lo:hi])


def test_output_independent_of_chunking_and_verify_ok(prepared, tmp_path):
    g, out, m, *_ = prepared
    m2 = _prep(g, tmp_path / "q", seed=5, feature_block_bytes=60)  # default chunking
    assert m2["files"] == m["files"]
    res = verify(out)
    assert res["ok"], res["problems"]


@pytest.mark.parametrize("sym,loops", [(True, True), (False, False), (True, False)])
def test_symmetrize_and_self_loop_options(tmp_path, sym, loops):
    g = small_graph(23, 60, f=2)
    m = _prep(g, tmp_path / "o", tiles=3, symmetrize=sym, self_loops=loops)
    a1, a2 = reference_matrices(g, 0, sym, loops)
    assert m["E"] == a1.nnz and m["symmetrized"] == sym and m["self_loops"] == loops
    with PreparedGraph(tmp_path / "o") as pg:
        assert (pg.read_adjacency("A1") != a1).nnz == 0
        assert (pg.read_adjacency("A2") != a2).nnz == 0
        if sym:
            # A2 = Q A P^T = (P A^T Q^T)^T = A1^T for a symmetric A
            assert (pg.read_adjacency("A2") != pg.read_adjacency("A1").T).nnz == 0
    assert verify(tmp_path / "o")["ok"]
    if sym:
        ref = symmetrize(g)
        assert m["E"] == ref.num_edges + (23 - int(np.sum(ref.src == ref.dst)) if loops else 0)


def test_verify_detects_corruption(prepared, tmp_path):
    import shutil

    _, out, *_ = prepared
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    f = bad / "A1" / "rows_00001.h5"
    data = bytearray(f.read_bytes())
    data[-20] ^= 0xFF
    f.write_bytes(bytes(data))
    res = verify(bad)
    assert not res["ok"] and any("sha256 mismatch" in p for p in res["problems"])
    assert main(["verify", str(bad)]) == 2


def test_verify_detects_broken_partner_with_valid_checksums(prepared, tmp_path):
    import shutil

    from plexgt.util.files import sha256_file

    _, out, *_ = prepared
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    rel = "A2/rows_00000.h5"
    with h5py.File(bad / rel, "r+") as f:
        ind = f["t00000/indices"]
        cnt = f["t00000/counts"][()].astype(np.int64)
        row = int(np.nonzero(cnt == 1)[0][0])  # a row with one entry: move it
        k = int(cnt[:row].sum())
        ind[k] = (ind[k] + 1) % 10
    m = json.loads((bad / "manifest.json").read_text())
    m["files"][rel] = {"bytes": (bad / rel).stat().st_size, "sha256": sha256_file(bad / rel)}
    (bad / "manifest.json").write_text(json.dumps(m))
    probs = verify(bad)["problems"]
    assert any("not the partner" in p for p in probs), probs


def test_resume_after_interruption(tmp_path, capsys):
    g = small_graph(41, 200, f=3)
    ref = _prep(g, tmp_path / "ref", tiles=3)
    out = tmp_path / "o"
    with pytest.raises(RuntimeError, match="simulated interruption"):
        prepare(MemorySource(g), PrepOptions(out=out, tiles=3, progress=False), fail_after=2)
    assert not (out / "manifest.json").exists()
    (out / "A1" / "rows_00002.h5.tmp").write_bytes(b"half-written")
    with pytest.raises(DataError, match="interrupted prep"):
        PreparedGraph(out)
    with pytest.raises(DataError, match="exists"):
        prepare(MemorySource(g), PrepOptions(out=out, tiles=3, progress=False))
    with pytest.raises(DataError, match="different options"):
        prepare(MemorySource(g), PrepOptions(out=out, tiles=2, resume=True, progress=False))
    done_before = sorted((out / ".staging" / "done").iterdir())
    assert len(done_before) == 2
    m = prepare(MemorySource(g), PrepOptions(out=out, tiles=3, resume=True, progress=False))
    assert m["files"] == ref["files"]
    assert not list(out.rglob("*.tmp")) and not (out / ".staging").exists()
    assert verify(out)["ok"]
    # resuming a complete directory is a no-op
    assert prepare(MemorySource(g), PrepOptions(out=out, tiles=3, resume=True,
                                                progress=False))["files"] == ref["files"]


def test_resume_redoes_interrupted_bucketing(tmp_path):
    g = small_graph(29, 90, f=2)
    out = tmp_path / "o"
    with pytest.raises(RuntimeError):
        prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False), fail_after=0)
    (out / ".staging" / "bucketed.json").unlink()
    for f in (out / ".staging" / "buckets").iterdir():
        f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])  # torn files
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, resume=True, progress=False))
    assert verify(out)["ok"]


def test_cli_prep_and_verify(tmp_path, capsys):
    from tests.datagen import write_snap

    snap = write_snap(tmp_path / "g.txt.gz", small_graph(30, 80))
    out = tmp_path / "o"
    rc = main(["prep", "--format", "snap", "--input", str(snap), "--out", str(out),
               "--symmetrize", "--features", "8", "--classes", "3", "--quiet", "--tiles", "2"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "N=30" in err and "tiles=2x2" in err and "imbalance=" in err
    with PreparedGraph(out) as pg:
        assert (pg.F, pg.C, pg.symmetrized) == (8, 3, True)
        assert pg.manifest["source_files"][0]["sha256"]
    assert main(["verify", str(out)]) == 0
    rc = main(["prep", "--format", "sbm", "--nodes", "300", "--edges", "3000", "--classes",
               "3", "--features", "4", "--out", str(tmp_path / "s"), "--quiet",
               "--no-self-loops", "--features-dtype", "float16"])
    assert rc == 0
    with PreparedGraph(tmp_path / "s") as pg:
        assert pg.read_features((0, 4)).dtype == np.float16 and not pg.self_loops
        a1 = pg.read_adjacency("A1")
        assert sp.csr_matrix(a1).diagonal().sum() < 300


def test_rows_beyond_an_anchor_and_wide_counts(tmp_path):
    """Tiles of 3000 rows (anchors at 0, 1024, 2048) and a hub row (>255: uint16 counts)."""
    rng = np.random.default_rng(1)
    n = 3000
    src = np.concatenate([rng.integers(0, n, 6000), np.arange(1, 400)])
    dst = np.concatenate([rng.integers(0, n, 6000), np.zeros(399, dtype=np.int64)])
    g = small_graph(n, 10, f=1)
    g.src, g.dst = src.astype(np.int64), dst.astype(np.int64)
    _prep(g, tmp_path / "o", tiles=1)
    a1, a2 = reference_matrices(g, 0)
    with PreparedGraph(tmp_path / "o") as pg, h5py.File(tmp_path / "o/A2/rows_00000.h5") as f:
        assert f["t00000/counts"].dtype == np.uint16 and f["t00000/anchors"].shape == (4,)
        for lo, hi in [(0, 3000), (1023, 1025), (1500, 2900), (2048, 2049), (2999, 3000)]:
            for c in [(0, 3000), (700, 2100)]:
                assert (pg.read_adjacency("A1", (lo, hi), c) != a1[lo:hi, c[0]:c[1]]).nnz == 0
                assert (pg.read_adjacency("A2", (lo, hi), c) != a2[lo:hi, c[0]:c[1]]).nnz == 0
    assert verify(tmp_path / "o")["ok"]


def test_streamed_features_through_buckets(tmp_path):
    """A streaming source (OGB npz): feature rows go through the buckets, land in Q order."""
    from plexgt.data.formats.ogb import open_ogb
    from tests.datagen import write_ogb_npz

    g = small_graph(53, 200, f=6)
    root = write_ogb_npz(tmp_path / "ogb", g)
    src = open_ogb(root)
    assert not src.random_access_features
    prepare(src, PrepOptions(out=tmp_path / "o", tiles=3, progress=False, flush_items=40,
                             chunk_edges=17, feature_block_bytes=100))
    _, q = permutations(53, 0)
    with PreparedGraph(tmp_path / "o") as pg:
        assert pg.manifest["num_feature_blocks"] > 3
        np.testing.assert_array_equal(pg.read_features(), g.features.astype(np.float16)[q])
        np.testing.assert_array_equal(pg.read_features((5, 40), (2, 5)),
                                      g.features.astype(np.float16)[q][5:40, 2:5])
    assert verify(tmp_path / "o")["ok"]


def test_degree_stratified_permutation(tmp_path):
    """--permutation degree|balanced: still exact (vs the oracle built from the stored perms),
    balanced."""
    from plexgt.data.synthetic import rmat

    g = rmat(1 << 12, 1 << 16, seed=4)
    imb = {}
    for method in ("random", "degree", "balanced"):
        out = tmp_path / method
        m = _prep(g, out, tiles=8, permutation=method)
        assert m["permutation"]["method"] == method
        nnz = np.asarray(m["tile_nnz"]["A1"], dtype=float)
        imb[method] = nnz.max() / nnz.mean()
        with PreparedGraph(out) as pg:
            p, q = pg.read_perm("P"), pg.read_perm("Q")
            src, dst = processed_edges(g, False, True)
            pinv, qinv = inverse(p), inverse(q)
            ref = sp.csr_matrix((np.ones(src.size, np.float32), (pinv[dst], qinv[src])),
                                shape=(g.num_nodes,) * 2)
            assert (pg.read_adjacency("A1", (100, 3000), (7, 4000)) != ref[100:3000, 7:4000]
                    ).nnz == 0
        assert verify(out)["ok"]
    assert imb["balanced"] < imb["degree"] < imb["random"]
    assert imb["balanced"] <= 1.02
    bal = json.loads((tmp_path / "balanced" / "manifest.json").read_text())
    assert bal["params"]["balance_blocks"] == 8
    assert bal["permutation"]["balance"]["imbalance"] == pytest.approx(imb["balanced"])


def test_cli_prep_balanced(tmp_path, capsys):
    out = tmp_path / "b"
    argv = ["prep", "--format", "rmat", "--nodes", "2000", "--edges", "30000", "--out",
            str(out), "--quiet", "--permutation", "balanced"]
    assert main([*argv, "--balance-blocks", "4"]) == 0
    with PreparedGraph(out) as pg:
        m = pg.manifest
        assert m["T"] == 1 and m["permutation"]["method"] == "balanced"
        assert m["permutation"]["balance"]["blocks"] == 4
        assert m["permutation"]["balance"]["imbalance"] <= 1.02
    assert verify(out)["ok"]
    assert main(["prep", "--format", "rmat", "--nodes", "20", "--edges", "30", "--out",
                 str(tmp_path / "r"), "--quiet", "--balance-blocks", "4"]) == 2
    assert "only applies to --permutation balanced" in capsys.readouterr().err
    assert main([*argv, "--balance-blocks", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "plexgt prep: error: --balance-blocks 0: must be at least 1"
    with pytest.raises(DataError, match="--balance-blocks -1"):  # library callers too
        PrepOptions(out=out, permutation="balanced", balance_blocks=-1)


def _edge_feature_reference(g, sym, loops):
    """(dst, src) -> the sum of the features of its copies (a reversed copy carries the
    edge's own features, an added self loop zeros): what prep stores for the merged edge."""
    ref: dict[tuple[int, int], np.ndarray] = {}
    pairs = [(g.dst, g.src)] + ([(g.src, g.dst)] if sym else [])
    for d, s in pairs:
        for a, b, f in zip(d.tolist(), s.tolist(), g.edge_attr.astype(np.float64)):
            ref[a, b] = ref.get((a, b), 0.0) + f
    if loops:
        for i in range(g.num_nodes):
            ref[i, i] = ref.get((i, i), np.zeros(g.edge_attr.shape[1]))
    return ref


@pytest.mark.parametrize("sym,loops", [(True, True), (False, False)])
def test_edge_features_kept_with_every_tile_in_both_permutations(tmp_path, sym, loops):
    g = small_graph(37, 150, f=2)
    g.edge_attr = np.random.default_rng(4).standard_normal((150, 3)).astype(np.float32)
    m = _prep(g, tmp_path / "o", tiles=3, symmetrize=sym, self_loops=loops, chunk_edges=13,
              flush_items=17)
    ref = _edge_feature_reference(g, sym, loops)
    assert m["FE"] == 3 and m["dtypes"]["edge_features"] == "float32" and m["E"] == len(ref)
    with PreparedGraph(tmp_path / "o") as pg:
        p, q = pg.read_perm("P"), pg.read_perm("Q")
        for which, (rows, cols) in (("A1", (p, q)), ("A2", (q, p))):
            adj, ef = pg.read_adjacency_edges(which, (4, 33), (2, 37))
            assert (adj != pg.read_adjacency(which, (4, 33), (2, 37))).nnz == 0
            coo = adj.tocoo()
            want = np.stack([ref[int(rows[r + 4]), int(cols[c + 2])]
                             for r, c in zip(coo.row, coo.col)])
            np.testing.assert_allclose(ef, want, rtol=1e-6, atol=1e-6)
    assert verify(tmp_path / "o")["ok"]
    # the duplicates' sums do not depend on the order the buckets delivered them in
    m2 = _prep(g, tmp_path / "o2", tiles=3, symmetrize=sym, self_loops=loops)
    assert m2["files"] == m["files"]


def test_verify_catches_edge_features_that_disagree_between_permutations(tmp_path):
    g = small_graph(23, 60, f=2)
    g.edge_attr = np.ones((60, 2), dtype=np.float32)
    _prep(g, tmp_path / "o", tiles=2)
    tile = tmp_path / "o" / tile_file("A2", 0)
    with h5py.File(tile, "r+") as f:
        grp = next(f[k] for k in f if k.startswith("t0") and f[k]["indices"].size)
        data = grp["edge_feat"][()]
        data[0, 0] = 5.0
        del grp["edge_feat"]
        grp.create_dataset("edge_feat", data=data)
    res = verify(tmp_path / "o", checksums=False)
    assert not res["ok"] and any("different edge features" in p for p in res["problems"])


def test_edge_features_that_do_not_fit_are_refused():
    g = small_graph(23, 60, f=2)
    g.edge_attr = np.ones((59, 2), dtype=np.float32)
    with pytest.raises(DataError, match=r"edge features \(59, 2\) float32 must be float"):
        g.validate()
    g.edge_attr = np.ones((60, 2), dtype=np.float32)
    g.edge_attr[7, 1] = np.nan
    with pytest.raises(DataError, match="non-finite edge feature of edge 7"):
        g.validate()


def test_cli_generators_make_edge_features(tmp_path, capsys):
    for fmt in ("sbm", "rmat"):
        out = tmp_path / fmt
        rc = main(["prep", "--format", fmt, "--nodes", "300", "--edges", "3000",
                   "--edge-features", "3", "--out", str(out), "--quiet", "--tiles", "2",
                   *(["--features", "4", "--classes", "3"] if fmt == "rmat" else [])])
        assert rc == 0
        with PreparedGraph(out) as pg:
            adj, ef = pg.read_adjacency_edges("A2")
            assert pg.FE == 3 and ef.shape == (adj.nnz, 3) and np.isfinite(ef).all()
        assert verify(out)["ok"]
    with PreparedGraph(tmp_path / "sbm") as pg:  # column 0: inside a community, summed
        adj, ef = pg.read_adjacency_edges("A1")  # over duplicates: whole numbers, both seen
        assert np.array_equal(ef[:, 0], np.round(ef[:, 0])) and ef[:, 0].min() == 0
        assert ef[:, 0].max() >= 1
    capsys.readouterr()
    snap = tmp_path / "g.txt"
    snap.write_text("0\t1\n1\t2\n")
    assert main(["prep", "--format", "snap", "--input", str(snap), "--edge-features", "2",
                 "--out", str(tmp_path / "x")]) == 2
    assert "--edge-features generates edge features for the generators" in \
        capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_sparse_features_are_stored_as_csr_and_read_back_exactly(tmp_path):
    """Bag-of-words features (auto: density below 10%) become CSR feature tiles: every row and
    column range reads back as the dense prep's, verify checks them and names a damaged one,
    and the planner sees their density."""
    from plexgt.data.graph import GraphData
    from plexgt.data.prepared import FEATURES_INDICES, feature_file
    from plexgt.tasks.task import graph_sizes
    from tests.datagen import sparsified

    g = sparsified(small_graph(61, 300, f=40), density=0.05)
    g = GraphData("bow", 61, g.src, g.dst, g.features, g.labels)
    opts = dict(tiles=3, progress=False, feature_block_bytes=600)
    m = prepare(MemorySource(g), PrepOptions(out=tmp_path / "csr", **opts))
    d = prepare(MemorySource(g), PrepOptions(out=tmp_path / "dense", sparse_features="no",
                                             **opts))
    assert (m["feature_layout"], d["feature_layout"]) == ("csr", "dense")
    assert m["feature_nnz"] == d["feature_nnz"] == np.count_nonzero(g.features)
    assert m["num_feature_blocks"] > 2
    with PreparedGraph(tmp_path / "csr") as a, PreparedGraph(tmp_path / "dense") as b:
        assert a.sparse_features and not b.sparse_features
        for rows, cols in (((0, 61), (0, 40)), ((7, 33), (5, 29)), ((12, 12), (0, 40))):
            np.testing.assert_array_equal(a.read_features(rows, cols), b.read_features(rows, cols))
            np.testing.assert_array_equal(a.read_features_csr(rows, cols).toarray(),
                                          b.read_features(rows, cols))
        assert graph_sizes(a).feature_density == pytest.approx(0.05, abs=0.02)
        assert graph_sizes(b).feature_density is None
    assert verify(tmp_path / "csr")["ok"]
    with h5py.File(tmp_path / "csr" / feature_file(1), "r+") as f:
        idx = f[FEATURES_INDICES][()]
        del f[FEATURES_INDICES]
        idx[0] = 40
        f.create_dataset(FEATURES_INDICES, data=idx)
    rep = verify(tmp_path / "csr", checksums=False)
    assert not rep["ok"] and any("column index is outside [0, F=40)" in p
                                 for p in rep["problems"])
    with PreparedGraph(tmp_path / "csr") as a, pytest.raises(DataError, match="outside"):
        a.read_features_csr()


def test_block_counts_are_the_stored_patterns(prepared):
    """The manifest's block_nnz (what the planner prices a partition's busiest block by) is
    each stored matrix's nonzeros per cell: N = 37 < 64, so one node a cell, the pattern
    itself; the cells summed over T = 4 tile rows whose edges never align with them."""
    _, _, m, a1, a2 = prepared
    for name, a in (("A1", a1), ("A2", a2)):
        want = a.tocsr().copy()
        want.data[:] = 1
        np.testing.assert_array_equal(np.array(m["block_nnz"][name]), want.toarray())
