"""What the fault handling costs and how fast a broken job ends (this machine, CPU).

* read-checksum cost: the same tile-shaped int32 index array (``--nnz`` entries) stored
  with and without HDF5 Fletcher-32 chunk checksums, read back whole and as 64 row-block
  hyperslabs (how ranks read tiles), best of ``--repeats``; reported as the ratio.
* kill-to-exit: a 3-rank gcn job, one rank SIGKILLed mid-run: seconds until mpiexec exits.
* hang-to-exit: a 4-rank gcn job on a 2x2x1 grid (sub-groups), one rank SIGSTOPped, with
  ``--parallel.timeout_s`` T: seconds until the job has ended, against T.

Writes perf/results/bench_faults.json and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from perf.harness import hardware, prep_sbm, result_line, today, write_json

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def read_cost(nnz: int, repeats: int) -> dict[str, float]:
    """Seconds to read the array whole and in 64 hyperslabs, with and without checksums."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 1 << 30, nnz, dtype=np.int32)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d:
        for name, kw in (("plain", {"chunks": True}), ("fletcher32", {"fletcher32": True})):
            path = Path(d) / f"{name}.h5"
            with h5py.File(path, "w") as f:
                f.create_dataset("indices", data=data, **kw)
            whole, slabs = [], []
            step = nnz // 64
            for _ in range(repeats):
                with h5py.File(path, "r") as f:
                    t0 = time.perf_counter()
                    f["indices"][()]
                    whole.append(time.perf_counter() - t0)
                with h5py.File(path, "r") as f:
                    ds = f["indices"]
                    t0 = time.perf_counter()
                    for i in range(64):
                        ds[i * step:(i + 1) * step]
                    slabs.append(time.perf_counter() - t0)
            out[f"{name}_whole_s"], out[f"{name}_slabs_s"] = min(whole), min(slabs)
    out["ratio_whole"] = out["fletcher32_whole_s"] / out["plain_whole_s"]
    out["ratio_slabs"] = out["fletcher32_slabs_s"] / out["plain_slabs_s"]
    return out


def _ranks(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True)
        for k in map(int, kids.stdout.split()):
            todo.append(k)
            if "python" in Path(f"/proc/{k}/comm").read_text():
                out.append(k)
    return sorted(out)


def fault_to_exit(data: Path, n: int, sig: int, extra: list[str], tmp: Path) -> float:
    """Seconds from sending ``sig`` to one rank of a running n-rank job until the job ends."""
    m = tmp / f"m{sig}.jsonl"
    cmd = [str(BIN / "mpiexec"), "-n", str(n), sys.executable, "-m", "plexgt", "train",
           "--data", str(data), "--model", "gcn", "--model.hidden=16", "--epochs", "100000",
           "--metrics", str(m), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (m.exists() and len(m.read_text().splitlines()) > 2):
            time.sleep(0.2)
        os.kill(_ranks(proc.pid)[-1], sig)
        t0 = time.time()
        proc.wait(timeout=300)
        return time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nnz", type=int, default=20_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=10.0)
    args = ap.parse_args()
    reads = read_cost(args.nnz, args.repeats)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data = prep_sbm(tmp / "sbm", 2000, 40000, 4, 16)
        kill = fault_to_exit(data, 3, signal.SIGKILL, [], tmp)
        hang = fault_to_exit(data, 4, signal.SIGSTOP,
                             ["--grid", "2x2x1", f"--parallel.timeout_s={args.timeout_s}"], tmp)
    payload = {"bench": "faults", "date": today(), "hardware": hardware(),
               "read_checksums": {"nnz": args.nnz, **reads},
               "kill_to_exit_s": kill, "hang_to_exit_s": hang,
               "hang_timeout_s": args.timeout_s}
    write_json("bench_faults.json", payload)
    result_line(bench="faults", checksum_read_ratio_whole=round(reads["ratio_whole"], 3),
                      checksum_read_ratio_slabs=round(reads["ratio_slabs"], 3),
                      kill_to_exit_s=round(kill, 2), hang_to_exit_s=round(hang, 2),
                timeout_s=args.timeout_s)


if __name__ == "__main__":
    main()
