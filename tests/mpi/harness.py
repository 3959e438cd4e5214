"""How a pytest session under ``mpiexec`` reports, and keeps one rank's failure from spreading.

Rank 0 reports to the terminal; the other ranks write their report to a per-rank log
(``PLEXGT_TEST_LOGDIR``, else the temporary directory) and print its path when they fail, so
the job's output stays readable.

A test that fails on some ranks only is the dangerous case: those ranks move on to the next
test while the others still wait in a collective of this one, and from there on every
collective meets the wrong partner, so the job hangs far from the cause (and rank 0's stack
names an innocent later test). So when a test ends, before its fixtures are torn down (some
tear down with a collective), every rank meets the others on a communicator of its own, which
the tests' collectives cannot match. A failure anywhere then fails the test on rank 0 too,
naming the rank and its error; a failed rank that the others do not join before the stack
dump below (they wait for it in a collective) ends the job at once with its error on stderr.
A real hang leaves each rank's stacks in ``plexgt-mpi-n{N}-rank{R}.hang``, dumped 10 s before
pytest-timeout ends the job, or before ``PLEXGT_TEST_DEADLINE`` (when the job's own time limit
kills it: ``make test`` runs each size under one and prints the files).

The multi-rank suite's conftest takes these hooks; ``-p tests.mpi.harness`` adds them to any
other pytest run.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
import pytest
from mpi4py import MPI

from plexgt.distributed.mpiwait import wait_request

WORLD = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
LOGDIR = os.environ.get("PLEXGT_TEST_LOGDIR") or tempfile.gettempdir()
LOG = os.path.join(LOGDIR, f"plexgt-mpi-n{WORLD}-rank{RANK}.log")
HANG = os.path.join(LOGDIR, f"plexgt-mpi-n{WORLD}-rank{RANK}.hang")
DUMP_BEFORE_S = 10.0
"""How long before pytest-timeout's limit (which exits the rank) the stacks are dumped."""
DEADLINE_ENV = "PLEXGT_TEST_DEADLINE"
"""Unix time at which something outside kills the whole job (``make test``'s ``timeout``): a
hang late in the run, whose own test limit lies beyond it, is dumped before it too."""
FAILED_RANK_WAIT_ENV = "PLEXGT_TEST_FAILED_RANK_WAIT_S"
"""Seconds a failed rank waits for the others before it ends the job (default: until the
stack dump); the harness's own tests shorten it."""


@dataclass
class _Session:
    sync: Any
    """COMM_WORLD's duplicate the ranks meet on after each test."""
    hang: TextIO
    """This rank's stack dump file."""


_SESSION = pytest.StashKey[_Session]()
_FAILURES = pytest.StashKey[list[str]]()
_OTHERS = pytest.StashKey[list[str]]()
_STARTED = pytest.StashKey[float]()
_LIMIT = pytest.StashKey[float]()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    os.makedirs(LOGDIR, exist_ok=True)
    if RANK > 0:
        from _pytest._io import TerminalWriter

        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            # line-buffered: a rank killed by the job's end still leaves what it reported
            reporter._tw = TerminalWriter(open(LOG, "w", buffering=1))  # noqa: SIM115
    if WORLD > 1:
        config.stash[_SESSION] = _Session(MPI.COMM_WORLD.Dup(), open(HANG, "w"))  # noqa: SIM115


def pytest_unconfigure(config: pytest.Config) -> None:
    s = config.stash.get(_SESSION, None)
    if s is not None:
        faulthandler.cancel_dump_traceback_later()
        s.hang.close()
        s.sync.Free()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if RANK > 0 and exitstatus not in (0, 5):
        sys.stderr.write(f"rank {RANK}: tests failed (exit {exitstatus}); report in {LOG}\n")


def timeout_s(item: pytest.Item) -> float:
    """pytest-timeout's limit for ``item``, resolved in its order (the mark, --timeout,
    PYTEST_TIMEOUT, the ini value; 0: none): the stack dump must come before it."""
    mark = item.get_closest_marker("timeout")
    if mark is not None and (mark.args or "timeout" in mark.kwargs):
        value = mark.args[0] if mark.args else mark.kwargs["timeout"]
    else:
        value = item.config.getvalue("timeout")
        if value is None:
            value = os.environ.get("PYTEST_TIMEOUT") or item.config.getini("timeout")
    return float(value or 0)


def time_left_s(item: pytest.Item) -> float:
    """Seconds until this test is ended from outside: its pytest-timeout limit, or the job's
    deadline (:data:`DEADLINE_ENV`) if sooner; 0: neither."""
    limit = timeout_s(item)
    deadline = os.environ.get(DEADLINE_ENV)
    if deadline:
        left = max(float(deadline) - time.time(), DUMP_BEFORE_S + 1.0)
        limit = min(limit, left) if limit > 0 else left
    return limit


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201
    """Arm the stack dump of this test: the file holds the test's name and, once the dump
    fires, the stacks; it is emptied when the test ends, so only a test the job died in
    leaves one (not a slow test that then passed)."""
    s = item.config.stash.get(_SESSION, None)
    item.stash[_STARTED] = time.monotonic()
    limit = item.stash[_LIMIT] = time_left_s(item)
    if s is not None and limit > 0:
        s.hang.seek(0)
        s.hang.truncate()
        s.hang.write(f"{item.nodeid}\n")
        s.hang.flush()
        faulthandler.dump_traceback_later(max(limit - DUMP_BEFORE_S, 1.0), file=s.hang)
    yield
    if s is not None and limit > 0:
        faulthandler.cancel_dump_traceback_later()
        s.hang.seek(0)
        s.hang.truncate()


def _to_stderr(config: pytest.Config, text: str) -> None:
    """Past pytest's capture: every rank's stderr reaches mpiexec's."""
    capman = config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled():
        sys.stderr.write(text)
        sys.stderr.flush()


def _wait_deadline(item: pytest.Item) -> float:
    """When a failed rank stops waiting for the others: just before the stack dump (sooner
    would end a job whose other ranks are only slow), or after the environment's seconds."""
    if os.environ.get(FAILED_RANK_WAIT_ENV):
        return time.monotonic() + float(os.environ[FAILED_RANK_WAIT_ENV])
    limit = item.stash.get(_LIMIT, 0.0)
    if limit <= 0:
        return time.monotonic() + 60.0
    return item.stash[_STARTED] + limit - DUMP_BEFORE_S - 1.0


def _meet(item: pytest.Item, s: _Session, mine: list[str]) -> list[list[str]]:
    """Every rank's failures of ``item`` (collective on the session's own communicator); a
    rank with failures that the others do not join by :func:`_wait_deadline` ends the job."""
    # the failure counts, sleep-polled: a blocking collective spins, and on oversubscribed
    # cores the spinning ranks delay the ones still on their way; messages only on a failure
    counts = np.zeros(WORLD, dtype=np.int64)
    req = s.sync.Iallgather(np.array([len(mine)], dtype=np.int64), counts)
    if not wait_request(req, deadline=_wait_deadline(item) if mine else None):
        msg = (f"rank {RANK}: {item.nodeid} failed here ({'; '.join(mine)}) and the other "
               "ranks have not finished it (they wait in one of its collectives for this "
               "rank?): ending the job")
        item.config.get_terminal_writer().line(msg)  # rank > 0: its log, kept
        _to_stderr(item.config, msg + "\n")
        time.sleep(1.0)  # for mpiexec to pass the line on before the abort kills the job
        MPI.COMM_WORLD.Abort(1)
    if not counts.any():
        return [[] for _ in range(WORLD)]
    return s.sync.allgather(mine)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The meeting, before the fixtures' finalizers (one may wait in a collective)."""
    s = item.config.stash.get(_SESSION, None)
    if s is None:
        return
    everyone = _meet(item, s, item.stash.get(_FAILURES, []))
    item.stash[_OTHERS] = [f"rank {r}: {'; '.join(f)}" for r, f in enumerate(everyone)
                           if f and r != RANK]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201
    """Keeps this rank's failures for the meeting (a rank > 0 also names them on stderr at
    once); a rank that passed reports the others' as its own teardown error."""
    outcome = yield
    if item.config.stash.get(_SESSION, None) is None:
        return
    rep = outcome.get_result()
    mine = item.stash.setdefault(_FAILURES, [])
    if rep.failed:
        crash = getattr(rep.longrepr, "reprcrash", None)
        text = (crash.message if crash is not None else rep.longreprtext).strip().splitlines()
        why = f"{rep.when}: {text[0] if text else rep.outcome}"
        mine.append(why)
        if RANK > 0:
            _to_stderr(item.config, f"rank {RANK}: FAILED {item.nodeid} ({why}); report in "
                                    f"{LOG}\n")
    others = item.stash.get(_OTHERS, [])
    if rep.when == "teardown" and others and not mine:
        rep.outcome = "failed"
        rep.longrepr = "failed on other ranks:\n" + "\n".join(others)
