"""Peak memory on a GPU is two numbers: the tensors' (``max_memory_allocated``, kept as
``peak_mem_bytes``) and the device's (``peak_device_mem_bytes``: the allocator's peak
reservation plus what the GPU holds outside it, the CUDA context and NCCL's buffers). No GPU
here: torch.cuda's memory queries are monkeypatched with the numbers of a GPU run."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from plexgt.cli import main
from plexgt.distributed.bootstrap import DistContext
from plexgt.distributed.collectives import CommLedger
from plexgt.plan.knobs import load_config
from plexgt.training import loop
from plexgt.training.tensorboard import scalars

GiB = 2**30
GPU = torch.device("cuda", 0)


def _gpu(monkeypatch):
    """An 80 GiB GPU: 50 GiB of tensors at the peak, the allocator reserving 65 GiB at its
    peak and 60 GiB now, 70 GiB in use on the device (10 GiB outside the allocator)."""
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 50 * GiB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 65 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 60 * GiB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * GiB, 80 * GiB))


def test_the_device_peak_counts_what_the_allocator_does_not(monkeypatch):
    _gpu(monkeypatch)
    assert loop.peak_memory_bytes(GPU) == 50 * GiB
    assert loop.peak_device_bytes(GPU) == 65 * GiB + 10 * GiB
    cpu = torch.device("cpu")
    # on CPUs both are the process's peak resident set: read twice, it may only grow (a page)
    first = loop.peak_device_bytes(cpu)
    assert 0 < first <= loop.peak_memory_bytes(cpu) < first + (1 << 20)


def test_the_metrics_row_keeps_the_tensor_peak_and_adds_the_device_peak(monkeypatch):
    _gpu(monkeypatch)
    monkeypatch.setattr(loop, "_stats", lambda values, device: (values, values))
    cfg = load_config(None, {"eval_every": 5})
    ctx = DistContext(0, 1, 0, 1, "nccl", GPU, "single")
    model = torch.nn.Linear(2, 2)
    task = SimpleNamespace(ledger=CommLedger(), grid="rows1", strategy="s", model=model,
                           metric="acc")
    opt = torch.optim.AdamW(model.parameters())
    best = {"epoch": -1, "valid": -1.0, "test": 0.0}
    row, _ = loop.epoch_row(cfg, ctx, task, opt, 0, torch.tensor(1.0), 0.1, 0.0, best)
    assert row["peak_mem_bytes"] == 50 * GiB
    assert row["peak_device_mem_bytes"] == row["peak_device_mem_bytes_mean"] == 75 * GiB
    assert scalars(row)["memory/peak_device_bytes"] == 75 * GiB


def test_the_report_names_both_peaks(tmp_path, capsys):
    rows = [{"epoch": e, "loss": 1.0, "peak_mem_bytes": 100 << 20,
             "peak_device_mem_bytes": 612 << 20} for e in (1, 2)]
    m = tmp_path / "m.jsonl"
    m.write_text("".join(f"{r}\n".replace("'", '"') for r in rows))
    assert main(["report", str(m)]) == 0
    out = capsys.readouterr().out
    assert "peak memory 100 MiB on the fullest rank (tensors); 612 MiB held on its GPU" in out
