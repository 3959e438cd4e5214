"""What every benchmark shares: where results and datasets are, the prepared-data cache, the
launch of plexgt jobs and of a benchmark's own workers (under mpiexec), the hardware
description, the RESULT line and the result files.

Launches run ``python -m plexgt`` and ``python -m perf.<bench>`` with the checkout's root
first on PYTHONPATH, so a job runs this checkout's plexgt whichever one the venv's console
script would find, and a worker finds the perf package wherever it is started from.
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import gc
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from plexgt.data.graph import GraphData, random_split
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.plan.measure import cpu_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(os.environ.get("PLEXGT_RESULTS_DIR") or ROOT / "perf" / "results")
"""Where the benchmarks write their results: perf/results, or ``PLEXGT_RESULTS_DIR`` (the GPU
check collects its benchmarks' files from a folder of its own, so a step that fails never
hands back a stale committed copy)."""
DATASETS_DIR = Path(os.environ.get("PLEXGT_DATASETS_DIR") or ROOT.parent / "shared" / "datasets")
"""The public datasets (read, never copied into the repository): ../shared/datasets beside the
checkout, or ``PLEXGT_DATASETS_DIR`` (a worktree elsewhere)."""
BIN = Path(sys.executable).parent
"""The interpreter's bin folder, where the venv keeps mpiexec."""
GNN_BENCHMARK = {"computers": "amazon_electronics_computers.npz", "cs": "ms_academic_cs.npz",
                 "physics": "ms_academic_phy.npz"}
"""The gnn-benchmark graphs the benchmarks train on, by short name, as ``../shared/datasets``
holds them (:func:`gnn_benchmark`)."""


def gnn_benchmark(name: str, datasets: Path = DATASETS_DIR) -> Path:
    """The npz file of the gnn-benchmark graph ``name`` (a key of :data:`GNN_BENCHMARK`)."""
    return datasets / "gnn-benchmark" / GNN_BENCHMARK[name]


# -- the hardware, the RESULT line, the result files ------------------------------------------
def hardware(device: str = "cpu") -> dict[str, Any]:
    """What the numbers were measured on (CPU model, usable cores, torch build, GPU)."""
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def today() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def result_line(**fields: Any) -> str:
    """``RESULT k=v k=v`` (floats with 4 significant decimals), printed and returned."""
    parts = []
    for k, v in fields.items():
        if isinstance(v, float):
            v = f"{v:.4f}"
        parts.append(f"{k}={v}")
    line = "RESULT " + " ".join(parts)
    print(line, flush=True)
    return line


def write_json(name: str, payload: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / name
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


def write_text(name: str, text: str) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / name
    path.write_text(text)
    return path


def keep_earlier_runs(name: str, out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with the stored result ``name``'s runs of the models this run did not run put
    back beside its own, each with the date it was measured: a run of some models keeps the
    latest of the others."""
    prev = RESULTS_DIR / name
    if prev.exists():
        old = json.loads(prev.read_text())
        out["runs"] = {**{k: {**v, "date": v.get("date", old.get("date"))}
                          for k, v in old["runs"].items()}, **out["runs"]}
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A metrics file (``plexgt train --metrics``): one dict a line."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- launching jobs ---------------------------------------------------------------------------
class JobFailed(RuntimeError):
    """A launched command exited non-zero; the message ends with its stderr's tail (when
    captured)."""

    def __init__(self, cmd: Sequence[str], returncode: int, stderr: str | None) -> None:
        self.cmd, self.returncode, self.stderr = list(cmd), returncode, stderr or ""
        tail = f":\n{self.stderr[-3000:]}" if self.stderr else ""
        super().__init__(f"{' '.join(self.cmd)} exited {returncode}{tail}")


def plexgt(*args: str) -> list[str]:
    """The command line of ``plexgt ARGS`` (this checkout's: see the module docstring)."""
    return [sys.executable, "-m", "plexgt", *args]


def module(name: str, *args: str) -> list[str]:
    """The command line that runs the perf module ``name`` (``perf.bench_x``) as a program:
    how a benchmark starts its own workers."""
    return [sys.executable, "-m", name, *args]


def mpiexec(ranks: int, cmd: Sequence[str]) -> list[str]:
    """``cmd`` on ``ranks`` ranks, by the venv's mpiexec."""
    return [str(BIN / "mpiexec"), "-n", str(ranks), *cmd]


def job_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the checkout's root first on PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), out.get("PYTHONPATH")) if p)
    return out


def launch(cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
           timeout: float | None = None, capture: bool = True,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (:func:`plexgt`, :func:`module`, under :func:`mpiexec`) to its end, in
    :func:`job_env`; its output captured as text, or streamed to this process's with
    ``capture=False``. :class:`JobFailed` when it exits non-zero (unless ``check=False``)."""
    r = subprocess.run(list(cmd), env=job_env(env), timeout=timeout, capture_output=capture,
                       text=True)
    if check and r.returncode != 0:
        raise JobFailed(cmd, r.returncode, r.stderr)
    return r


def passive_omp_wait(name: str) -> None:
    """Run this program with OpenMP's idle threads sleeping (``OMP_WAIT_POLICY=PASSIVE``)
    unless the caller chose a policy: on shared cores OpenMP's default spin-waiting burns
    3-4x the CPU (measured: 2.3-3 s CPU per GT step instead of 0.6 s) whenever a thread is
    descheduled. OpenMP reads the variable once, when torch loads it, which every perf
    module has done by the time its main runs: so the process runs itself again (module
    ``name``, the same arguments) with it set, once."""
    if "OMP_WAIT_POLICY" in os.environ:
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, module(name, *sys.argv[1:]))


# -- prepared graphs --------------------------------------------------------------------------
GraphSource = Callable[[], GraphData] | Sequence[str]
"""How a benchmark's graph comes about: a function that builds it (prepared in this process)
or the arguments of a ``plexgt prep`` command (``--out`` and the rest added)."""


def prepared(out: Path, source: GraphSource, **options: Any) -> Path:
    """``out`` holding a graph as ``plexgt prep`` stores it, prepared now unless a finished
    preparation is already there: benchmarks keep their inputs in a work folder between
    runs, and prep writes the manifest last, so a manifest marks one that finished. A built
    graph is prepared with ``PrepOptions(**options)``, quietly, replacing what an interrupted
    run left; a ``plexgt prep`` command gets ``--out``, ``--overwrite`` and ``--quiet``."""
    if (out / "manifest.json").exists():
        return out
    if callable(source):
        prepare(MemorySource(source()), PrepOptions(out=out, progress=False, overwrite=True,
                                                    **options))
    else:
        launch(plexgt("prep", *source, "--out", str(out), "--overwrite", "--quiet"),
               capture=False)
    return out


def prepare_all(sources: Mapping[str, GraphSource], work: Path,
                **options: Any) -> dict[str, Path]:
    """Every graph of ``sources`` prepared under ``work/<name>`` (:func:`prepared`)."""
    return {name: prepared(work / name, src, **options) for name, src in sources.items()}


def prep_sbm(out: Path, nodes: int, edges: int, classes: int, features: int) -> Path:
    """``plexgt prep`` of an SBM graph into ``out`` (a benchmark's input), quietly."""
    return prepared(out, ["--format", "sbm", "--nodes", str(nodes), "--edges", str(edges),
                          "--classes", str(classes), "--features", str(features)])


def projected_graph(name: str, features: int, datasets: Path = DATASETS_DIR) -> GraphData:
    """The gnn-benchmark graph ``name`` with its bag-of-words features projected to
    ``features`` dense dimensions by a fixed Gaussian matrix (seed 0), random 60/20/20 split
    (seed 0): the real N and E, with an input GEMM that does not drown the attention a
    benchmark measures."""
    with np.load(gnn_benchmark(name, datasets), allow_pickle=False) as z:
        adj = sp.csr_matrix((z["adj_data"], z["adj_indices"], z["adj_indptr"]),
                            shape=tuple(z["adj_shape"])).tocoo()
        attr = sp.csr_matrix((z["attr_data"], z["attr_indices"], z["attr_indptr"]),
                             shape=tuple(z["attr_shape"]))
        labels = np.asarray(z["labels"], dtype=np.int64)
    rng = np.random.default_rng(0)
    proj = rng.standard_normal((attr.shape[1], features)).astype(np.float32)
    feats = np.asarray(attr @ proj, dtype=np.float32) / np.sqrt(features)
    n = adj.shape[0]
    return GraphData(name, n, adj.row.astype(np.int64), adj.col.astype(np.int64), feats,
                     labels, random_split(n, 0))


# -- memory -----------------------------------------------------------------------------------
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def malloc_mode(memory: bool) -> None:
    """glibc's allocator in one of two modes. Memory (before the build and for the measured
    step): every block over 128 KiB its own mapping and freed memory handed back, so the
    resident set counts live memory. Time (the timed steps): blocks up to 32 MiB reused from
    the heap, where glibc's adaptive threshold settles in a training loop, so a step is timed
    as ``plexgt train`` runs it, without the page faults of a fresh mapping per tensor (which
    made the memory mode's steps up to 1.6x slower)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(M_MMAP_THRESHOLD, 128 << 10 if memory else 32 << 20)
    libc.mallopt(M_TRIM_THRESHOLD, 0 if memory else 64 << 20)


def trim_heap() -> None:
    """Collect garbage and hand freed heap back to the OS, so RSS counts live memory."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def rss() -> int:
    """This process's resident set, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """This process's largest resident set while inside (a daemon thread samples it every
    ``every`` seconds)."""

    def __init__(self, every: float = 0.002) -> None:
        self.every, self.peak, self._stop = every, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(self.every)

    def __enter__(self) -> PeakRSS:
        self.peak = rss()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss())
