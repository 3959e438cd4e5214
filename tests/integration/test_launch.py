"""Real launches: mpiexec, torchrun-style variables, and a failing rank ending the whole job."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import job_env, mpiexec, run_job

pytestmark = pytest.mark.timeout(240)
HERE = Path(__file__).parent


def test_info_under_mpiexec_prints_every_rank():
    r = run_job([mpiexec(), "-n", "4", sys.executable, "-m", "plexgt", "info", "--grid", "2x2x1"])
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("rank")]
    assert len(lines) == 4
    assert "rank    3 (x=1, y=1, z=0)  X=[1, 3] Y=[2, 3] Z=[3]" in r.stdout
    assert "launcher=mpi" in r.stdout and "backend=gloo" in r.stdout


def test_info_wrong_world_size_is_one_line_error():
    r = run_job([mpiexec(), "-n", "2", sys.executable, "-m", "plexgt", "info", "--grid", "3x1x1"])
    assert r.returncode != 0
    assert "gx=3 * gy=1 * gz=1 = 3 ranks, but the world size is 2" in r.stderr


def test_exception_on_rank_3_ends_job_fast():
    start = time.time()
    r = run_job([mpiexec(), "-n", "4", sys.executable, str(HERE / "fault_job.py"), "3"], 120)
    end = time.time()
    assert r.returncode != 0
    assert "UNREACHABLE" not in r.stdout
    assert re.search(r"rank 3: uncaught RuntimeError: injected failure on rank 3", r.stderr)
    raised = float(re.search(r"RAISING_AT ([0-9.]+)", r.stderr).group(1))
    assert raised >= start
    assert end - raised < 10, f"job took {end - raised:.1f}s to end after the failure"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_style_environment_without_mpi():
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = job_env(
            PLEXGT_NO_MPI="1", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
        )
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "plexgt", "info", "--grid", "1x2x1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        ))
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "launcher=env" in outs[0][0]
    assert "rank    1 (x=0, y=1, z=0)" in outs[0][0]
