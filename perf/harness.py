"""What the benchmarks share: hardware description, RESULT lines, result files."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "perf" / "results"
DATASETS_DIR = ROOT.parent / "shared" / "datasets"


def hardware(device: str = "cpu") -> dict[str, Any]:
    """What the numbers were measured on (CPU model, usable cores, torch build, GPU)."""
    import torch

    from plexgt.plan.measure import cpu_model

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
    os.execv(sys.executable, [sys.executable, "-m", name, *sys.argv[1:]])


def prep_sbm(out: Path, nodes: int, edges: int, classes: int, features: int) -> Path:
    """``plexgt prep`` of an SBM graph into ``out`` (a benchmark's input), quietly."""
    subprocess.run([sys.executable, "-m", "plexgt", "prep", "--format", "sbm", "--nodes",
                    str(nodes), "--edges", str(edges), "--classes", str(classes),
                    "--features", str(features), "--out", str(out), "--quiet"], check=True,
                   cwd=Path(__file__).resolve().parents[1])
    return out


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
