"""Multi-rank tests: run as ``mpiexec -n N python -m mpi4py -m pytest tests/mpi``.

Every rank runs the same tests in the same order (collectives must match). Rank 0 reports to
the terminal; the other ranks write their report to a per-rank log and print its path when
they fail, so the job's output stays readable. With one rank (plain ``pytest``) it all runs
as a trivial world of size 1.

A test that fails on some ranks only is the dangerous case: those ranks move on to the next
test while the others still wait in a collective of this one, and from there on every
collective meets the wrong partner, so the job hangs far from the cause (rank 0's stack then
names an innocent later test). So after each test every rank meets the others on a
communicator of its own (the tests' collectives cannot match it): a failure anywhere fails the
test on rank 0 too, naming the rank and its error; a failed rank that the others never join
(they wait for it in a collective) ends the job at once with that error on stderr. A real hang
leaves each rank's stacks in ``plexgt-mpi-n{N}-rank{R}.hang`` (dumped shortly before
pytest-timeout ends the job), which ``make test`` prints.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import time

import pytest
from mpi4py import MPI

from plexgt.distributed.grid import factorizations

WORLD = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()

_LOGDIR = os.environ.get("PLEXGT_TEST_LOGDIR") or tempfile.gettempdir()
_log = os.path.join(_LOGDIR, f"plexgt-mpi-n{WORLD}-rank{RANK}.log")
_hang = os.path.join(_LOGDIR, f"plexgt-mpi-n{WORLD}-rank{RANK}.hang")
# the per-test meeting's own communicator, and how long a failed rank waits there for the others
_SYNC = MPI.COMM_WORLD.Dup() if WORLD > 1 else None
_FAILED_RANK_WAIT_S = float(os.environ.get("PLEXGT_TEST_FAILED_RANK_WAIT_S", "60"))
# stacks are dumped this long before pytest-timeout's limit (which then exits the rank)
_DUMP_BEFORE_S = 10.0
_failures = pytest.StashKey[list]()
_hang_key = pytest.StashKey[object]()


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if RANK > 0:
        from _pytest._io import TerminalWriter

        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            # line-buffered: a rank killed by the job's end still leaves what it reported
            reporter._tw = TerminalWriter(open(_log, "w", buffering=1))  # noqa: SIM115
    if WORLD > 1:
        config.stash[_hang_key] = open(_hang, "w")  # noqa: SIM115 - lives for the run


def _timeout_s(item: pytest.Item) -> float:
    """pytest-timeout's limit for ``item``: its ``timeout`` mark, else the ini value."""
    mark = item.get_closest_marker("timeout")
    if mark is not None and mark.args:
        return float(mark.args[0])
    return float(item.config.getini("timeout") or 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Arm a dump of this rank's stacks (to its ``.hang`` file) shortly before the timeout."""
    limit = _timeout_s(item)
    hang = item.config.stash.get(_hang_key, None)
    if hang is not None and limit > 0:
        faulthandler.dump_traceback_later(max(limit - _DUMP_BEFORE_S, 1.0), file=hang)
    yield
    if hang is not None and limit > 0:
        faulthandler.cancel_dump_traceback_later()


def _to_stderr(config, text: str) -> None:
    """Write to the job's stderr past pytest's capture (every rank's stderr reaches mpiexec)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled():
        sys.stderr.write(text)
        sys.stderr.flush()


def _meet(mine: list, config, nodeid: str) -> list:
    """Every rank's failures of this test (collective on ``_SYNC``). A rank with failures that
    the others do not join within ``_FAILED_RANK_WAIT_S`` ends the job."""
    req = _SYNC.Ibarrier()
    t0, pause = time.monotonic(), 5e-5
    while not req.Test():
        if mine and time.monotonic() - t0 > _FAILED_RANK_WAIT_S:
            msg = (f"rank {RANK}: {nodeid} failed here while the other ranks have not finished "
                   f"it in {_FAILED_RANK_WAIT_S:.0f} s (they wait in one of its collectives for "
                   "this rank?): ending the job")
            config.get_terminal_writer().line(msg)  # rank > 0: its log, kept
            _to_stderr(config, msg + "\n")
            time.sleep(1.0)  # for mpiexec to pass the line on before the abort kills the job
            MPI.COMM_WORLD.Abort(1)
        time.sleep(pause)
        pause = min(0.005, pause * 2)
    return _SYNC.allgather(mine)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """After the test's teardown every rank learns every rank's failures (see the module
    docstring); a rank that passed reports the others' as its own teardown error."""
    outcome = yield
    if _SYNC is None:
        return
    rep = outcome.get_result()
    mine = item.stash.setdefault(_failures, [])
    if rep.failed:
        crash = getattr(rep.longrepr, "reprcrash", None)
        text = (crash.message if crash is not None else rep.longreprtext).strip().splitlines()
        why = f"{rep.when}: {text[0] if text else rep.outcome}"
        mine.append(why)
        if RANK > 0:
            _to_stderr(item.config, f"rank {RANK}: FAILED {item.nodeid} ({why}); report in "
                                    f"{_log}\n")
    if rep.when != "teardown":
        return
    everyone = _meet(mine, item.config, item.nodeid)
    others = [f"rank {r}: {'; '.join(f)}" for r, f in enumerate(everyone) if f and r != RANK]
    if others and not mine:
        rep.outcome = "failed"
        rep.longrepr = "failed on other ranks:\n" + "\n".join(others)


# at 4, 6 and 8 ranks (6, 9 and 10 factorisations, oversubscribed 2-4x on the CI's 2 cores)
# the model-level tests run on these: every axis split > 1 in some grid, a 2D or 3D grid, and
# the shapes the issues name; PLEXGT_ALL_GRIDS=1 runs every factorisation
REPRESENTATIVE = {4: ("2x2x1", "1x2x2", "4x1x1", "1x1x4"),
                  6: ("3x2x1", "1x2x3", "2x1x3", "6x1x1"),
                  8: ("2x2x2", "4x2x1", "1x2x4", "8x1x1")}
# and the 20-step training curves (the slowest model tests) on two of them at 4 ranks, on
# one at 6 and 8 (a 2D and a 3D grid; the step tests cover the rest)
CURVES = {4: ("2x2x1", "1x1x4"), 6: ("1x2x3",), 8: ("2x2x2",)}
ALL_GRIDS = os.environ.get("PLEXGT_ALL_GRIDS") == "1"


def grids_for_world(every: bool = True, curves: bool = False) -> list:
    """Gx x Gy x Gz of the current world size (parametrises grid tests): all of them, or with
    ``every=False`` (whole-model tests) the representative ones at 6 and 8 ranks, or with
    ``curves=True`` (training curves) two of those."""
    grids = factorizations(WORLD)
    if every or ALL_GRIDS or WORLD not in REPRESENTATIVE:
        return grids
    keep = CURVES[WORLD] if curves else REPRESENTATIVE[WORLD]
    return [g for g in grids if str(g) in keep]


@pytest.fixture(scope="session")
def dist_ctx():
    from plexgt.distributed.bootstrap import init_distributed, shutdown

    ctx = init_distributed("gloo", timeout_s=120, abort_on_error=False)
    yield ctx
    shutdown(ctx)


@pytest.fixture(scope="session")
def grid_groups(dist_ctx):
    """``grid_groups(grid)``: the GridGroups of ``grid``, built once per session and grid.

    Groups are never freed by torch until teardown, and each gloo group holds threads and
    sockets: rebuilding them in every test oversubscribes a small machine badly.
    """
    from plexgt.distributed.grid import build_groups

    cache = {}

    def get(grid):
        if grid not in cache:
            cache[grid] = build_groups(grid, dist_ctx.rank, dist_ctx.world_size)
        return cache[grid]

    return get


def pytest_sessionfinish(session, exitstatus):
    if RANK > 0 and exitstatus not in (0, 5):
        sys.stderr.write(f"rank {RANK}: tests failed (exit {exitstatus}); report in {_log}\n")


def prepare_on_rank0(tmp_path_factory, name: str, make_graph, **options):
    """A PreparedGraph every rank opens: rank 0 prepares ``make_graph()`` (symmetrised, no
    progress output, ``options`` as PrepOptions fields) while the others sleep."""
    from plexgt.data.loader import PreparedGraph
    from plexgt.data.shard import PrepOptions, prepare
    from plexgt.data.source import MemorySource
    from plexgt.distributed.mpiwait import arrive

    comm = MPI.COMM_WORLD
    path = None
    if comm.rank == 0:
        path = tmp_path_factory.mktemp(name) / "prep"
        prepare(MemorySource(make_graph()), PrepOptions(out=path, symmetrize=True,
                                                        progress=False, **options))
    arrive(comm)
    return PreparedGraph(comm.bcast(path))

