"""Tests that launch real jobs (mpiexec, several plexgt processes) from a serial pytest."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import datagen

BIN = Path(sys.executable).parent


def mpiexec() -> str:
    exe = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
    if exe is None:
        pytest.skip("no mpiexec on PATH: install the mpich wheel (make test does)")
    return exe


def job_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run_job(args: list[str], timeout: float = 180, **extra: str) -> subprocess.CompletedProcess:
    """Run a job to completion; on timeout kill its whole process group (ranks included)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=job_env(**extra), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def prepared_sbm(root: Path, seed: int) -> Path:
    """A small prepared SBM graph (600 nodes, 6000 edges, 4 classes) under ``root``: the
    training jobs' input."""
    return datagen.prepared_sbm(root / "sbm", 600, 6000, num_classes=4, num_features=16,
                                seed=seed, tiles=2, symmetrize=False)
