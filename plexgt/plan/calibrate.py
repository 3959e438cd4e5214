"""A quick built-in calibration of a CPU host: what the planners price with when no profile,
machine description or configured profile says otherwise.

Why: the default coefficients are one machine's guesses (on the 2-core VM they put one rank 3.6x
to 18x too slow and ranked 2 ranks fastest where 1 was), and ``plexgt profile`` is a separate
step a new user does not know to take. This is the same measurement, a subset sized to take
seconds:

* kernels (:func:`plexgt.plan.kernel_samples.kernel_samples`, quick sizes, two passes) on one
  thread in this process, and the speedup of 2, 4, ... threads up to the usable cores
  (``os.sched_getaffinity``): the whole-step calibration both planners read included;
* collectives and contention on two worker processes (gloo over a FileStore in a scratch
  directory, one thread each): the collective curves of a group of 2, and the sustained
  kernel-mix slowdown of 2 ranks at once and the wait a collective adds between busy phases
  (:func:`plexgt.plan.measure.profile_loaded`). Ranks beyond the usable cores are not
  measured but priced from the core count (:meth:`plexgt.plan.host.Host.slowdown`: time-shared
  cores, at least ranks·threads/cores, and collectives' bytes shared likewise), which
  :attr:`Calibration.note` says: four workers on the 2-core VM took 11-22 s (their imports
  alone ~6 s of CPU), two 4-5 s, under other users' load.

The result is a system profile (:func:`plexgt.plan.profile.check_profile` reads it), cached in
``$PLEXGT_CACHE_DIR``, else ``$XDG_CACHE_HOME/plexgt`` (else ``~/.cache/plexgt``), under a
file named by the host's key
(CPU model, usable cores, torch version, threads a rank was measured with, this format's
version): written atomically, never through a symlink, read with :mod:`json` alone.
``PLEXGT_NO_CALIBRATE=1`` (or ``parallel.calibrate = false``, ``plan --no-calibrate``) turns
it off: default coefficients again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

import plexgt
from plexgt.ops import native
from plexgt.plan.kernel_samples import kernel_samples
from plexgt.plan.measure import (
    cpu_model,
    profile_collectives,
    profile_kernels,
    profile_loaded,
    speedup_steps,
    thread_speedup,
)
from plexgt.plan.profile import (
    FORMAT,
    OPS,
    VERSION,
    check_profile,
    fit_kernels,
    fit_linear,
    fit_plexus_coefficients,
)

CALIBRATION_VERSION = 2
"""Bumped when what the calibration measures changes: older cache files are then ignored (2:
the SpMM samples carry their output rows, for the per-call and per-row·column fit)."""
OFF_ENV = "PLEXGT_NO_CALIBRATE"
"""Set (to anything but '', '0'): no calibration, default coefficients (the test suite sets it:
its plans must not depend on the machine's load)."""
BASE_THREADS = 1
"""Threads a rank's kernels are timed with; more threads are priced by the measured speedup."""
WORKERS = 2
"""Worker processes the collective and contention measurement starts."""
WORKER_TIMEOUT_S = 60.0
"""A worker measurement that takes longer is abandoned (collectives then default, contention
from the core count); on the 2-core VM it takes 4-5 s."""
COLLECTIVE_BYTES = [1 << 12, 1 << 16, 1 << 20]
"""Message sizes the workers time each collective at (``plexgt profile --quick``'s)."""


class CalibrationError(ValueError):
    """The cache cannot be used safely (a symlink plexgt did not make); names the path."""


@dataclass(frozen=True)
class Calibration:
    """A quick calibration's profile and where it came from."""

    profile: dict[str, Any]
    path: Path | None
    """The cache file it was read from or written to (None: not cached)."""
    cached: bool
    """Read from the cache (not measured by this call)."""
    note: str = ""
    """What was not measured (contention beyond the cores derived, collectives at defaults),
    or why the cache was not written."""

    def describe(self) -> str:
        """How a plan names its coefficients."""
        where = (f"cached at {self.path}" if self.cached else
                 f"measured in {self.profile.get('seconds', 0):.1f} s"
                 + (f", cached at {self.path}" if self.path else ""))
        return f"quick calibration of this host ({where}{'; ' + self.note if self.note else ''})"


def disabled(env: Mapping[str, str] = os.environ) -> bool:
    """Whether :data:`OFF_ENV` turns the calibration off."""
    return env.get(OFF_ENV, "") not in ("", "0")


def applies(device: torch.device | None = None, env: Mapping[str, str] = os.environ) -> bool:
    """Whether a plan without a profile calibrates: on CPU hosts (``device`` CPU, or None and
    no CUDA device), unless :func:`disabled`. GPUs keep the defaults: their kernels are what the
    defaults and machine descriptions describe, and timing them needs the GPU a job holds."""
    if disabled(env):
        return False
    if device is not None:
        return device.type == "cpu"
    return not torch.cuda.is_available()


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask: what a job's launcher gave it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1


def host_key() -> dict[str, Any]:
    """What a calibration is valid for: the CPU, the usable cores, torch, the threads a rank
    was measured with, and this format."""
    return {"cpu": cpu_model(), "cores": usable_cores(), "torch": torch.__version__,
            "threads_per_rank": BASE_THREADS, "calibration": CALIBRATION_VERSION}


CACHE_ENV = "PLEXGT_CACHE_DIR"


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``$PLEXGT_CACHE_DIR``, else ``$XDG_CACHE_HOME/plexgt``, else ``~/.cache/plexgt``
    (``PLEXGT_CACHE_DIR`` moves plexgt's cache alone: moving ``XDG_CACHE_HOME`` moves
    torch's compiled-extension cache too, which then rebuilds, ~60 s)."""
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV])
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "plexgt"


def cache_path(key: dict[str, Any], env: Mapping[str, str] = os.environ) -> Path:
    """The cache file of ``key``: a different host, torch or format is a different file."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir(env) / f"calibration-{digest}.json"


def _refuse_symlink(path: Path) -> None:
    """CalibrationError when ``path`` (the cache file or its directory) is a symlink: plexgt
    makes neither as one, so someone else did, and following it could read or overwrite a
    file of theirs."""
    if path.is_symlink():
        raise CalibrationError(f"{path}: is a symlink, which plexgt never makes; not reading or "
                               f"writing the calibration cache through it (remove it)")


def read_cache(path: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The cached profile at ``path`` when it is one of ``key`` (None: absent, another key,
    or unreadable: calibrate again). A symlink is refused (:class:`CalibrationError`)."""
    _refuse_symlink(path.parent)
    _refuse_symlink(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CalibrationError(f"{path}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise CalibrationError(f"{path}: not a regular file")
        text = f.read()
    try:
        prof = check_profile(json.loads(text.decode("utf-8")), str(path))
    except ValueError:  # cut short, edited or another version's: measure again
        return None
    return prof if prof.get("calibration_key") == key else None


def write_cache(path: Path, prof: dict[str, Any]) -> None:
    """``prof`` at ``path``, atomically (a temporary file in the same directory, then
    renamed over it: a reader sees the old file or the new one; a rename replaces a link,
    it never writes through one). The directory is made private (0700) when plexgt makes it."""
    _refuse_symlink(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _refuse_symlink(path.parent)
    _refuse_symlink(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(prof, indent=1) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def calibration(env: Mapping[str, str] = os.environ, workers: bool = True,
                announce: Callable[[], None] | None = None) -> Calibration:
    """This host's calibration: the cached one of its key, else measured now and cached.

    A cache path that is a symlink is not used (measured, not cached, and the note says
    why); a cache directory that cannot be written leaves the calibration uncached.
    ``announce`` is called before measuring (a command says why it waits)."""
    key = host_key()
    path = cache_path(key, env)
    try:
        prof = read_cache(path, key)
    except CalibrationError as e:
        if announce:
            announce()
        prof, note = measure(key, workers)
        return Calibration(prof, None, False, "; ".join(x for x in (note, f"not cached: {e}")
                                                        if x))
    if prof is not None:
        return Calibration(prof, path, True, prof.get("calibration_note", ""))
    if announce:
        announce()
    load = busy(key["cores"])
    prof, note = measure(key, workers)
    if load is not None:
        # timings taken while other work held the cores would be reused on every later
        # plan: a busy host's calibration serves this plan alone (one taken under load 20 on
        # the 2-core VM measured 2 threads 0.45x as fast as 1, and priced 1 rank 3x slow)
        return Calibration(prof, None, False, "; ".join(x for x in (
            note, f"not cached: the host was busy (1-minute load {load:.1f} on "
            f"{key['cores']} cores); plan again when it is quiet, or run plexgt profile")
            if x))
    try:
        write_cache(path, prof)
    except (CalibrationError, OSError) as e:
        msg = str(e) if isinstance(e, CalibrationError) else f"{path}: {e.strerror or e}"
        return Calibration(prof, None, False, "; ".join(x for x in (note, f"not cached: {msg}")
                                                        if x))
    return Calibration(prof, path, False, note)


def busy(cores: int) -> float | None:
    """The 1-minute load average where other work held at least this host's usable cores
    before the calibration started (its timings would measure that work), else None."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform: nothing to judge by
        return None
    return load if load >= cores else None


def measure(key: dict[str, Any], workers: bool = True) -> tuple[dict[str, Any], str]:
    """(the quick calibration as a system profile, what it did not measure)."""
    native.load()  # a build of the CPU kernels must not run inside the timings (measure.py)
    t0 = time.perf_counter()
    cores = key["cores"]
    device = torch.device("cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(BASE_THREADS)
    try:
        samples = kernel_samples(device, quick=True)
        raw = profile_kernels(samples, device, 2)
        speed = thread_speedup(device, BASE_THREADS, cores, speedup_steps(samples))
        del samples
    finally:
        torch.set_num_threads(threads)
    n = WORKERS
    ranks = run_workers(n) if workers and n >= 2 else None
    notes = []
    if ranks is None:
        coll: dict[str, dict[str, list[list[float]]]] = {op: {} for op in OPS}
        loaded: dict[str, dict[str, float]] = {}
        notes.append("collectives at default coefficients and the slowdown of ranks at once "
                     "from the core count (not measured)")
    else:
        coll, loaded = ranks["collectives"], ranks["loaded"]
        if n <= cores:
            notes.append(f"ranks beyond the {cores} cores: their slowdown derived from the "
                         f"core count (ranks/cores), not measured")
    note = "; ".join(notes)
    kfits = fit_kernels(raw)
    cfits = {op: {s: fit_linear(rows) for s, rows in by.items()} for op, by in coll.items()}
    prof: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "kind": "quick-calibration",
        "calibration_key": key, "calibration_note": note,
        "hardware": {"cpu": key["cpu"], "cores": cores, "device": "cpu", "gpu": None,
                     "rocm": False},
        "software": {"torch": torch.__version__, "backend": "gloo",
                     "threads_per_rank": BASE_THREADS},
        "world_size": n if ranks is not None else 1, "ranks_per_node": n,
        "collectives": coll, "collective_fits": cfits, "kernels": raw, "kernel_fits": kfits,
        "contention": {"1": 1.0, **{s: v["contention"] for s, v in loaded.items()}},
        "loaded": loaded, "thread_speedup": speed,
    }
    prof["plexus"] = fit_plexus_coefficients(kfits, cfits)
    prof["seconds"] = round(time.perf_counter() - t0, 2)
    return check_profile(prof, "quick calibration"), note


def run_workers(n: int, timeout_s: float = WORKER_TIMEOUT_S) -> dict[str, Any] | None:
    """Collectives and contention measured on ``n`` worker processes (:func:`worker`): their
    result, or None when they failed or ran past ``timeout_s`` (killed, by their ids)."""
    scratch = Path(tempfile.mkdtemp(prefix="plexgt-calibrate-"))
    out = scratch / "result.json"
    pkg = str(Path(plexgt.__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "MPI_", "HYDRA_", "OMPI_", "SLURM_STEP"))}
    env.update(OMP_NUM_THREADS=str(BASE_THREADS), PLEXGT_NO_MPI="1",
               PYTHONPATH=os.pathsep.join(x for x in (pkg, env.get("PYTHONPATH", "")) if x))
    procs = [subprocess.Popen([sys.executable, "-c",
                               "import sys; from plexgt.plan.calibrate import worker; "
                               "worker(*sys.argv[1:])", str(r), str(n), str(scratch / "store"),
                               str(out)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
             for r in range(n)]
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        if any(p.returncode for p in procs) or not out.is_file():
            return None
        return json.loads(out.read_text())
    except (subprocess.TimeoutExpired, ValueError, OSError):
        return None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(scratch, ignore_errors=True)


def worker(rank: str, world: str, store: str, out: str) -> None:
    """One of :func:`run_workers`' processes: a gloo group over a FileStore, the collectives
    of ``plexgt profile --quick`` and its loaded run; rank 0 writes the result to ``out``."""
    r, n = int(rank), int(world)
    torch.set_num_threads(BASE_THREADS)
    dist.init_process_group("gloo", store=dist.FileStore(store, n), rank=r, world_size=n,
                            timeout=timedelta(seconds=WORKER_TIMEOUT_S))
    ctx = SimpleNamespace(rank=r, world_size=n, device=torch.device("cpu"), backend="gloo",
                          local_size=n)
    try:
        coll = profile_collectives(ctx, COLLECTIVE_BYTES, 3)
        dist.barrier()
        loaded = profile_loaded(ctx, 4, 3)
        if r == 0:
            tmp = Path(out + ".tmp")
            tmp.write_text(json.dumps({"collectives": coll, "loaded": loaded}))
            tmp.replace(out)
    finally:
        dist.destroy_process_group()
