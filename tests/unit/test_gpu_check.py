"""perf/gpu_check.sh, the script a lent GPU runs (one command of at most 10 minutes, at most 8
files back): its dry run lists every step within 300 s and at most 8 files and creates
nothing; without a CUDA torch it stops at once with one line; a bad argument is a one-line
error; a run rewrites its summary after each step (a killed run still returns one) and exits
non-zero when a step failed. The GPU steps themselves run on a GPU only; here a stand-in
interpreter plays them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "perf" / "gpu_check.sh"
STEPS = ["env", "cuda_tests", "prep", "train_gcn", "train_gt", "train_gps", "resume_cpu",
         "dropout", "attention", "bandwidth", "profile"]
MAX_SECONDS, MAX_FILES = 300, 8
"""What the lent machine allows one check: a rerun must fit its 15 minutes, and at most 8
files come back from $OUT."""


def _dry_run(tmp_path: Path, **env: str) -> tuple[dict[str, tuple[int, str]], list[str], str]:
    """({step: (limit_s, command)}, the files it returns, the whole output)."""
    r = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT,
                       env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), **env})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    steps = {}
    for line in lines[:-2]:
        name, limit, unit, cmd = line.split(maxsplit=3)
        assert unit == "s"
        steps[name] = (int(limit), cmd)
    assert lines[-2].startswith("total") and lines[-1].startswith("returns")
    assert int(lines[-2].split()[1]) == sum(limit for limit, _ in steps.values())
    files = lines[-1].split(": ", 1)[1].split()
    assert f"returns     {len(files)} files into " in lines[-1]
    return steps, files, r.stdout


def test_the_dry_run_fits_the_lent_machine_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    steps, files, text = _dry_run(tmp_path, OUT=str(out))
    assert list(steps) == STEPS
    assert sum(limit for limit, _ in steps.values()) <= MAX_SECONDS
    assert len(files) <= MAX_FILES and "gpu_check.json" in files
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files)  # what comes back
    assert f"into {out}:" in text  # the lent machine's $OUT is the default
    assert list(tmp_path.iterdir()) == []  # no output folder, no work folder


def test_the_dry_run_keeps_the_coverage(tmp_path):
    """The CUDA tests with the Triton kernel compiled, nccl training of each model stopped and
    resumed, a CPU-written checkpoint resumed on the GPU, the benchmarks and the profile."""
    steps, _, _ = _dry_run(tmp_path)
    cmd = {k: c for k, (_, c) in steps.items()}
    assert "-m cuda" in cmd["cuda_tests"] and "test_ops_attention_triton.py" in cmd["cuda_tests"]
    for model in ("gcn", "gt", "gps"):
        c = cmd[f"train_{model}"]
        assert f"--model {model}" in c and "--backend nccl" in c
        assert "--stop-after 2" in c and c.endswith("--resume")
    cpu_then_gpu = cmd["resume_cpu"].split("&&")
    assert "--backend gloo --stop-after 1" in cpu_then_gpu[0]
    assert "--backend nccl --resume" in cpu_then_gpu[1]
    assert re.search(r"bench_attention .*--dtypes float32 bfloat16", cmd["attention"])
    assert "perf.bench_attention_bandwidth --device cuda" in cmd["bandwidth"]
    assert "bench_dropout --device cuda" in cmd["dropout"]
    assert "profile --quick --backend nccl" in cmd["profile"]


def test_an_unknown_argument_is_a_one_line_error():
    r = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "gpu_check.sh: unknown argument '--bogus' (use --out DIR, --dry-run)"]


def _wrapper(path: Path, target: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
    path.chmod(0o755)
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU to check")
def test_without_cuda_it_stops_at_once_with_one_line(tmp_path):
    """This interpreter's torch sees no GPU: one line, exit 3, nothing created."""
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "PY": sys.executable,
           "OUT": str(out)}
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=env)
    assert r.returncode == 3
    assert r.stderr.splitlines() == [
        f"gpu_check.sh: no GPU check on this machine: {sys.executable}: torch "
        f"{torch.__version__} sees no CUDA device (torch.cuda.is_available() is false)"]
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU to check")
def test_a_cpu_only_venv_is_passed_over_in_one_line(tmp_path):
    """A carried venv whose torch has no CUDA does not win silently: it is named, the
    machine's python3 is tried instead (here another CPU torch: the one-line stop)."""
    venv = tmp_path / "venv"
    _wrapper(venv / "bin" / "python", sys.executable)
    _wrapper(tmp_path / "bin" / "python3", sys.executable)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "TMPDIR": str(tmp_path / "tmp"),
           "VENV": str(venv), "OUT": str(tmp_path / "out")}
    (tmp_path / "tmp").mkdir()
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=env)
    assert r.returncode == 3
    first, last = r.stderr.splitlines()
    assert first == (f"gpu_check.sh: {venv}'s torch sees no CUDA device (a CPU-only venv "
                     "carried here?): using python3 instead")
    assert last.startswith("gpu_check.sh: no GPU check on this machine: python3: torch ")
    assert not (tmp_path / "out").exists() and list((tmp_path / "tmp").iterdir()) == []


# a stand-in for the GPU machine's python: it answers the preflight as a CUDA torch would,
# fails the gps training, writes the dropout benchmark's result, and (HANG_PREP set) hangs
# in prep; every other step succeeds at once
FAKE_PY = """#!/bin/bash
case "$*" in
    *"sees no CUDA device"*) echo "2.4.0 12.4 - 3.0.0 Stand-in_GPU"; exit 0 ;;
    *"plexgt prep"*) [ -n "${HANG_PREP:-}" ] && exec sleep 60 ;;
    *"plexgt train"*"--model gps"*) echo "gps broke"; exit 7 ;;
    *"perf.bench_dropout"*) echo '{}' > "$PLEXGT_RESULTS_DIR/bench_dropout_cuda.json" ;;
esac
exit 0
"""


def _fake_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    (tmp_path / "tmp").mkdir()
    return {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path / "tmp"), "PY": str(fake),
            "OUT": str(tmp_path / "out"), **extra}


def test_a_run_returns_its_summary_logs_and_results_and_fails_with_a_step(tmp_path):
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=_fake_env(tmp_path))
    assert r.returncode == 1, r.stderr  # a step failed
    out = tmp_path / "out"
    files = sorted(p.name for p in out.iterdir())
    assert files == ["bench_dropout_cuda.json", "gpu_check.json", "gpu_check_logs.tar.gz"]
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["status"] == "done" and summary["gpu"] == "Stand-in GPU"
    assert list(summary["steps"]) == STEPS
    results = {k: v["result"] for k, v in summary["steps"].items()}
    assert results == {**dict.fromkeys(STEPS, "ok"), "train_gps": "failed"}
    assert summary["steps"]["train_gps"]["rc"] == 7
    with tarfile.open(out / "gpu_check_logs.tar.gz") as tar:
        names = set(tar.getnames())
        assert {f"logs/{s}.log" for s in STEPS} <= names
        assert tar.extractfile("logs/train_gps.log").read() == b"gps broke\n"
    assert r.stdout.splitlines()[-1].startswith(
        'RESULT bench=gpu_check gpu="Stand-in GPU" steps=11 passed=10 failed=train_gps ')
    assert list((tmp_path / "tmp").iterdir()) == []  # the work folder is removed


def test_a_killed_run_has_already_written_its_summary(tmp_path):
    """Killed during a step (the lent machine's limit), the summary of the steps before it
    and the logs are already in the output folder."""
    p = subprocess.Popen(["bash", str(SCRIPT)], cwd=ROOT, env=_fake_env(tmp_path, HANG_PREP="1"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    summary_file = tmp_path / "out" / "gpu_check.json"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            if summary_file.exists() and '"prep": {"result": "running"' in \
                    summary_file.read_text():
                break
            time.sleep(0.1)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    summary = json.loads(summary_file.read_text())
    results = {k: v["result"] for k, v in summary["steps"].items()}
    assert summary["status"] == "running"
    assert results == {"env": "ok", "cuda_tests": "ok", "prep": "running",
                       **dict.fromkeys(STEPS[3:], "pending")}
    with tarfile.open(tmp_path / "out" / "gpu_check_logs.tar.gz") as tar:
        assert "logs/cuda_tests.log" in tar.getnames()
