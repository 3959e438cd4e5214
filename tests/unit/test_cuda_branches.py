"""The CUDA-only branches, by recorded calls: torch has no fake CUDA device for a CPU build (a
tensor reporting ``cuda`` needs a CUDA device guard for indexing and autograd), so these run
with ``torch.device('cuda')`` objects, CPU data behind duck-typed tensors where a tensor must
say ``cuda``, and torch.cuda's functions replaced by recorders. What each branch asks of the
CUDA runtime is checked; the device audit (test_device_audit.py) checks the rest of a step."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from plexgt.distributed.collectives import CommLedger
from plexgt.ops import precision
from plexgt.parallel.plexus3d import TunedMatmul
from plexgt.plan.knobs import load_config
from plexgt.training import loop

GPU = torch.device("cuda", 0)


class FakeEvent:
    """torch.cuda.Event: its records in order, 250 ms between any two."""

    log: list[str] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.recorded = False

    def record(self, stream=None) -> None:
        self.recorded = True
        FakeEvent.log.append("record")

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.recorded and end.recorded
        return 250.0


def test_a_gpu_ledger_times_collectives_with_events_settled_after_the_step(monkeypatch):
    """On a GPU an NCCL call returns before its transfer is done: the ledger brackets each
    call with CUDA events and adds their spans only at settle (after the step's sync)."""
    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    ledger = CommLedger(device=GPU)
    for _ in range(2):
        with ledger.timed():
            FakeEvent.log.append("collective")
    assert FakeEvent.log == ["record", "collective", "record"] * 2
    assert ledger.seconds == 0.0  # nothing is read before the work is complete
    assert ledger.settle() == pytest.approx(0.5)
    assert ledger.settle() == pytest.approx(0.5)  # the events were consumed once
    ledger.reset()
    assert ledger.seconds == 0.0


class FakeCuda:
    """A CPU tensor that says it is on a GPU, with what TunedMatmul asks of its operands."""

    def __init__(self, data: torch.Tensor, log: list) -> None:
        self.data, self.log = data, log
        self.shape, self.dtype, self.device = data.shape, data.dtype, GPU

    def stride(self):
        return self.data.stride()

    def t(self) -> FakeCuda:
        return FakeCuda(self.data.t(), self.log)

    def __matmul__(self, other: FakeCuda) -> FakeCuda:
        self.log.append("mm")
        return FakeCuda(self.data @ other.data, self.log)


def test_tuned_matmul_times_each_form_once_between_device_syncs(monkeypatch):
    """On a GPU each GEMM form is run once untimed (handles, kernel selection), then timed
    between two synchronisations, so kernels are timed and not their launches; the choice
    is kept per shape, and a deterministic run (enabled=False) times nothing."""
    log: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("sync",
                                                                                   device)))
    a = FakeCuda(torch.randn(6, 4), log)
    b = FakeCuda(torch.randn(4, 3), log)
    mm = TunedMatmul(True, repeats=2)
    out = mm(a, b)
    # per form: a warm-up, a sync, the timed repeats, a sync; then the chosen form's product
    assert log == ["mm", ("sync", GPU), "mm", "mm", ("sync", GPU)] * 2 + ["mm"]
    torch.testing.assert_close(out.data, a.data @ b.data)
    log.clear()
    mm(a, b)
    assert log == ["mm"]  # the chosen form, untimed: no sync
    log.clear()
    TunedMatmul(False)(a, b)
    assert log == ["mm"]


def test_a_bfloat16_step_runs_under_cuda_autocast(monkeypatch):
    """loop.autocast on a GPU: CUDA autocast in the task's dtype; nothing for a float32
    task."""
    made = []
    monkeypatch.setattr(torch, "autocast", lambda device_type, dtype=None, **kw: made.append(
        (device_type, dtype, kw)) or SimpleNamespace())
    loop.autocast(SimpleNamespace(amp=torch.bfloat16), GPU)
    assert made == [("cuda", torch.bfloat16, {})]
    made.clear()
    loop.autocast(SimpleNamespace(amp=None), GPU)
    assert made == []


def test_sparse_sums_leave_cuda_autocast(monkeypatch):
    """full_precision on a GPU under autocast enters CUDA autocast disabled (cuSPARSE would
    otherwise get its operands cast back to bfloat16); without autocast it enters nothing."""
    made = []
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: True)
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device_type: torch.bfloat16)
    # a stand-in context: a real one would record, on entry, the patched "autocast enabled,
    # bfloat16" as the state to restore, and leave CPU autocast on for every later test
    monkeypatch.setattr(torch, "autocast", lambda device_type, **kw: made.append(
        (device_type, kw)) or contextlib.nullcontext())
    assert precision.autocast_dtype(GPU) == torch.bfloat16
    with precision.full_precision(GPU):
        pass
    assert made == [("cuda", {"enabled": False})]
    made.clear()
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: False)
    with precision.full_precision(GPU):
        pass
    assert made == []


def test_a_gpu_step_is_bounded_by_device_syncs_and_resets_the_peak(monkeypatch):
    """loop.step on a GPU: the peak-memory window reset, a sync before the clock starts,
    after the optimizer step and after the barrier, so its times are the work's."""
    log = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: log.append("reset_peak"))
    monkeypatch.setattr(loop.dist, "barrier", lambda: log.append("barrier"))
    model = torch.nn.Linear(3, 1)
    task = SimpleNamespace(model=model, inputs=torch.ones(2, 3), amp=None,
                           loss=lambda out: out.sum(), ledger=CommLedger())
    loop.step(load_config(None, {}), task, torch.optim.AdamW(model.parameters()), 0, GPU)
    assert log == ["reset_peak", "sync", "sync", "barrier", "sync"]
