"""Faults end the whole job, once: a rank that stops answering, an error on one rank only,
the same error on every rank, a non-finite loss (runs extended or already finished:
test_train's checkpoint tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import mpiexec, prepared_sbm, run_job
from .test_train import _descendants, _job

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return prepared_sbm(tmp_path_factory.mktemp("faults"), seed=2)


def _cmd(data: Path, n: int, *extra: str) -> list[str]:
    return [mpiexec(), "-n", str(n), sys.executable, "-m", "plexgt", "train", "--data",
            str(data), "--model", "gcn", "--model.hidden=16", "--optim.warmup_epochs=2",
            *extra]


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


def test_a_missing_file_on_one_rank_ends_every_rank_with_one_message(data, tmp_path):
    """Rank i checks file i mod 3 of the checkpoint: the missing one is found by rank 1 only,
    and every rank stops with rank 1's message."""
    ck = tmp_path / "ck"
    assert run_job(_cmd(data, 3, "--epochs", "2", "--checkpoint-dir", str(ck))).returncode == 0
    files = sorted(json.loads((ck / "epoch_000002" / "COMPLETE").read_text())["sha256"])
    (ck / "epoch_000002" / files[1]).unlink()
    t0 = time.time()
    r = run_job(_cmd(data, 3, "--epochs", "4", "--checkpoint-dir", str(ck), "--resume"),
                timeout=120)
    assert r.returncode == 2 and time.time() - t0 < 60
    assert _errors(r.stderr) == [
        f"plexgt train: error: rank 1: {ck}/epoch_000002/{files[1]}: checkpoint file "
        "missing"], r.stderr
    assert "finished" not in r.stdout and "resumed" not in r.stderr


def test_a_non_finite_loss_stops_the_run_naming_the_epoch(data, tmp_path):
    """lr = 1e30 overflows the weights after the first step: the run stops at the first
    non-finite loss with one message naming the epoch, and writes no checkpoint of it."""
    ck = tmp_path / "ck"
    r = run_job(_cmd(data, 2, "--optim.lr=1e30", "--optim.warmup_epochs=0", "--epochs", "6",
                     "--checkpoint-dir", str(ck), "--checkpoint-every", "1"))
    assert r.returncode != 0
    errs = _errors(r.stderr)
    assert len(errs) == 1 and ("the loss is nan" in errs[0] or "the loss is inf" in errs[0]), \
        r.stderr
    bad = int(errs[0].split("epoch ")[1].split(":")[0])
    assert bad >= 2 and "finished" not in r.stdout
    assert not (ck / f"epoch_{bad:06d}").exists()


def test_the_same_error_on_every_rank_is_printed_once(data, tmp_path):
    """A grid that is not the world's: every rank finds it, the job prints it once."""
    r = run_job(_cmd(data, 3, "--grid", "2x2x1"))
    assert r.returncode == 2
    assert len(_errors(r.stderr)) == 1 and "world size is 3" in r.stderr, r.stderr


def test_a_stopped_rank_ends_the_job_after_the_timeout(data, tmp_path):
    """kill -STOP of one rank: its peers time out in their next collective, sub-groups
    included, and the job ends (no rank left running)."""
    m = tmp_path / "m.jsonl"
    cmd = _cmd(data, 4, "--grid", "2x2x1", "--epochs", "100000", "--metrics", str(m),
               "--parallel.timeout_s=10")
    with _job(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        deadline = time.time() + 120
        while time.time() < deadline and not (m.exists() and len(m.read_text().splitlines()) > 2):
            time.sleep(0.5)
        pids = _descendants(proc.pid, "python")
        assert len(pids) == 4, f"expected 4 ranks under mpiexec, found {pids}"
        os.kill(pids[-1], signal.SIGSTOP)
        t0 = time.time()
        proc.communicate(timeout=120)
        took = time.time() - t0
    assert proc.returncode != 0
    assert took < 60, f"the job took {took:.0f} s to end after a rank stopped"
    deadline = time.time() + 15  # orphans reparented to init are reaped within moments
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], [_state(p) for p in pids]


def _state(pid: int) -> str:
    try:
        return next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("State:"))
    except (OSError, StopIteration):
        return "gone"


def _alive(pid: int) -> bool:
    s = _state(pid)
    return s != "gone" and "zombie" not in s
