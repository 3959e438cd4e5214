"""A raw web-graph dump (musae's layout: an edge CSV with a header listing each undirected edge
once, a target CSV with string class names, features as a JSON of id lists) prepares with
commands alone, verifies, and trains the curve of the same data converted to a node table
(issue 39: that had needed a 13-line converter script)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from plexgt.cli import main

from .conftest import run_job

pytestmark = pytest.mark.timeout(300)

NAMES = ["company", "government", "politician", "tvshow"]
F = 212


def _write_dump(d: Path) -> tuple[np.ndarray, dict[str, list[int]]]:
    """The three raw files under ``d``: a learnable SBM graph, its edges listed once."""
    from plexgt.data.synthetic import sbm

    g = sbm(num_nodes=400, num_edges=3000, num_classes=4, num_features=8, seed=2)
    keep = g.src < g.dst
    (d / "edges.csv").write_text(
        "id_1,id_2\n" + "".join(f"{a},{b}\n" for a, b in zip(g.src[keep], g.dst[keep])))
    (d / "target.csv").write_text("id,facebook_id,page_name,page_type\n" + "".join(
        f"{i},{1000 + i},page {i},{NAMES[c]}\n" for i, c in enumerate(g.labels)))
    rng = np.random.default_rng(0)
    feats = {}
    for i, c in enumerate(g.labels):  # 5 noise words and one of 3 words of the node's class
        words = set(rng.integers(0, 200, 5).tolist()) | {200 + 3 * int(c) + int(rng.integers(3))}
        feats[str(i)] = sorted(words)
    (d / "features.json").write_text(json.dumps(feats))
    return g.labels, feats


def _convert(d: Path, labels: np.ndarray, feats: dict[str, list[int]]) -> Path:
    """What the user had to script: a node table with a class id and a column per word."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    x = np.zeros((labels.size, F), np.float32)
    for i, words in feats.items():
        x[int(i), words] = 1
    cols = {"id": np.arange(labels.size), "y": labels}
    cols.update({f"w{j}": x[:, j] for j in range(F)})
    pq.write_table(pa.table(cols), d / "converted.parquet")
    return d / "converted.parquet"


def _train(data: Path, metrics: Path) -> list[float]:
    r = run_job([sys.executable, "-m", "plexgt", "train", "--data", str(data), "--model", "gcn",
                 "--epochs", "5", "--dtype=float64", "--model.dropout=0",
                 "--metrics", str(metrics)], 240)
    assert r.returncode == 0, r.stderr
    return [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]


def test_a_raw_web_graph_dump_preps_with_commands_alone_and_trains(tmp_path, capsys):
    labels, feats = _write_dump(tmp_path)
    raw = ["prep", "--input", str(tmp_path / "edges.csv"), "--node-table",
           str(tmp_path / "target.csv"), "--label-column", "page_type", "--feature-file",
           str(tmp_path / "features.json"), "--out", str(tmp_path / "raw"), "--quiet"]
    assert main(raw) == 0
    line = capsys.readouterr().err
    assert "symmetrized=yes (auto: 0.0% of edges have their reverse)" in line
    assert "features=csr" in line
    m = json.loads((tmp_path / "raw" / "manifest.json").read_text())
    assert m["label_names"] == NAMES and (m["N"], m["F"], m["C"]) == (400, F, 4)
    assert m["split"] == {"origin": "random", "fractions": [0.6, 0.2, 0.2], "seed": 0}
    assert m["symmetrized"] and m["feature_layout"] == "csr"
    assert main(["verify", str(tmp_path / "raw")]) == 0

    table = _convert(tmp_path, labels, feats)  # the converted table, stored dense
    assert main(["prep", "--input", str(tmp_path / "edges.csv"), "--node-table", str(table),
                 "--label-column", "y", "--feature-columns", "w*", "--sparse-features", "no",
                 "--out", str(tmp_path / "conv"), "--quiet"]) == 0
    a = _train(tmp_path / "raw", tmp_path / "raw.jsonl")
    b = _train(tmp_path / "conv", tmp_path / "conv.jsonl")
    assert len(a) == 5 and a[-1] < a[0]
    assert b == pytest.approx(a, rel=1e-9, abs=1e-12)  # the same curve, float64
