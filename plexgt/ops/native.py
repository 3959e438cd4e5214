"""Compiled CPU kernels of the sparse attention (``csrc/attention_cpu.cpp``), built on first use.

Why compiled: torch's CPU sparse kernels make the softmax and the transposed products
separate passes over [h, E] (segment reductions, index_selects, elementwise ops) around one
sampled_addmm and one SpMM per head; the fused kernels do each product in one pass
(:mod:`plexgt.ops.csrc`, measured in ``perf/bench_attention.py``).

The extension is compiled with the host's instruction set, so the build name carries a hash of
the CPU's flags: a home directory shared by login and compute nodes of different generations
keeps one build per ISA. ``make install`` builds it ahead (``python -m plexgt.ops.native``) so
no rank of a job pays the ~30 s compile; ranks of a job that do build it wait for one of them
(plexgt's flock in the build directory, which a killed build cannot leave held). Where no
compiler is present the build fails once per process with a warning and
:mod:`plexgt.ops.attention` keeps torch's kernels. ``PLEXGT_NATIVE=0`` turns the
kernels off (for comparisons, or a machine whose compiler misbehaves).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import re
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
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


BUILD_LOCK = "plexgt-build.lock"
"""plexgt's own lock in an extension's build directory, held (flock) around torch's build."""
BUILD_WAIT_S = 900.0
"""The most a process waits for another's live build (~30 s on 2 cores) before it gives up and
:func:`load` falls back to torch's kernels: a hung compiler must not hang the job."""
STALE_LOCK_S = 600.0
"""Where the filesystem has no flock: a torch build lock older than this is left over from a
killed build (nothing else tells a live build's lock from a dead one's there)."""


@contextlib.contextmanager
def _build_lock(build_dir: Path) -> Iterator[None]:
    """Hold plexgt's build lock on ``build_dir`` while torch builds there.

    Why: torch's lock is a file created with O_EXCL and removed when the build ends; a build
    killed in between (a preempted job) leaves it, and every later load waited in torch's
    silent poll until :data:`STALE_LOCK_S` had passed. An flock is dropped by the kernel when
    its holder dies, so it cannot go stale, and whoever holds it knows that a torch lock in the
    directory belongs to a dead build (every plexgt build holds this one around torch's):
    removed at once. Waiting for a live build is said on stderr, in one line.
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / BUILD_LOCK, "a") as guard:
        if not _flock(guard, build_dir):  # no flock on this filesystem: the lock's age decides
            _wait_for_lock(build_dir / "lock")
            yield
            return
        lock = build_dir / "lock"
        if lock.exists():
            sys.stderr.write(f"plexgt: removing the build lock a killed build left in "
                             f"{build_dir}\n")
            lock.unlink(missing_ok=True)
        yield  # the flock goes with the file


def _flock(guard: Any, build_dir: Path) -> bool:
    """Take ``guard``'s exclusive flock, waiting up to :data:`BUILD_WAIT_S` for a live build
    (TimeoutError after); False where the filesystem does not lock."""
    try:
        fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    except OSError:  # ENOLCK, ENOSYS, EINVAL: no flock here (a Lustre mount without -o flock)
        return False
    sys.stderr.write(f"plexgt: waiting for another process building the compiled kernels in "
                     f"{build_dir} (at most {BUILD_WAIT_S:.0f} s)\n")
    deadline = time.monotonic() + BUILD_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            continue
    raise TimeoutError(f"{build_dir}: another process is still building after "
                       f"{BUILD_WAIT_S:g} s")


def _wait_for_lock(lock: Path) -> None:
    """Without flock: wait (saying so, once) while a torch lock younger than
    :data:`STALE_LOCK_S` exists; clear one older (:func:`_clear_stale_lock`)."""
    said = False
    while lock.exists():
        _clear_stale_lock(lock)
        if not lock.exists():
            return
        if not said:
            sys.stderr.write(f"plexgt: waiting for the build lock {lock} (another build, or "
                             f"a killed one's: cleared once {STALE_LOCK_S:.0f} s old)\n")
            said = True
        time.sleep(0.5)


def _clear_stale_lock(lock: Path) -> None:
    """Remove a torch build lock too old to belong to a live build (see _wait_for_lock)."""
    try:
        st = lock.stat()
    except OSError:
        return
    if time.time() - st.st_mtime <= STALE_LOCK_S:
        return
    # only if it is still that file, so a lock a live build has just made is never removed
    try:
        now = lock.stat()
    except OSError:
        return
    if (now.st_ino, now.st_mtime) == (st.st_ino, st.st_mtime):
        warnings.warn(f"plexgt: removing stale build lock {lock} "
                      f"({time.time() - st.st_mtime:.0f} s old)", RuntimeWarning, stacklevel=3)
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
    default) and import it; raises what the compiler raised. Built under plexgt's build lock
    (:func:`_build_lock`: a dead build's lock is cleared at once) with ninja on PATH: every
    build (this module's, an ISA test's, a benchmark's A/B) goes through here, so none hangs
    on another's stale lock."""
    from torch.utils.cpp_extension import _get_build_directory
    from torch.utils.cpp_extension import load as torch_load

    _ninja_on_path()
    with _build_lock(Path(_get_build_directory(name, verbose=False))):
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
