"""Inconsistent data with valid checksums is refused where a rank reads it, as verify refuses it.

Each case rewrites one dataset with h5py (so its Fletcher-32 checksums are valid) and updates
the manifest's sha256 and size (so the file checks pass): only the content is wrong. The
reader must raise the one-line DataError that verify reports, naming the file and the tile or
dataset, and ``plexgt train`` must exit 2 on it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from plexgt.data.loader import (
    PreparedGraph,
    read_adjacency_q,
    read_adjacency_q_edges,
    read_feature_block,
    read_rank_blocks,
    read_row_block,
    read_targets,
)
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.verify import verify
from plexgt.distributed.grid import Grid3D
from plexgt.errors import DataError
from plexgt.util.files import sha256_file
from tests.datagen import small_graph

pytestmark = pytest.mark.timeout(300)

N = 2600  # tiles=2: 1300 rows a tile, so a tile holds three anchors (rows 0, 1024 and its end)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    g = small_graph(N, 16000, f=4, c=3, seed=3)
    g.edge_attr = np.random.default_rng(3).standard_normal((16000, 2)).astype(np.float32)
    out = tmp_path_factory.mktemp("read_checks") / "good"
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False))
    return out


def rewrite(root: Path, rel: str, name: str, values: np.ndarray) -> None:
    """Replace dataset ``name`` of ``root/rel`` by ``values`` (checksummed as prep stores it)
    and record the file's new sha256 and size in the manifest: only the content is wrong."""
    with h5py.File(root / rel, "r+") as f:
        ds = f[name]
        if ds.shape == values.shape and ds.dtype == values.dtype:
            ds[...] = values
        else:
            fletcher32 = ds.fletcher32
            del f[name]
            f.create_dataset(name, data=values, chunks=True if values.size else None,
                             fletcher32=fletcher32 and bool(values.size))
    mpath = root / "manifest.json"
    m = json.loads(mpath.read_text())
    m["files"][rel] = {"bytes": (root / rel).stat().st_size, "sha256": sha256_file(root / rel)}
    mpath.write_text(json.dumps(m, indent=1))


def _read(root: Path, rel: str, name: str) -> np.ndarray:
    with h5py.File(root / rel, "r") as f:
        return f[name][()]


TILE = "A2/rows_00000.h5"  # the attention path reads A2 rows; the GCN reads A1 and A2


def label_at_c(root: Path) -> None:
    for ds in ("labels_P", "labels_Q"):  # the same node in both orders: only the range is wrong
        lab = _read(root, "nodes.h5", ds)
        lab[lab == 0] = 3
        rewrite(root, "nodes.h5", ds, lab)


def index_out_of_block(root: Path) -> None:
    cnt = _read(root, TILE, "t00001/counts").astype(np.int64)
    ind = _read(root, TILE, "t00001/indices")
    ind[int(cnt[:10].sum()) + int(cnt[10]) - 1] = 99_999_999  # a row's last: still ascending
    rewrite(root, TILE, "t00001/indices", ind)


def counts_past_indices(root: Path) -> None:
    """The last row counts 5 more entries than the indices hold; the last anchor follows the
    counts, so only the counts against the indices are wrong."""
    cnt = _read(root, TILE, "t00000/counts")
    cnt[-1] += 5
    rewrite(root, TILE, "t00000/counts", cnt)
    anc = _read(root, TILE, "t00000/anchors")
    anc[-1] += 5
    rewrite(root, TILE, "t00000/anchors", anc)


def anchor_wrong(root: Path) -> None:
    anc = _read(root, TILE, "t00000/anchors")
    assert anc.shape == (3,)
    anc[1] += 1
    rewrite(root, TILE, "t00000/anchors", anc)


def edge_features_short(root: Path) -> None:
    ef = _read(root, TILE, "t00000/edge_feat")
    rewrite(root, TILE, "t00000/edge_feat", ef[:-1])


def mask_overlap(root: Path) -> None:
    for o in ("P", "Q"):  # a valid node made train too, in both orders
        tr, va = _read(root, "nodes.h5", f"mask_train_{o}"), _read(root, "nodes.h5",
                                                                   f"mask_valid_{o}")
        tr |= va
        rewrite(root, "nodes.h5", f"mask_train_{o}", tr)
    m = json.loads((root / "manifest.json").read_text())
    m["splits"]["train"] = int(tr.sum())
    (root / "manifest.json").write_text(json.dumps(m, indent=1))


def degree_zero(root: Path) -> None:
    deg = _read(root, "nodes.h5", "deg_P")
    deg[5] = 0
    rewrite(root, "nodes.h5", "deg_P", deg)


def feature_nan(root: Path) -> None:
    x = _read(root, "features/rows_00000.h5", "x")
    x[7, 2] = np.nan
    rewrite(root, "features/rows_00000.h5", "x", x)


CASES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    # name: (corruption, file, what the error says)
    "label_at_C": (label_at_c, "nodes.h5", r"\[labels_[PQ]\]: label 3 outside \[-1, C=3\)"),
    "index_out_of_block": (index_out_of_block, TILE,
                           r"\[t00001\]: column index 99999999 outside \[0, 1300\)"),
    "counts_past_indices": (counts_past_indices, TILE,
                            r"\[t00000\]: row counts end at index \d+, but the tile holds \d+"),
    "anchor_wrong": (anchor_wrong, TILE, r"\[t00000\]: anchors disagree with the row counts"),
    "edge_features_short": (edge_features_short, TILE,
                            r"\[t00000\]: edge features \(\d+, 2\) are not \d+ rows of FE=2"),
    "mask_overlap": (mask_overlap, "nodes.h5", r": split valid overlaps an earlier split"),
    "degree_zero": (degree_zero, "nodes.h5",
                    r"\[deg_P\]: degrees disagree with the tiles' row counts"),
    "feature_nan": (feature_nan, "features/rows_00000.h5",
                    r"\[x\]: non-finite value in row 7"),
}


@pytest.fixture(params=list(CASES))
def bad(request, good, tmp_path) -> tuple[Path, str, str, str]:
    corrupt, rel, msg = CASES[request.param]
    root = tmp_path / "bad"
    shutil.copytree(good, root)
    corrupt(root)
    return root, rel, msg, request.param


def _read_all(root: Path) -> None:
    """What one rank of ``plexgt train`` reads: gt's rows (with edge features) and targets,
    the GCN's blocks of both matrices."""
    with PreparedGraph(root) as pg:
        read_adjacency_q_edges(pg)
        read_row_block(pg, 0, 1)
        read_targets(pg, (0, N), "P", N)
        read_feature_block(pg, (0, N), (0, pg.F), (N, pg.F))
        read_rank_blocks(pg, Grid3D(1, 1, 1), 0, 2)


def test_the_reader_refuses_what_verify_refuses_in_one_line(bad):
    root, rel, msg, _ = bad
    problems = verify(root)["problems"]
    with pytest.raises(DataError) as e:
        _read_all(root)
    text = str(e.value)
    assert "\n" not in text and text.startswith(str(root / rel)), text
    assert re.search(msg, text), text
    assert text in problems, (text, problems)  # one definition: verify says the same


def test_a_partial_read_checks_the_anchors_it_reads(good, tmp_path):
    """A rank whose rows start past anchor 1 reads anchors 1 and 2 and finds them wrong; one
    whose rows end before row 1024 reads anchors 0 and 1 and finds them wrong too."""
    root = tmp_path / "bad"
    shutil.copytree(good, root)
    anchor_wrong(root)
    with PreparedGraph(root) as pg:
        for rows in ((1100, 1200), (10, 20), (1000, 1100)):
            with pytest.raises(DataError, match="anchors disagree|row counts end at"):
                pg.read_adjacency("A2", rows, None)
        pg.read_adjacency("A2", (1300, 1400), None)  # the other tile is sound


def test_valid_data_reads_the_same_in_every_window(good):
    """The checks refuse nothing valid: row windows on both sides of the anchors read the rows
    of the whole matrix, columns cut anywhere."""
    with PreparedGraph(good) as pg:
        full = pg.read_adjacency("A1")
        for rows, cols in (((0, N), (0, N)), ((1023, 1025), (0, N)), ((5, 1299), (17, 2222)),
                           ((1024, 2048), (1299, 1301)), ((2047, 2600), (0, 1)),
                           ((0, 1), (0, N))):
            got = pg.read_adjacency("A1", rows, cols)
            want = full[rows[0]:rows[1], cols[0]:cols[1]]
            assert (got != want).nnz == 0 and got.shape == want.shape
        assert read_adjacency_q(pg).nnz == pg.E
    assert verify(good)["ok"]


def test_multilabel_labels_hold_minus_one_zero_or_one(tmp_path):
    g = small_graph(200, 800, c=3, seed=4)
    g.labels = np.random.default_rng(4).integers(-1, 2, (200, 3)).astype(np.int8)
    root = tmp_path / "ml"
    prepare(MemorySource(g), PrepOptions(out=root, tiles=2, progress=False))
    with PreparedGraph(root) as pg:
        assert pg.multilabel and read_targets(pg, (0, 200), "Q", 200).labels.shape == (200, 3)
    lab = _read(root, "nodes.h5", "labels_Q")
    lab[3, 1] = 2
    rewrite(root, "nodes.h5", "labels_Q", lab)
    with PreparedGraph(root) as pg, pytest.raises(DataError) as e:
        read_targets(pg, (0, 200), "Q", 200)
    assert str(e.value) == (f"{root / 'nodes.h5'}[labels_Q]: multi-label labels are not "
                            "[200, C=3] of -1/0/1")
    assert str(e.value) in verify(root)["problems"]


def _train(root: Path, model: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plexgt", "train", "--data", str(root),
                           "--model", model, "--model.hidden=8", "--epochs", "1",
                           "--checkpoint-dir", str(tmp_path / "ck")],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)


def test_train_exits_2_with_one_line(bad, tmp_path):
    root, rel, _, case = bad
    # the GCN reads no edge features; gt reads them beside A2's rows
    r = _train(root, "gt" if case == "edge_features_short" else "gcn", tmp_path)
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and len(errors) == 1, r.stderr[-3000:]
    assert str(root / rel) in errors[0], errors
