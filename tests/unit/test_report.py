"""plexgt report: the summary of a metrics JSONL, its plot, and its one-line errors."""

from __future__ import annotations

import json
import warnings

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


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("plexgt report: error: "), err
    return err[0]


def test_a_binary_file_is_one_line_naming_it(tmp_path, capsys):
    bad = tmp_path / "m.jsonl"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff binary")
    assert main(["report", str(bad)]) == 2
    err = _one_line(capsys)
    assert str(bad) in err and "not a text file" in err


@pytest.mark.parametrize("field,value,msg", [
    ("loss", "abc", "line 3: 'loss' is \"abc\", not a number"),
    ("epoch", None, "line 3: 'epoch' is null, not a whole number"),
    ("epoch", 2.5, "line 3: 'epoch' is 2.5, not a whole number"),
    ("valid_acc", None, "line 3: 'valid_acc' is null, not a number"),
    ("time_epoch", [1], "line 3: 'time_epoch' is [1], not a number"),
    ("peak_mem_bytes", True, "line 3: 'peak_mem_bytes' is true, not a number"),
])
def test_a_wrongly_typed_field_is_one_line_naming_the_key(tmp_path, capsys, field, value, msg):
    m = _metrics(tmp_path / "m.jsonl")
    rows = [json.loads(line) for line in m.read_text().splitlines()]
    rows[2][field] = value
    m.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(m)]) == 2
    assert f"{m}: {msg}" in _one_line(capsys)


def test_a_last_line_a_kill_cut_short_is_skipped_with_a_note(tmp_path, capsys):
    m = _metrics(tmp_path / "m.jsonl")
    text = m.read_text()
    m.write_text(text + text.splitlines()[0][:25])  # a 6th line, cut mid-write
    assert main(["report", str(m)]) == 0
    got = capsys.readouterr()
    assert got.err.strip() == (f"plexgt report: note: {m}: line 6 is cut short (a run killed "
                               "while writing it); skipped")
    assert got.out.startswith("5 epochs on 2 rank(s)")
    m.write_text(text + text.splitlines()[0][:25] + "\n")  # ended: damage, not a kill
    assert main(["report", str(m)]) == 2
    assert "line 6: not JSON" in _one_line(capsys)


def test_an_out_on_a_read_only_file_system_is_one_line(tmp_path, capsys, monkeypatch):
    """A read-only file system refuses the plot and also the unlink of its temporary (EROFS,
    even for a file that is not there: the cleanup raised inside the handler, a traceback).
    Tests run as root, where chmod stops nothing: the refusal is monkeypatched."""
    import errno
    import pathlib

    figure = pytest.importorskip("matplotlib.figure")

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(figure.Figure, "savefig", refuse)
    monkeypatch.setattr(pathlib.Path, "unlink", refuse)
    m = _metrics(tmp_path / "m.jsonl")
    assert main(["report", str(m), "--out", str(tmp_path / "r.png")]) == 2
    assert _one_line(capsys) == f"plexgt report: error: --out {tmp_path / 'r.png'}: Read-only " \
                                "file system"


def test_a_run_without_metrics_plots_without_a_warning(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    m = tmp_path / "m.jsonl"
    m.write_text('{"epoch": 1, "loss": 1.0}\n{"epoch": 2, "loss": 0.5}\n')
    with warnings.catch_warnings(record=True) as caught:  # printed to stderr outside pytest
        warnings.simplefilter("always")
        assert main(["report", str(m), "--out", str(tmp_path / "r.png")]) == 0
    assert [str(w.message) for w in caught] == [] and capsys.readouterr().err == ""


def _binary(path, eval_every=1, metric_key=True, epochs=6):
    """A binary run's rows: accuracy and ROC-AUC both, their best epochs different (accuracy
    peaks at 2, ROC-AUC at 5), evaluated every ``eval_every`` epochs and at the last."""
    acc = [0.6, 0.9, 0.7, 0.7, 0.8, 0.75]
    auc = [0.55, 0.6, 0.7, 0.8, 0.95, float("nan")]
    rows = []
    for e in range(1, epochs + 1):
        r = {"epoch": e, "loss": 1.0 / e, "lr": 0.01, "time_epoch": 1.0}
        if metric_key:
            r["metric"] = "rocauc"
        if e % eval_every == 0 or e == epochs:
            for s, shift in (("train", 0.01), ("valid", 0.0), ("test", -0.02)):
                r[f"{s}_acc"] = acc[e - 1] + shift
                r[f"{s}_rocauc"] = auc[e - 1] + shift
        rows.append(r)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("metric_key", [True, False], ids=["metric-recorded", "older-file"])
def test_a_binary_run_is_reported_on_its_roc_auc(tmp_path, capsys, metric_key):
    """train chose a binary run's best epoch on ROC-AUC, and report chose (and plotted)
    accuracy, the first valid_ key of the row: best epoch 2 instead of 5. A NaN ROC-AUC
    (epoch 6) never wins. Older files, without 'metric', are read the same way."""
    m = _binary(tmp_path / "m.jsonl", metric_key=metric_key)
    assert main(["report", str(m)]) == 0
    out = capsys.readouterr().out
    assert "best valid_rocauc 0.9500 at epoch 5 (test_rocauc 0.9300)" in out
    assert "valid_acc" not in out


def test_the_metric_panel_plots_the_selection_metric_on_the_evaluated_epochs(tmp_path):
    """eval_every 2: epochs 1, 3, 5 have no metric. The panel looked for the metric in the
    first row only and stayed empty; it now draws each split at epochs 2, 4, 6."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from plexgt.commands.report import figure, read_metrics, summary

    rows = read_metrics(_binary(tmp_path / "m.jsonl", eval_every=2))
    fig = figure(rows)
    try:
        panel = fig.axes[1]
        assert panel.get_title() == "ROC-AUC (selection metric)"
        lines = {l.get_label(): l for l in panel.lines if not l.get_label().startswith("_")}
        assert sorted(lines) == ["test", "train", "valid"]
        assert list(lines["valid"].get_xdata()) == [2, 4, 6]
        assert list(lines["valid"].get_ydata())[:2] == [0.6, 0.8]
    finally:
        plt.close(fig)
    assert "best valid_rocauc 0.8000 at epoch 4" in "\n".join(summary(rows))
    # a run evaluated once (eval_every past its epochs: the last epoch only) is one marked
    # point, not an invisible one-point line
    rows = read_metrics(_binary(tmp_path / "one.jsonl", eval_every=100))
    fig = figure(rows)
    try:
        (valid,) = [l for l in fig.axes[1].lines if l.get_label() == "valid"]
        assert list(valid.get_xdata()) == [6] and valid.get_marker() == "."
    finally:
        plt.close(fig)


def test_an_accuracy_run_keeps_accuracy_and_a_bad_metric_name_is_one_line(tmp_path, capsys):
    m = _metrics(tmp_path / "m.jsonl")
    assert main(["report", str(m)]) == 0
    assert "best valid_acc 0.9000 at epoch 3" in capsys.readouterr().out
    rows = [json.loads(line) for line in m.read_text().splitlines()]
    rows[1]["metric"] = 3
    m.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(m)]) == 2
    assert f"{m}: line 2: 'metric' is 3, not a metric's name" in _one_line(capsys)
