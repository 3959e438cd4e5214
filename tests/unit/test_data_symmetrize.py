"""--symmetrize auto: prep counts the edges whose reverse is present and adds the reverse edges
when (almost) none are; the count is exact up to SAMPLE_EDGES, a canonical-pair sample above."""

from __future__ import annotations

import json

import numpy as np
import pytest

from plexgt.cli import main
from plexgt.data import reciprocity as rc
from plexgt.data.loader import PreparedGraph
from plexgt.data.permute import reference_matrices
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.verify import verify
from plexgt.errors import DataError
from tests.datagen import one_sided, with_reverse

pytestmark = pytest.mark.timeout(120)


def test_count_is_over_distinct_non_loop_edges():
    src = np.array([0, 1, 0, 2, 3, 3, 4])  # 0->1, 1->0 (a pair), 0->1 again, 2->3, 3->3 loop,
    dst = np.array([1, 0, 1, 3, 3, 3, 2])  # 3->3 again, 4->2
    assert rc.count_reciprocal(src, dst, 5) == (2, 4)  # {0->1, 1->0} of {0->1, 1->0, 2->3, 4->2}
    assert rc.count_reciprocal(np.array([1]), np.array([1]), 2) == (0, 0)  # only a loop


def test_pair_hash_is_the_same_both_ways_and_spread():
    rng = np.random.default_rng(1)
    s, d = rng.integers(0, 1 << 40, (2, 100_000))
    h = rc.pair_hash(s, d)
    assert np.array_equal(h, rc.pair_hash(d, s))
    assert abs(np.mean(h < np.uint64(1 << 62)) - 0.25) < 0.01  # a quarter below 2^62


def test_a_sample_estimates_the_share_and_keeps_pairs_together(monkeypatch):
    """Beyond SAMPLE_EDGES the sample keeps an edge and its reverse together, so its share is
    the graph's; a hint far too low narrows the threshold rather than growing the sample."""
    monkeypatch.setattr(rc, "SAMPLE_EDGES", 4000)
    g = with_reverse(one_sided(20_000, 40_000, seed=3), 0.3)  # 12,000 of 52,000 edges: 23%
    both, total = rc.count_reciprocal(g.src, g.dst, g.num_nodes)
    for hint in (g.num_edges, 1000):  # right, and 52x too low
        sample = rc.ReverseSample(hint, 1)
        for lo in range(0, g.num_edges, 5000):
            sample.add(g.src[lo:lo + 5000], g.dst[lo:lo + 5000])
        s, d = sample.edges()
        assert s.size <= 2 * 4000 and sample.seen == g.num_edges
        info = rc.reciprocity(s, d, g.num_nodes, False, sample.seen)
        assert info["fraction"] == pytest.approx(both / total, abs=0.05)
        assert info["counted"] > 500


@pytest.mark.parametrize("permutation", ["random", "balanced"])
def test_auto_symmetrizes_a_one_sided_list_and_keeps_a_directed_one(tmp_path, permutation):
    """Both decision points (the routing pass's sample, balanced's exact pass on rank 0)."""
    g = one_sided()
    kw = dict(tiles=3, progress=False, permutation=permutation)
    m = prepare(MemorySource(g), PrepOptions(out=tmp_path / "a", symmetrize="auto", **kw))
    assert m["symmetrized"] and m["params"]["symmetrized"] == "auto"
    r = m["reciprocity"]
    assert (r["fraction"], r["counted"], r["exact"], r["asked"]) == (0.0, 240, True, "auto")
    with PreparedGraph(tmp_path / "a") as pg:
        p, q = pg.read_perm("P"), pg.read_perm("Q")
        for which, (rows, cols) in (("A1", (p, q)), ("A2", (q, p))):
            a = pg.read_adjacency(which).tocoo()
            got = set(zip(cols[a.col].tolist(), rows[a.row].tolist()))  # (src, dst)
            want = {*zip(g.src.tolist(), g.dst.tolist()), *zip(g.dst.tolist(), g.src.tolist()),
                    *((i, i) for i in range(g.num_nodes))}
            assert got == want
    assert verify(tmp_path / "a")["ok"]
    yes = prepare(MemorySource(g), PrepOptions(out=tmp_path / "y", symmetrize="yes", **kw))
    assert yes["files"] == m["files"] and yes["reciprocity"]["asked"] is True
    d = with_reverse(g, 0.5)  # a third of the distinct edges have their reverse: directed
    m2 = prepare(MemorySource(d), PrepOptions(out=tmp_path / "d", symmetrize="auto", **kw))
    assert not m2["symmetrized"]
    assert m2["reciprocity"]["fraction"] == pytest.approx(240 / 360)
    no = prepare(MemorySource(d), PrepOptions(out=tmp_path / "n", **kw))  # the API's default
    assert no["files"] == m2["files"] and no["params"]["symmetrized"] is False


def test_symmetrized_at_build_equals_the_in_memory_reference(tmp_path):
    """The reverse edges come from the other matrix's tiles, transposed, at build time: every
    tile equals P (A + A^T) Q^T with self loops, duplicates and all, on many small chunks."""
    from tests.datagen import small_graph

    g = small_graph(41, 300, f=2)
    m = prepare(MemorySource(g), PrepOptions(out=tmp_path / "o", tiles=4, symmetrize=True,
                                             chunk_edges=7, flush_items=11, progress=False))
    a1, a2 = reference_matrices(g, 0, True, True)
    assert m["E"] == a1.nnz
    with PreparedGraph(tmp_path / "o") as pg:
        assert (pg.read_adjacency("A1") != a1).nnz == 0
        assert (pg.read_adjacency("A2") != a2).nnz == 0


def test_a_sampled_count_is_recorded_as_such(tmp_path, monkeypatch):
    monkeypatch.setattr(rc, "SAMPLE_EDGES", 300)
    g = one_sided(3000, 6000, seed=2)
    m = prepare(MemorySource(g), PrepOptions(out=tmp_path / "o", symmetrize="auto", tiles=2,
                                             permutation="random", progress=False))
    r = m["reciprocity"]
    assert m["symmetrized"] and r["fraction"] == 0.0 and not r["exact"]
    assert 100 < r["counted"] < 1200 and r["edges_seen"] == 6000


def test_resume_keeps_the_decision_of_the_interrupted_run(tmp_path):
    """The decision is recorded with the buckets: a resumed run that skips the bucketing pass
    still symmetrizes (and the manifest says why)."""
    g = one_sided()
    kw = dict(tiles=3, progress=False, permutation="random", symmetrize="auto")
    with pytest.raises(RuntimeError, match="simulated interruption"):
        prepare(MemorySource(g), PrepOptions(out=tmp_path / "o", **kw), fail_after=1)
    marker = json.loads((tmp_path / "o" / ".staging" / "bucketed.json").read_text())
    assert marker["reciprocity"]["fraction"] == 0.0
    m = prepare(MemorySource(g), PrepOptions(out=tmp_path / "o", resume=True, **kw))
    ref = prepare(MemorySource(g), PrepOptions(out=tmp_path / "r", **kw))
    assert m["symmetrized"] and m["files"] == ref["files"]
    assert m["reciprocity"] == ref["reciprocity"]


def test_cli_default_is_auto_and_the_summary_says_what_it_did(tmp_path, capsys):
    """A one-sided edge list: the default symmetrizes and says so (before, it was silently
    kept one-sided); --no-symmetrize and --symmetrize no keep it; --symmetrize alone is yes."""
    g = one_sided()
    edges = tmp_path / "e.csv"
    edges.write_text("id_1,id_2\n" + "".join(f"{s},{d}\n" for s, d in zip(g.src, g.dst)))
    base = ["prep", "--input", str(edges), "--quiet", "--tiles", "2"]
    assert main([*base, "--out", str(tmp_path / "auto")]) == 0
    err = capsys.readouterr().err
    assert "symmetrized=yes (auto: 0.0% of edges have their reverse)" in err
    expected = {"auto": True, "no": False, "no2": False, "yes": True}
    for name, flags in (("no", ["--no-symmetrize"]), ("no2", ["--symmetrize", "no"]),
                        ("yes", ["--symmetrize"])):
        assert main([*base, *flags, "--out", str(tmp_path / name)]) == 0
        line = capsys.readouterr().err
        assert f"symmetrized={'yes' if expected[name] else 'no'} (0.0% of edges" in line
    for name, sym in expected.items():
        m = json.loads((tmp_path / name / "manifest.json").read_text())
        assert m["symmetrized"] is sym
        assert m["E"] == (2 * 240 if sym else 240) + 60
    with pytest.raises(SystemExit):
        main([*base, "--symmetrize", "maybe", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        main([*base, "--symmetrize", "--no-symmetrize", "--out", str(tmp_path / "x")])
    with pytest.raises(DataError, match="--symmetrize maybe: expected auto|yes|no"):
        prepare(MemorySource(g), PrepOptions(out=tmp_path / "x", symmetrize="maybe"))
    assert not (tmp_path / "x").exists()
