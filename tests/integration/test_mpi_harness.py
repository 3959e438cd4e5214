"""The multi-rank suite's harness (tests/mpi/harness.py), on a small suite of its own run
under mpiexec: a test failing on one rank only is reported by rank 0 and leaves the next test's
collectives matched; one failing before a collective the others wait in ends the job at once
with that rank's error; a real hang leaves every rank's stacks in its ``.hang`` file."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from .conftest import mpiexec, run_job

REPO = Path(__file__).resolve().parents[2]

FAILURES = '''
from mpi4py import MPI

COMM = MPI.COMM_WORLD


def test_fails_on_rank_1_alone():
    assert COMM.rank != 1, "rank 1 disagrees"


def test_the_next_test_meets_its_partners():
    assert COMM.allreduce(COMM.rank) == 1


def test_rank_1_fails_before_a_collective():
    assert COMM.rank != 1, "rank 1 gives up"
    COMM.barrier()


def test_never_reached():
    pass
'''

HANG = '''
import time

import pytest
from mpi4py import MPI


@pytest.mark.timeout(12)
def test_rank_1_never_arrives():
    if MPI.COMM_WORLD.rank == 1:
        time.sleep(60)
    MPI.COMM_WORLD.barrier()
'''


def _suite(tmp_path: Path, body: str, kill_after: int = 0, **env: str):
    """The suite ``body`` on 2 ranks (``kill_after``: under ``timeout``, as make test runs)."""
    (tmp_path / "test_sample.py").write_text(body)
    logs = tmp_path / "logs"
    logs.mkdir()
    outer = ["timeout", str(kill_after)] if kill_after else []
    r = run_job([*outer, mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "pytest", "-v",
                 "-p", "no:cacheprovider", "-p", "tests.mpi.harness", "--rootdir",
                 str(tmp_path), "-o", "timeout_method=thread", str(tmp_path / "test_sample.py")],
                timeout=120, PLEXGT_TEST_LOGDIR=str(logs), PYTHONPATH=str(REPO), **env)
    return r, logs


@pytest.mark.timeout(150)
def test_a_failure_on_one_rank_is_reported_and_a_stranded_one_ends_the_job(tmp_path):
    r, logs = _suite(tmp_path, FAILURES, PLEXGT_TEST_FAILED_RANK_WAIT_S="3")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    # rank 0 passed the first test itself and reports rank 1's failure as its own error;
    # rank 1 names it on the job's stderr at once
    assert "test_fails_on_rank_1_alone ERROR" in r.stdout
    assert ("rank 1: FAILED test_sample.py::test_fails_on_rank_1_alone (call: AssertionError: "
            "rank 1 disagrees") in r.stderr
    # the collectives of the next test met their partners
    assert "test_the_next_test_meets_its_partners PASSED" in r.stdout
    # rank 0 waits in the barrier for rank 1, which ends the job with its error (in its log;
    # on stderr too, unless the abort beats mpiexec's forwarding of the line)
    assert ("rank 1: test_sample.py::test_rank_1_fails_before_a_collective failed here (call: "
            "AssertionError: rank 1 gives up") in (logs / "plexgt-mpi-n2-rank1.log").read_text()
    assert "test_never_reached" not in out


@pytest.mark.timeout(150)
@pytest.mark.parametrize("late", [False, True], ids=["test-limit", "job-deadline"])
def test_a_hang_leaves_every_ranks_stacks(tmp_path, late):
    """pytest-timeout ends whichever rank's clock runs out first, the stacks dumped 10 s
    before; or (``late``) the test's limit lies past the job's, which kills it from outside
    at its deadline, and the stacks came 10 s before that."""
    if late:
        body = HANG.replace("timeout(12)", "timeout(300)")
        r, logs = _suite(tmp_path, body, kill_after=14,
                         PLEXGT_TEST_DEADLINE=str(int(time.time()) + 14))
        assert r.returncode == 124  # timeout's: the job's deadline ended it
    else:
        r, logs = _suite(tmp_path, HANG)
    assert r.returncode != 0
    stacks = {rank: (logs / f"plexgt-mpi-n2-rank{rank}.hang").read_text() for rank in (0, 1)}
    assert "test_rank_1_never_arrives" in stacks[0] and "test_rank_1_never_arrives" in stacks[1]
    lines = HANG.splitlines()
    barrier = 1 + next(i for i, t in enumerate(lines) if "barrier()" in t)
    sleep = 1 + next(i for i, t in enumerate(lines) if "sleep(60)" in t)
    assert f"line {barrier} in test_rank_1_never_arrives" in stacks[0]
    assert f"line {sleep} in test_rank_1_never_arrives" in stacks[1]
