"""Suite-wide set-up that must precede every import of plexgt.

Without a GPU, Triton kernels run under Triton's CPU interpreter: the flag is read when a
kernel is decorated, so it is set here, before any test module imports
:mod:`plexgt.ops.attention_triton`. On a GPU machine the kernels are compiled for real. The
planner's quick host calibration is off and its cache in a scratch directory (below).
"""

import atexit
import os
import shutil
import tempfile

import pytest
import torch
from xdist.scheduler import LoadScopeScheduling

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Plans in the suite use the default coefficients: a quick calibration of the host
# (plexgt.plan.calibrate) would make every planned layout depend on the machine's load and
# cost seconds per test process. Its own tests turn it back on, and whatever a test caches
# goes to a scratch directory, never the real ~/.cache (subprocesses inherit both). Only
# plexgt's cache moves: moving XDG_CACHE_HOME would move torch's compiled-extension cache
# too, and every test process would rebuild plexgt's C++ kernels (~60 s each).
os.environ["PLEXGT_NO_CALIBRATE"] = "1"
os.environ["PLEXGT_CACHE_DIR"] = tempfile.mkdtemp(prefix="plexgt-test-cache-")
atexit.register(shutil.rmtree, os.environ["PLEXGT_CACHE_DIR"], True)


# The Slurm tests share one local Slurm cluster (a session fixture per xdist worker), so they
# must all run on one worker. pytest-xdist's --dist loadgroup groups by rewriting node ids,
# which pytest 9.2 ignores (pytest-dev/pytest-xdist#1386): its groups silently spread over the
# workers, two clusters with the same node name started at once, and the Slurm jobs of both
# failed. The scheduler below groups by path, which needs nothing from the node id's suffix.
ONE_WORKER_DIRS = ("tests/slurm/",)


class _GroupByDirectory(LoadScopeScheduling):
    """Every test under one of ONE_WORKER_DIRS in one unit of work (in file order, on one
    worker); every other test a unit of its own (spread test by test, as --dist load)."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return next((d for d in ONE_WORKER_DIRS if path.startswith(d)), nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadScopeScheduling | None:
    """--dist loadgroup (make test) takes the path-grouping scheduler; other modes stay."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return _GroupByDirectory(config, log)


NUMERICS_ENV = ("CUBLAS_WORKSPACE_CONFIG", "MKL_CBWR")


@pytest.fixture(autouse=True)
def _restore_numerics():
    """Undo what a run's ``apply_numerics`` set in this process, after every test.

    A run owns its process, so ``plexgt train --deterministic`` sets torch's switches for good;
    a test that trains in-process would pass them on to whatever runs next on its xdist worker.
    Deterministic mode changes which kernels run and so what a step allocates: the gt/gps
    peak-memory test counts an [N, hidden] tensor less under it."""
    det = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    env = {k: os.environ.get(k) for k in NUMERICS_ENV}
    yield
    torch.use_deterministic_algorithms(det, warn_only=warn_only)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
