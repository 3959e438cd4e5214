"""Streaming text sources (SNAP, MatrixMarket, OGB csv.gz): block splitting, parts, equality with
the in-memory readers, errors found while streaming, and bounded prep memory."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import plexgt.data.textio as textio
from plexgt.cli import main
from plexgt.data.formats.mtx import MtxSource, read_mtx
from plexgt.data.formats.ogb import OgbCsvSource, open_ogb, read_ogb
from plexgt.data.formats.snap import SnapSource, read_snap
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.textio import iter_blocks
from plexgt.errors import DataError
from tests.datagen import small_graph, write_mtx, write_ogb_csv, write_snap

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Parse blocks of a few bytes: most lines are split across reads, many blocks per file."""
    monkeypatch.setattr(textio, "MIN_BLOCK_BYTES", 7)
    monkeypatch.setattr(textio, "BLOCK_BYTES", 7)


def _write(path, data: bytes):
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def _edges(source, nparts, chunk):
    """Every part's chunks: (src, dst) concatenated, checking the chunk size bound."""
    s, d = [], []
    for p in range(nparts):
        for a, b in source.edge_chunks(p, nparts, chunk):
            assert 0 < a.size <= chunk and a.shape == b.shape
            assert a.dtype == np.int64 and b.dtype == np.int64
            s.append(a)
            d.append(b)
    return np.concatenate(s), np.concatenate(d)


def _pairs(src, dst):
    return sorted(zip(src.tolist(), dst.tolist()))


# -- textio: splitting lines over blocks and parts ----------------------------------------------


def _text_lines(rng, k):
    lines = []
    for i in range(k):
        r = rng.random()
        if r < 0.05:
            lines.append(b"")
        elif r < 0.1:
            lines.append(b"# comment " + b"x" * int(rng.integers(0, 30)))
        else:
            lines.append(b"%d %d" % (i, int(rng.integers(0, 10**int(rng.integers(1, 12))))))
    return lines


@pytest.mark.parametrize("name", ["t.txt", "t.txt.gz"])
@pytest.mark.parametrize("final_newline", [True, False])
def test_every_line_once_over_parts_and_blocks(tmp_path, name, final_newline):
    rng = np.random.default_rng(0)
    lines = _text_lines(rng, 400)
    data = b"\n".join(lines) + (b"\n" if final_newline else b"")
    path = _write(tmp_path / name, data)
    want = [(k + 1, ln) for k, ln in enumerate(lines) if ln.strip()]
    for nparts in (1, 2, 3, 7):
        for block in (1, 5, 64, 1 << 20):
            got = []
            for p in range(nparts):
                for blk in iter_blocks(path, p, nparts, block_bytes=block):
                    assert blk.data.endswith(b"\n")
                    first = blk.first_line()  # counted lazily for byte ranges of plain files
                    assert data[blk.offset :].startswith(blk.data[:-1])
                    got += [(first + k, ln) for k, ln in enumerate(blk.data[:-1].split(b"\n"))
                            if ln.strip()]
            assert sorted(got) == want, (nparts, block)


def test_plain_files_split_by_byte_range_gzip_by_block(tmp_path):
    data = b"".join(b"%d 1\n" % i for i in range(1000))
    plain, gz = _write(tmp_path / "a.txt", data), _write(tmp_path / "a.txt.gz", data)
    first = list(iter_blocks(plain, 1, 2, block_bytes=100))
    assert first[0].line == 0 and first[0].offset >= len(data) // 2  # seeks, line not counted
    assert first[0].first_line() == data[: first[0].offset].count(b"\n") + 1
    seq = list(iter_blocks(gz, 1, 2, block_bytes=100))
    assert seq[0].line > 0 and all(b.mine for b in seq)  # every 2nd block, lines counted
    both = list(iter_blocks(gz, 1, 2, block_bytes=100, others=True))
    assert len(both) == 2 * len(seq) or len(both) == 2 * len(seq) + 1
    assert [b.mine for b in both][:4] == [False, True, False, True]


# -- SNAP ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["g.txt", "g.txt.gz"])
def test_snap_source_equals_reader(tmp_path, name, tiny_blocks):
    g = small_graph(300, 2000)
    path = write_snap(tmp_path / name, g)
    ref = read_snap(path)
    np.testing.assert_array_equal(ref.src, g.src)
    for nodes in (None, 300):
        s = SnapSource(path, nodes, chunk_edges=3)
        assert s.num_nodes == 300 and s.num_edges_hint() == 2000
        src, dst = _edges(s, 1, 13)
        np.testing.assert_array_equal(src, g.src)  # one part: file order
        np.testing.assert_array_equal(dst, g.dst)
        for nparts in (2, 3, 5):
            src, dst = _edges(s, nparts, 13)
            assert _pairs(src, dst) == _pairs(g.src, g.dst)
            assert s.edge_pass_stats()[0] > 0


def test_snap_counting_pass_finds_n(tmp_path):
    p = tmp_path / "g.txt"
    p.write_text("# c\n0 5\n2 3\n\n3 1")
    s = SnapSource(p)
    assert (s.num_nodes, s.counted, s.num_edges_hint()) == (6, 3, 3)
    assert SnapSource(p, 10).num_nodes == 10
    p.write_text("# Nodes: 9 Edges: 2\n0 5\n2 3\n")
    assert SnapSource(p).num_nodes == 9  # isolated nodes counted by the header
    assert read_snap(p).num_nodes == 9


def test_snap_edge_hint_without_header_is_estimated(tmp_path):
    g = small_graph(1000, 200_000)
    for name in ("g.txt", "g.txt.gz"):
        p = write_snap(tmp_path / name, g, header=False)
        hint = SnapSource(p, 1000).num_edges_hint()  # no counting pass: sampled
        assert 0.5 * 200_000 < hint < 2 * 200_000, (name, hint)


def _split_totals(source, nparts: int, chunk: int) -> np.ndarray:
    """The pass statistics of reading ``source``'s edges in ``nparts`` parts, summed."""
    totals = np.zeros(1, dtype=np.int64)
    for part in range(nparts):
        list(source.edge_chunks(part, nparts, chunk))
        totals += source.edge_pass_stats()
    return totals


def _part_errors(source, nparts: int) -> list[str]:
    """The DataError messages of reading every part of ``source``'s edges."""
    errs = []
    for part in range(nparts):
        try:
            list(source.edge_chunks(part, nparts, 16))
        except DataError as e:
            errs.append(str(e))
    return errs


@pytest.mark.parametrize("name", ["g.txt", "g.txt.gz"])
def test_snap_errors_name_the_line_in_any_part(tmp_path, name, tiny_blocks):
    lines = [b"%d %d" % (i % 50, (i * 7) % 50) for i in range(600)]
    for bad, msg in ((b"3 x", "line 431: non-numeric field 'x'"),
                     (b"3 -4", "negative node id -4 (line 431)"),
                     (b"3 60", "node id 60 is outside [0, 50) (line 431)"),
                     (b"3 4 5", "line 431: expected 2 fields, found 3")):
        data = b"\n".join(lines[:430] + [bad] + lines[431:]) + b"\n"
        p = _write(tmp_path / name, data)
        s = SnapSource(p, 50)
        for nparts in (1, 3):
            errs = _part_errors(s, nparts)
            assert len(errs) == 1 and errs[0] == f"{p}: {msg}", errs
        if b"60" not in bad:  # the counting pass finds the others too
            with pytest.raises(DataError, match=msg.replace("(", r"\(").replace(")", r"\)")):
                SnapSource(p)


def test_snap_claimed_count_checked_across_parts(tmp_path):
    p = tmp_path / "g.txt"
    p.write_text("# Nodes: 5 Edges: 4\n" + "".join(f"{i} {i + 1}\n" for i in range(3)))
    s = SnapSource(p, 5)
    with pytest.raises(DataError, match="header claims 4 edges but the file holds 3"):
        list(s.edge_chunks(0, 1, 10))
    totals = _split_totals(s, 2, 10)  # a split pass: no part can tell, the sum can
    assert totals[0] == 3
    with pytest.raises(DataError, match="header claims 4 edges but the file holds 3"):
        s.check_edge_pass(totals)
    p.write_text("# nothing\n")
    with pytest.raises(DataError, match="empty graph"):
        SnapSource(p, 5).check_edge_pass(np.zeros(1, dtype=np.int64))


# -- MatrixMarket -------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["pattern", "real"])
@pytest.mark.parametrize("gz", [False, True])
def test_mtx_source_equals_reader(tmp_path, field, gz, tiny_blocks):
    g = small_graph(200, 900)
    p = write_mtx(tmp_path / "g.mtx", g, field)
    if gz:
        p = _write(tmp_path / "g.mtx.gz", p.read_bytes())
    r = read_mtx(p)
    np.testing.assert_array_equal(r.src, g.src)
    np.testing.assert_array_equal(r.dst, g.dst)
    s = MtxSource(p)
    assert s.num_nodes == 200 and s.num_edges_hint() == 900
    src, dst = _edges(s, 1, 11)
    np.testing.assert_array_equal(src, g.src)
    for nparts in (2, 4):
        assert _pairs(*_edges(s, nparts, 11)) == _pairs(g.src, g.dst)


def test_mtx_symmetric_streamed_with_mirrors(tmp_path, tiny_blocks):
    rng = np.random.default_rng(3)
    i, j = rng.integers(1, 40, 300), rng.integers(1, 40, 300)
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    body = "".join(f"{b} {a}\n" for a, b in zip(lo, hi))
    p = tmp_path / "s.mtx"
    p.write_text(f"%%MatrixMarket matrix coordinate pattern symmetric\n% c\n40 40 300\n{body}")
    r = read_mtx(p)
    s = MtxSource(p)
    assert s.num_edges_hint() == 600
    for nparts in (1, 3):
        assert _pairs(*_edges(s, nparts, 7)) == _pairs(r.src, r.dst)
    assert len(r.src) == 300 + int(np.sum(lo != hi))


def test_mtx_errors_name_the_line(tmp_path, tiny_blocks):
    head = "%%MatrixMarket matrix coordinate real general\n% c\n% c\n50 50 300\n"
    rows = [f"{k % 50 + 1} {(3 * k) % 50 + 1} 1.5" for k in range(300)]
    for bad, msg in (("7 99 1", "index 99 is outside [1, 50] (line 205)"),
                     ("7 x 1", "line 205: non-numeric field 'x'"),
                     ("7 2.5 1", "line 205: non-integer row/column index")):
        p = tmp_path / "m.mtx"
        p.write_text(head + "\n".join(rows[:200] + [bad] + rows[201:]) + "\n")
        s = MtxSource(p)
        for nparts in (1, 4):
            errs = _part_errors(s, nparts)
            assert errs == [f"{p}: {msg}"]
    p.write_text(head + "\n".join(rows[:250]) + "\n")
    s = MtxSource(p)
    totals = _split_totals(s, 2, 16)
    with pytest.raises(DataError, match="header claims 300 entries but the file holds 250"):
        s.check_edge_pass(totals)


# -- OGB csv.gz ---------------------------------------------------------------------------------


def test_ogb_csv_source_streams_edges_and_features(tmp_path, tiny_blocks):
    g = small_graph(97, 700, f=4)
    root = write_ogb_csv(tmp_path / "ogb", g)
    r = read_ogb(root)
    np.testing.assert_array_equal(r.src, g.src)
    np.testing.assert_allclose(r.features, g.features, rtol=1e-6)
    s = open_ogb(root)
    assert isinstance(s, OgbCsvSource) and not s.random_access_features
    assert (s.num_nodes, s.num_features, s.num_edges_hint()) == (97, 4, 700)
    np.testing.assert_array_equal(s.labels(), g.labels)
    src, dst = _edges(s, 1, 9)
    np.testing.assert_array_equal(src, g.src)
    np.testing.assert_array_equal(dst, g.dst)
    for nparts in (1, 2, 3):
        assert _pairs(*_edges(s, nparts, 9)) == _pairs(g.src, g.dst)
        rows = np.full((97, 4), np.nan, dtype=np.float32)
        seen = np.zeros(97, dtype=int)
        for part in range(nparts):
            for row, x in s.feature_chunks(part, nparts, 5):
                assert x.dtype == np.float32 and 0 < x.shape[0] <= 5
                rows[row : row + x.shape[0]] = x
                seen[row : row + x.shape[0]] += 1
        assert (seen == 1).all()
        np.testing.assert_array_equal(rows, r.features)


def test_ogb_csv_feature_rows_one_per_line(tmp_path):
    g = small_graph(20, 50, f=3)
    root = write_ogb_csv(tmp_path / "ogb", g)
    p = root / "raw" / "node-feat.csv.gz"
    lines = gzip.decompress(p.read_bytes()).split(b"\n")
    _write(p, b"\n".join(lines[:7] + [b""] + lines[7:]) + b"\n\n")  # empty lines: skipped
    np.testing.assert_allclose(read_ogb(root).features, g.features, rtol=1e-6)
    _write(p, b"\n".join(lines[:7] + [b"# note"] + lines[7:]))
    with pytest.raises(DataError, match="line 8: comment or blank line"):
        read_ogb(root)


# -- prep from the streaming sources ------------------------------------------------------------


def test_prep_streamed_equals_prep_in_memory(tmp_path):
    g = small_graph(150, 1200, f=3)
    cases = [
        (SnapSource(write_snap(tmp_path / "g.txt.gz", g)), read_snap(tmp_path / "g.txt.gz")),
        (MtxSource(write_mtx(tmp_path / "g.mtx", g)), read_mtx(tmp_path / "g.mtx")),
        (OgbCsvSource(write_ogb_csv(tmp_path / "ogb", g)), read_ogb(tmp_path / "ogb")),
    ]
    for k, (streamed, mem) in enumerate(cases):
        kw = {"tiles": 3, "progress": False, "symmetrize": True}
        a = prepare(streamed, PrepOptions(out=tmp_path / f"s{k}", chunk_edges=37, **kw))
        b = prepare(MemorySource(mem), PrepOptions(out=tmp_path / f"m{k}", **kw))
        assert a["files"] == b["files"] and a["E"] == b["E"]


def test_snap_degree_permutation_reuses_the_counting_pass(tmp_path, monkeypatch):
    """Without --nodes, SNAP is parsed to count; with --permutation degree that pass counts
    the degrees too, so prep parses the file twice, not three times, for the same output."""
    import plexgt.data.formats.snap as snap

    g = small_graph(150, 1200)
    g.src[:40] = 149  # a heavy node: the degree order is not the id order
    path = write_snap(tmp_path / "g.txt", g, header=False)
    passes = []
    real = snap._edge_blocks

    def counted(path, part, nparts, block_bytes, n):  # noqa: ANN001, ANN202
        passes.append(n)
        yield from real(path, part, nparts, block_bytes, n)

    monkeypatch.setattr(snap, "_edge_blocks", counted)
    kw = {"tiles": 3, "progress": False, "permutation": "degree", "symmetrize": True}
    src = SnapSource(path, count_degrees=True)
    reused = prepare(src, PrepOptions(out=tmp_path / "a", **kw))
    with_reuse = len(passes)
    passes.clear()
    own = prepare(SnapSource(path), PrepOptions(out=tmp_path / "b", **kw))
    assert reused["files"] == own["files"] and reused["E"] == own["E"]
    assert with_reuse == len(passes) - 1 == 2  # counting + bucketing; the degree pass saved
    assert src.counted_degrees(0, 1) is None  # handed over once, then freed
    # the command asks for it with --permutation degree
    passes.clear()
    assert main(["prep", "--format", "snap", "--input", str(path), "--out",
                 str(tmp_path / "c"), "--tiles", "3", "--permutation", "degree", "--quiet",
                 "--symmetrize"]) == 0
    assert len(passes) == 2
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["files"] == own["files"]


GEN = textwrap.dedent("""
    import sys
    import numpy as np

    path, e, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(0)
    pw = 10 ** np.arange(5, -1, -1)
    with open(path, "wb") as f:
        f.write(b"# generated\\n")
        for lo in range(0, e, 1 << 18):
            ids = rng.integers(0, n, (min(1 << 18, e - lo), 2))
            rows = np.empty((ids.shape[0], 14), dtype=np.uint8)
            rows[:, 0:6] = ids[:, 0, None] // pw % 10 + 48
            rows[:, 6] = 9
            rows[:, 7:13] = ids[:, 1, None] // pw % 10 + 48
            rows[:, 13] = 10
            f.write(rows.tobytes())
""")

PREP = textwrap.dedent("""
    import json, resource, sys
    from plexgt.cli import main

    small, big, out = sys.argv[1:4]
    argv = ["prep", "--format", "snap", "--quiet", "--chunk-edges", "32768", "--tiles", "8",
            "--permutation", "random"]  # the streamed path (balanced holds every edge)
    # warm up on a small file with the same N: imports, node arrays, allocator pools
    assert main([*argv, "--input", small, "--out", out + "-small"]) == 0
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert main([*argv, "--input", big, "--out", out]) == 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"base_kb": base, "peak_kb": peak}))
""")


def test_prep_of_a_large_snap_file_has_bounded_memory(tmp_path):
    """2M edges (28 MB of text; the parsed edge list alone would be 32 MB, the in-memory reader
    peaks at ~2x that): prep, counting pass included, grows the peak RSS by far less than one
    edge array once the N-sized arrays exist (measured: ~1 MB)."""
    n, e = 100_000, 2_000_000
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    for path, k in ((small, 5000), (big, e)):
        subprocess.run([sys.executable, "-c", GEN, str(path), str(k), str(n)], check=True)
    res = subprocess.run([sys.executable, "-c", PREP, str(small), str(big), str(tmp_path / "o")],
                         check=True, capture_output=True, text=True,
                         env={**os.environ, "PLEXGT_NO_MPI": "1"})
    m = json.loads(res.stdout.strip().splitlines()[-1])
    grew_mb = (m["peak_kb"] - m["base_kb"]) / 1024
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["E"] > 0.99 * e and manifest["N"] <= n
    assert grew_mb < 16, f"prep peak RSS grew by {grew_mb:.0f} MB over the warm-up run"
