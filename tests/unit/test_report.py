"""plexgt report: the summary of a metrics JSONL, its plot, and its one-line errors."""

from __future__ import annotations

import json

import pytest

from plexgt.cli import main


def _metrics(path, epochs=5):
    rows = [{"epoch": e, "loss": 2.0 / e, "train_acc": 0.5 + e / 20, "valid_acc": [0.5, 0.7,
             0.9, 0.8, 0.85][e - 1], "test_acc": 0.6 + e / 50, "time_epoch": 1.0 + (e == 1),
             "time_compute": 0.6, "time_comm": 0.3, "time_wait": 0.1,
             "bytes_comm": 4 << 20, "bytes_comm_max_rank": 2 << 20,
             "peak_mem_bytes": (100 + e) << 20, "strategy": "gp_ring", "ranks": 2}
            for e in range(1, epochs + 1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_report_summarises_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    m = _metrics(tmp_path / "m.jsonl")
    png = tmp_path / "r.png"
    assert main(["report", str(m), "--out", str(png)]) == 0
    out = capsys.readouterr().out
    assert "5 epochs on 2 rank(s), layout gp_ring" in out
    assert "best valid_acc 0.9000 at epoch 3 (test_acc 0.6600)" in out
    assert "median epoch 1.000 s: compute 0.600 s (60%) / comm 0.300 s (30%)" in out
    assert "2.0 MiB on the busiest rank" in out and "peak memory 105 MiB" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_refuses_what_is_not_a_metrics_file(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"epoch": 1, "loss": 1.0}\n{not json\n')
    assert main(["report", str(bad)]) == 2
    assert "bad.jsonl: line 2: not JSON" in capsys.readouterr().err
    (tmp_path / "other.jsonl").write_text('{"loss": 1.0}\n')
    assert main(["report", str(tmp_path / "other.jsonl")]) == 2
    assert "line 1: not an epoch record" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl: No such file" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("\n")
    assert main(["report", str(tmp_path / "empty.jsonl"), "--out",
                 str(tmp_path / "x.png")]) == 2
    assert not (tmp_path / "x.png").exists()
