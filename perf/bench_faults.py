"""What the fault handling costs and how fast a broken job ends (this machine, CPU).

* read-checksum cost: the same tile-shaped int32 index array (``--nnz`` entries) stored
  with and without HDF5 Fletcher-32 chunk checksums, read back whole and as 64 row-block
  hyperslabs (how ranks read tiles), best of ``--repeats``; reported as the ratio.
* kill-to-exit: a 3-rank gcn job, one rank SIGKILLed mid-run: seconds until mpiexec exits.
* hang-to-exit: a 4-rank gcn job on a 2x2x1 grid (sub-groups), one rank SIGSTOPped, with
  ``--parallel.timeout_s`` T: seconds until the job has ended, against T.
* read-check cost: on the demo's graph (``plexgt prep --format sbm --nodes 50000 --edges
  1000000``), rank 0's reads at p = 1 and 4 ranks (gt/gps's row block: Q A Qᵀ rows, targets,
  features, node ids; and the GCN's 3D blocks on a px1x1 grid, 2 layers) with the read-time
  consistency checks (:mod:`plexgt.data.checks`) on and off, alternated ``--read-repeats``
  times in one run (off: every check a no-op, the same bytes read); medians. Against one
  epoch of the demo's gps model on p ranks (median ``time_epoch`` of ``--epochs`` epochs but
  the first).

Writes perf/results/bench_faults.json and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from perf.harness import (
    hardware,
    job_env,
    launch,
    mpiexec,
    plexgt,
    prep_sbm,
    result_line,
    today,
    write_json,
)
from plexgt.data import checks, loader, prepared_graph
from plexgt.data.loader import (
    PreparedGraph,
    read_adjacency_q,
    read_feature_block,
    read_node_ids,
    read_plexus_arrays,
    read_targets,
)
from plexgt.distributed.grid import Grid3D, block_bounds
from plexgt.distributed.layout3d import layer_layouts

ROOT = Path(__file__).resolve().parents[1]


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
    cmd = mpiexec(n, plexgt("train", "--data", str(data), "--model", "gcn",
                            "--model.hidden=16", "--epochs", "100000", "--metrics", str(m),
                            *extra))
    env = job_env(dict(os.environ, OMP_NUM_THREADS="1"))
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


def _unchecked_indptr(where: str, counts: np.ndarray, anchors: np.ndarray, k: int,
                      stride: int, rows: int, nnz: int) -> np.ndarray:
    """tile_indptr without its checks: the offsets the reader slices the indices by."""
    ip = np.empty(counts.size + 1, dtype=np.int64)
    ip[0] = int(anchors[0]) if k else 0
    np.cumsum(counts, out=ip[1:])
    ip[1:] += ip[0]
    return ip


@contextmanager
def _replaced(make: Callable[[str, Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """Every check function the reader calls replaced by ``make(name, function)``."""
    saved = []
    for mod in (prepared_graph, loader):
        for name in dir(checks):
            if (name.startswith("check_") or name == "tile_indptr") and hasattr(mod, name):
                saved.append((mod, name, getattr(mod, name)))
                setattr(mod, name, make(name, getattr(mod, name)))
    assert len(saved) >= 10, saved  # the reader's checks, all of them
    try:
        yield
    finally:
        for mod, name, f in saved:
            setattr(mod, name, f)


def checks_off() -> Any:
    """The reader with every consistency check a no-op (tile offsets still computed)."""
    return _replaced(lambda name, f: _unchecked_indptr if name == "tile_indptr"
                     else (lambda *a, **k: None))


def checks_timed(spent: list[float]) -> Any:
    """The reader's checks, each call's time added to ``spent[0]`` (tile_indptr's less what
    the unchecked offsets cost)."""
    def make(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            out = f(*a, **k)
            dt = time.perf_counter() - t0
            if name == "tile_indptr":
                t0 = time.perf_counter()
                _unchecked_indptr(*a, **k)
                dt -= time.perf_counter() - t0
            spent[0] += dt
            return out
        return timed
    return _replaced(make)


def read_rows(data: Path, p: int) -> None:
    """What gt/gps read on rank 0 of p: its rows of Q A Qᵀ, targets, features, node ids."""
    with PreparedGraph(data) as pg:
        rows, n_loc = block_bounds(pg.N, p, 0), -(-pg.N // p)
        read_adjacency_q(pg, rows)
        read_targets(pg, rows, "Q", n_loc)
        read_feature_block(pg, rows, (0, pg.F), (n_loc, pg.F))
        read_node_ids(pg, "Q", rows, n_loc)


def read_gcn(data: Path, p: int) -> None:
    """What the GCN reads on rank 0 of a px1x1 grid, 2 layers (read_plexus_arrays)."""
    with PreparedGraph(data) as pg:
        read_plexus_arrays(pg, layer_layouts(Grid3D(p, 1, 1), 0, pg.N, [pg.F, 64, pg.C]))


def check_cost(data: Path, read: Callable[[Path, int], None], p: int, repeats: int
               ) -> dict[str, float]:
    """Median seconds of ``read`` with the checks on and off, alternated (page cache warm)."""
    read(data, p)
    on, off = [], []
    for i in range(repeats):
        for want_on in ((True, False) if i % 2 == 0 else (False, True)):
            t0 = time.perf_counter()
            if want_on:
                read(data, p)
            else:
                with checks_off():
                    read(data, p)
            (on if want_on else off).append(time.perf_counter() - t0)
    inside = []
    for _ in range(repeats):
        spent = [0.0]
        with checks_timed(spent):
            read(data, p)
        inside.append(spent[0])
    m_on, m_off = statistics.median(on), statistics.median(off)
    return {"on_s": m_on, "off_s": m_off, "ratio_on_off": m_on / m_off,
            "on_minus_off_s": m_on - m_off, "check_s": statistics.median(inside),
            "check_share": statistics.median(inside) / m_on,
            "on_all_s": on, "off_all_s": off, "check_all_s": inside}


def epoch_time(data: Path, p: int, epochs: int, tmp: Path) -> dict[str, Any]:
    """Median time_epoch (rank 0) of the demo's gps model on p ranks, the first epoch left
    out; OMP threads: the 2 cores shared among the ranks."""
    m = tmp / f"epoch{p}.jsonl"
    cmd = plexgt("train", "--config", str(ROOT / "jobscripts" / "configs" / "demo.toml"),
                 "--data", str(data), "--epochs", str(epochs), "--metrics", str(m))
    launch(mpiexec(p, cmd) if p > 1 else cmd, timeout=900,
           env=dict(os.environ, OMP_NUM_THREADS=str(max(1, 2 // p))))
    times = [json.loads(line)["time_epoch"] for line in m.read_text().splitlines()][1:]
    return {"ranks": p, "epoch_s": statistics.median(times), "epochs_s": times}


def read_checks(data: Path, repeats: int, epochs: int, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in (1, 4):
        ep = epoch_time(data, p, epochs, tmp)
        rows, gcn = check_cost(data, read_rows, p, repeats), check_cost(data, read_gcn, p,
                                                                         repeats)
        out[f"p{p}"] = {**ep, "rows_read": rows, "gcn_read": gcn,
                        "rows_check_over_epoch": rows["check_s"] / ep["epoch_s"],
                        "gcn_check_over_epoch": gcn["check_s"] / ep["epoch_s"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nnz", type=int, default=20_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=10.0)
    ap.add_argument("--read-repeats", type=int, default=15)
    ap.add_argument("--epochs", type=int, default=6)
    args = ap.parse_args()
    reads = read_cost(args.nnz, args.repeats)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        demo = tmp / "demo"
        launch(plexgt("prep", "--format", "sbm", "--nodes", "50000", "--edges", "1000000",
                      "--out", str(demo), "--quiet"))
        checked = read_checks(demo, args.read_repeats, args.epochs, tmp)
        data = prep_sbm(tmp / "sbm", 2000, 40000, 4, 16)
        kill = fault_to_exit(data, 3, signal.SIGKILL, [], tmp)
        hang = fault_to_exit(data, 4, signal.SIGSTOP,
                             ["--grid", "2x2x1", f"--parallel.timeout_s={args.timeout_s}"], tmp)
    payload = {"bench": "faults", "date": today(), "hardware": hardware(),
               "read_checksums": {"nnz": args.nnz, **reads},
               "kill_to_exit_s": kill, "hang_to_exit_s": hang,
               "hang_timeout_s": args.timeout_s,
               "read_checks": {"graph": "plexgt prep --format sbm --nodes 50000 --edges "
                                        "1000000", "repeats": args.read_repeats,
                               "note": "2 cores shared with other work; p=4 oversubscribes "
                                       "them (1 OMP thread a rank); medians", **checked}}
    write_json("bench_faults.json", payload)
    c1, c4 = checked["p1"], checked["p4"]
    result_line(bench="faults", checksum_read_ratio_whole=round(reads["ratio_whole"], 3),
                checksum_read_ratio_slabs=round(reads["ratio_slabs"], 3),
                kill_to_exit_s=round(kill, 2), hang_to_exit_s=round(hang, 2),
                timeout_s=args.timeout_s,
                read_check_ratio_rows_p1=round(c1["rows_read"]["ratio_on_off"], 3),
                read_check_ratio_gcn_p1=round(c1["gcn_read"]["ratio_on_off"], 3),
                read_check_over_epoch_p1=round(c1["rows_check_over_epoch"], 5),
                read_check_ratio_rows_p4=round(c4["rows_read"]["ratio_on_off"], 3),
                read_check_over_epoch_p4=round(c4["rows_check_over_epoch"], 5),
                epoch_s_p1=round(c1["epoch_s"], 3), epoch_s_p4=round(c4["epoch_s"], 3))


if __name__ == "__main__":
    main()
