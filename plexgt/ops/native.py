"""Compiled CPU kernels of the sparse attention (``csrc/attention_cpu.cpp``), built on first use.

Why compiled: torch's CPU sparse kernels make the softmax and the transposed products
separate passes over [h, E] (segment reductions, index_selects, elementwise ops) around one
sampled_addmm and one SpMM per head; the fused kernels do each product in one pass
(:mod:`plexgt.ops.csrc`, measured in ``perf/bench_attention.py``).

The extension is compiled with the host's instruction set, so the build name carries a hash of
the CPU's flags: a home directory shared by login and compute nodes of different generations
keeps one build per ISA. ``make install`` builds it ahead (``python -m plexgt.ops.native``) so
no rank of a job pays the ~30 s compile; ranks of a job that do build it wait on torch's lock
in the build directory. Where no compiler is present the build fails once per process with a
warning and :mod:`plexgt.ops.attention` keeps torch's kernels. ``PLEXGT_NATIVE=0`` turns the
kernels off (for comparisons, or a machine whose compiler misbehaves).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import re
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

SOURCE = Path(__file__).with_name("csrc") / "attention_cpu.cpp"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++20"]
WIDTHS = (8, 16, 32, 64)
"""Head widths d' with compiled kernels (others use torch's)."""

_state: dict[str, Any] = {}


def cpu_flags_line() -> str:
    """The CPU's feature line of /proc/cpuinfo (``flags`` on x86, ``Features`` on Arm); ''
    where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def _isa_tag() -> str:
    """Hash of what -march=native compiles for and of where the build's inputs live: the CPU's
    flag list, the machine type, the source file and the torch it compiles against. torch
    rebuilds an extension whenever its build file changes, and that file names the source's
    and torch's paths: two checkouts or venvs sharing one cache under a single name would
    rebuild (a minute on 2 cores) each time the other had run."""
    where = f"{SOURCE.resolve()}|{Path(torch_include_root()).resolve()}"
    return hashlib.sha1((platform.machine() + cpu_flags_line() + where).encode()
                        ).hexdigest()[:10]


def torch_include_root() -> str:
    """The directory of the torch whose headers the extension compiles against."""
    return str(Path(torch.__file__).parent)


STALE_LOCK_S = 600.0
"""A build lock older than this is left over from a killed build (a build takes ~30 s)."""


def _clear_stale_lock(lock: Path) -> None:
    """torch waits forever on the lock file of a build that was killed (a preempted job);
    remove one too old to belong to a live build, so the next job builds instead of hanging."""
    try:
        st = lock.stat()
    except OSError:
        return
    if time.time() - st.st_mtime <= STALE_LOCK_S:
        return
    # many ranks may find the same stale lock: one at a time (a guard file of our own), and
    # only if it is still that file, so a lock a live build has just made is never removed
    with open(lock.with_name("plexgt-lock-guard"), "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            now = lock.stat()
        except OSError:
            return
        if (now.st_ino, now.st_mtime) == (st.st_ino, st.st_mtime):
            warnings.warn(f"plexgt: removing stale build lock {lock} "
                          f"({time.time() - st.st_mtime:.0f} s old)", RuntimeWarning,
                          stacklevel=3)
            lock.unlink(missing_ok=True)


def _ninja_on_path() -> None:
    """torch builds with ``ninja`` from PATH. pip's ninja (an install requirement) sits beside
    the interpreter, which a batch job's PATH need not include, and a system ninja of another
    version reads the build log's command hashes as changed: processes alternating between the
    two rebuilt the kernels every time (a minute on 2 cores). The one beside the interpreter
    goes first whenever it exists."""
    here = Path(sys.executable).parent
    path = os.environ.get("PATH", "")
    if (here / "ninja").exists():
        if shutil.which("ninja") != str(here / "ninja"):
            os.environ["PATH"] = str(here) + os.pathsep + path
    elif shutil.which("ninja") is None:
        os.environ["PATH"] = str(here) + os.pathsep + path


OPENMP_RUNTIMES = re.compile(r"lib(gomp|iomp5|omp)[-.][^/\s]*so[^/\s]*$")


def openmp_runtimes(maps: str | None = None) -> list[str]:
    """Paths of the OpenMP runtimes mapped into this process (``/proc/self/maps``, or the text
    ``maps``). The extension links ``libgomp.so.1``, which resolves to torch's own copy where
    torch ships one under that name; a torch that ships a renamed one (``libgomp-<hash>.so``)
    would get a second runtime beside it, each with its own thread pool."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    paths = (f[5] for f in map(str.split, maps.splitlines()) if len(f) >= 6)
    return sorted({p for p in paths if OPENMP_RUNTIMES.search(p)})


def enabled() -> bool:
    """Whether the kernels may be used at all (``PLEXGT_NATIVE`` is not ``0``)."""
    return os.environ.get("PLEXGT_NATIVE", "1") != "0"


def build(name: str, flags: list[str] | None = None, source: Path = SOURCE,
          verbose: bool = False) -> Any:
    """Compile ``source`` as the torch extension ``name`` (``flags``: :data:`FLAGS` by
    default) and import it; raises what the compiler raised. A dead build's lock is cleared
    first and ninja put on PATH: every build (this module's, an ISA test's, a benchmark's
    A/B) goes through here, so none hangs on another's stale lock."""
    from torch.utils.cpp_extension import _get_build_directory
    from torch.utils.cpp_extension import load as torch_load

    _clear_stale_lock(Path(_get_build_directory(name, verbose=False)) / "lock")
    _ninja_on_path()
    return torch_load(name, [str(source)], extra_cflags=FLAGS if flags is None else flags,
                      extra_ldflags=["-fopenmp"], verbose=verbose)


def load(verbose: bool = False) -> Any | None:
    """The compiled module, building it if needed; None where disabled or the build fails
    (warned about once per process)."""
    if not enabled():
        return None
    if "module" in _state:
        return _state["module"]
    module = None
    try:
        module = build(f"plexgt_attention_cpu_{_isa_tag()}", verbose=verbose)
    except Exception as exc:  # no compiler, no headers, ...: torch's kernels still work
        lines = str(exc).strip().splitlines()
        why = lines[-1] if lines else type(exc).__name__
        warnings.warn(f"plexgt: compiled attention kernels unavailable ({why}); using torch's "
                      "sparse kernels", RuntimeWarning, stacklevel=2)
    runtimes = openmp_runtimes() if module is not None else []
    if len(runtimes) > 1:
        warnings.warn("plexgt: more than one OpenMP runtime is loaded (" + ", ".join(runtimes)
                      + "): their thread pools can oversubscribe the cores; set "
                      "OMP_NUM_THREADS per rank, or PLEXGT_NATIVE=0", RuntimeWarning,
                      stacklevel=2)
    _state["module"] = module
    return module


def main() -> int:
    """Build now (``make install``); report where the kernels stand. Never fails the install."""
    mod = load()
    if mod is None:
        why = "disabled by PLEXGT_NATIVE=0" if not enabled() else "build failed (see warning)"
        print(f"plexgt native attention kernels: not available, {why}; torch's kernels are used")
    else:
        print(f"plexgt native attention kernels: ready ({Path(mod.__file__).parent})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
