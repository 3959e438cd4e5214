"""``plexgt report METRICS.jsonl [--out report.png]``: what a training run did, at a glance.

Reads the metrics a run wrote (``plexgt train --metrics``, one JSON object an epoch) and prints
a short summary: epochs, the best validation epoch and its test metric, the median epoch time
split into compute / communication / waiting, bytes sent per rank and the peak memory. With
``--out`` it also draws one PNG (matplotlib): loss, the metric, the per-epoch time split, and
bytes per rank with peak memory. The metric is the run's selection metric, the one train
chose its best epoch on (ROC-AUC for binary labels, the mean ROC-AUC over tasks for
multi-label ones, else accuracy), though a binary run's rows also hold its accuracy. One
process, no MPI, no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plexgt.errors import UsageError

HELP = "Summarise a run's metrics JSONL; with --out, plot loss, metrics, time and memory."
SPLITS = ("train", "valid", "test")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("metrics", type=Path, help="metrics JSONL of plexgt train --metrics")
    p.add_argument("--out", type=Path, help="write the plot here (PNG)")


NUMBER_PREFIXES = ("time_", "bytes_", "peak_mem_", "peak_device_")
"""Keys whose values the summary and the plot compute with, besides 'loss', 'lr' and each
split's metric: numbers (NaN and infinities included: a ROC-AUC can be undefined, and a loss
non-finite where the run stopped on it)."""


def read_metrics(path: Path, note: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """The epochs of a metrics file; UsageError naming the file and line when it is not one.

    A last line with no newline that is not JSON is what a run killed while writing leaves
    (a killed run's metrics are normal input): it is skipped, and ``note`` says so."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not a text file (byte {e.start} is not UTF-8); a metrics "
                         "file is the JSONL plexgt train --metrics writes") from None
    lines = text.splitlines()
    rows = []
    for k, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if k == len(lines) and not text.endswith(("\n", "\r")):
                note(f"{path}: line {k} is cut short (a run killed while writing it); "
                     "skipped")
                continue
            raise UsageError(f"{path}: line {k}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or "epoch" not in row:
            raise UsageError(f"{path}: line {k}: not an epoch record (no 'epoch')")
        check_types(row, f"{path}: line {k}")
        rows.append(row)
    if not rows:
        raise UsageError(f"{path}: no epochs")
    return rows


def check_types(row: dict[str, Any], where: str) -> None:
    """UsageError naming the key unless every value the report computes with has its type:
    the epoch a whole number, the loss, rate, metrics, times, bytes and memory numbers, the
    selection metric's name a name."""
    epoch = row["epoch"]
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise UsageError(f"{where}: 'epoch' is {json.dumps(epoch)}, not a whole number")
    metric = row.get("metric", "acc")
    if not (isinstance(metric, str) and metric.isidentifier()):
        raise UsageError(f"{where}: 'metric' is {json.dumps(metric)}, not a metric's name "
                         "('acc', 'rocauc')")
    metrics = {f"{s}_" for s in SPLITS}
    for key, v in row.items():
        if key in ("loss", "lr") or key.startswith(NUMBER_PREFIXES) or (
                key.startswith(tuple(metrics)) and key.count("_") == 1):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise UsageError(f"{where}: {key!r} is {json.dumps(v)}, not a number")


METRIC_TITLES = {"acc": "accuracy", "rocauc": "ROC-AUC"}
"""How the plot titles a metric key (multi-label runs' 'rocauc' is the mean over tasks)."""


def metric_name(rows: list[dict[str, Any]]) -> str:
    """The run's selection metric, the key suffix its best validation epoch was chosen on:
    what the rows record ('metric', written since plexgt train wrote a binary run's accuracy
    beside its ROC-AUC), or in older files 'rocauc' where any row holds a validation ROC-AUC
    (train reports one only when it selects on it), else 'acc'. Every row is looked at: with
    eval_every > 1 the first ones hold no metric at all."""
    for r in rows:
        if "metric" in r:
            return str(r["metric"])
    return "rocauc" if any("valid_rocauc" in r for r in rows) else "acc"


def best_epoch(rows: list[dict[str, Any]], m: str) -> dict[str, Any] | None:
    """The row train chose as best: the first with the highest validation ``m``, a NaN
    (a split of one class has no ROC-AUC) never winning; None when no row has one."""
    best = None
    for r in rows:
        v = r.get(f"valid_{m}")
        if v is not None and v == v and (best is None or v > best[f"valid_{m}"]):
            best = r
    return best


def series(rows: list[dict[str, Any]], m: str) -> dict[str, tuple[list[int], list[float]]]:
    """{split: (epochs, values)} of metric ``m``: the evaluated epochs only (eval_every > 1
    leaves the others without one)."""
    out = {}
    for s in SPLITS:
        have = [r for r in rows if f"{s}_{m}" in r]
        if have:
            out[s] = ([r["epoch"] for r in have], [r[f"{s}_{m}"] for r in have])
    return out


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """The text summary's lines."""
    m = metric_name(rows)
    last = rows[-1]
    out = [f"{len(rows)} epochs on {last.get('ranks', '?')} rank(s), layout "
           f"{last.get('strategy') or last.get('grid') or '?'}; final loss "
           f"{last.get('loss', float('nan')):.4f}"]
    best = best_epoch(rows, m)
    if best is not None:
        out.append(f"best valid_{m} {best[f'valid_{m}']:.4f} at epoch {best['epoch']} "
                   f"(test_{m} {best.get(f'test_{m}', float('nan')):.4f})")
    steady = rows[1:] or rows  # the first epoch pays one-off costs
    parts = {k: statistics.median(r.get(f"time_{k}", 0.0) for r in steady)
             for k in ("epoch", "compute", "comm", "wait")}
    if parts["epoch"]:
        share = " / ".join(f"{k} {parts[k]:.3f} s ({parts[k] / parts['epoch']:.0%})"
                           for k in ("compute", "comm", "wait"))
        out.append(f"median epoch {parts['epoch']:.3f} s: {share}")
    if "bytes_comm_max_rank" in last:
        out.append(f"bytes sent per epoch: {last['bytes_comm_max_rank'] / 2**20:.1f} MiB on the "
                   f"busiest rank, {last.get('bytes_comm', 0) / 2**20:.1f} MiB in all")
    if any("peak_mem_bytes" in r for r in rows):
        peak = max(r.get("peak_mem_bytes", 0) for r in rows)
        line = f"peak memory {peak / 2**20:.0f} MiB on the fullest rank"
        dev = max((r["peak_device_mem_bytes"] for r in rows if "peak_device_mem_bytes" in r),
                  default=None)
        if dev is not None and dev != peak:  # a GPU run: the device holds more than tensors
            line += (f" (tensors); {dev / 2**20:.0f} MiB held on its GPU (allocator cache, "
                     "CUDA context, NCCL buffers)")
        out.append(line)
    return out


def figure(rows: list[dict[str, Any]]) -> Any:
    """The report's matplotlib figure, four panels: loss, the selection metric per split
    (its evaluated epochs, marked: one evaluation is one point), time split, bytes and
    memory."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--out needs matplotlib (pip install 'plexgt[perf]')") from None
    m = metric_name(rows)
    ep = [r["epoch"] for r in rows]
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    ax[0, 0].plot(ep, [r.get("loss") for r in rows])
    ax[0, 0].set(title="training loss", xlabel="epoch", yscale="log")
    for s, (xs, ys) in series(rows, m).items():
        ax[0, 1].plot(xs, ys, marker="." if len(xs) < 50 else None, label=s)
    ax[0, 1].set(title=f"{METRIC_TITLES.get(m, m)} (selection metric)", xlabel="epoch")
    best = best_epoch(rows, m)
    if best is not None:
        ax[0, 1].axvline(best["epoch"], color="grey", linestyle=":", linewidth=1)
    if ax[0, 1].lines:  # a run with no metric (eval_every past its epochs) has no legend
        ax[0, 1].legend()
    bottom = [0.0] * len(rows)
    for k in ("compute", "comm", "wait"):
        vals = [r.get(f"time_{k}", 0.0) for r in rows]
        ax[1, 0].bar(ep, vals, bottom=bottom, label=k)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax[1, 0].set(title="seconds per epoch (busiest rank)", xlabel="epoch")
    ax[1, 0].legend()
    ax[1, 1].plot(ep, [r.get("bytes_comm_max_rank", 0) / 2**20 for r in rows],
                  label="MiB sent, busiest rank")
    ax[1, 1].plot(ep, [r.get("peak_mem_bytes", 0) / 2**20 for r in rows],
                  label="peak MiB, fullest rank")
    ax[1, 1].set(title="bytes and memory", xlabel="epoch")
    ax[1, 1].legend()
    fig.tight_layout()
    return fig


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    """:func:`figure` as one PNG, written whole or not at all."""
    fig = figure(rows)  # first: it says when matplotlib is missing
    import matplotlib.pyplot as plt

    tmp = out.with_name(out.name + ".tmp.png")
    try:
        fig.savefig(tmp, dpi=90)
        tmp.replace(out)
    except OSError as e:
        with contextlib.suppress(OSError):  # a read-only file system refuses even this
            tmp.unlink(missing_ok=True)
        raise UsageError(f"--out {out}: {e.strerror or e}") from None
    finally:
        plt.close(fig)


def run(args: argparse.Namespace) -> int:
    rows = read_metrics(args.metrics, lambda m: print(f"plexgt report: note: {m}",
                                                       file=sys.stderr, flush=True))
    print("\n".join(summary(rows)))
    if args.out is not None:
        plot(rows, args.out)
        print(f"plot: {args.out}")
    return 0
