"""Prep throughput and peak memory on synthetic R-MAT graphs of 2^22, 2^24, 2^26 edges.

Each size runs ``plexgt prep --format rmat`` (edge factor 16: N = E/16, self loops, default
tile count) in a fresh process; its peak RSS comes from ``wait4``'s rusage, so it is that run's
alone. The claim under test: peak RSS stays flat (<= 2 GB) while E grows 16x, and time grows
linearly in E. A featured run (F=128 float16, the papers100M shape) measures feature-row
throughput; both rates extrapolate the prep time of ogbn-papers100M per rank.

Usage: python -m perf.bench_prep [--max-log2 26] [--mpi 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from perf.harness import hardware, job_env, mpiexec, plexgt, result_line, today, write_json

# ogbn-papers100M: 111,059,956 nodes, 1,615,685,872 edges, 128 float16 features
PAPERS_N, PAPERS_E, PAPERS_F = 111_059_956, 1_615_685_872, 128


def run_prep(args: list[str], out: Path, mpi: int = 1) -> dict:
    """One prep in a fresh process: wall seconds, peak RSS (MiB, largest rank), manifest."""
    cmd = plexgt("prep", *args, "--out", str(out), "--quiet")
    if mpi > 1:
        cmd = mpiexec(mpi, cmd)
    t0 = time.perf_counter()
    # not harness.launch: wait4 gives this child's own rusage (its peak RSS)
    proc = subprocess.Popen(cmd, env=job_env(), stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"prep failed: {err}")
    m = json.loads((out / "manifest.json").read_text())
    # ru_maxrss is the largest descendant (mpiexec's ranks included), in KiB on Linux
    return {"wall_s": round(wall, 2), "prep_s": m["prep_seconds"], "peak_rss_mib":
            round(ru.ru_maxrss / 1024, 1), "N": m["N"], "E_stored": m["E"], "T": m["T"],
            "F": m["F"], "tile_imbalance": m["tile_imbalance"], "summary": err.strip()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-log2", type=int, default=26)
    ap.add_argument("--mpi", type=int, default=2, help="ranks of the parallel run (0: skip)")
    a = ap.parse_args()
    res: dict = {"bench": "prep", "date": today(), "hardware": hardware(), "runs": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("PLEXGT_BENCH_TMP")) as tmp:
        for k in range(22, a.max_log2 + 1, 2):
            e = 1 << k
            r = run_prep(["--format", "rmat", "--nodes", str(e // 16), "--edges", str(e)],
                         Path(tmp) / f"r{k}")
            r.update({"log2_edges": k, "edges": e, "edges_per_s": e / r["prep_s"]})
            res["runs"].append(r)
            print(f"2^{k} edges: {r['prep_s']:.1f}s ({r['edges_per_s'] / 1e6:.2f} M edges/s), "
                  f"peak RSS {r['peak_rss_mib']:.0f} MiB, T={r['T']}", flush=True)
            subprocess.run(["rm", "-rf", str(Path(tmp) / f"r{k}")], check=True)
        n_f = 1 << 20
        r = run_prep(["--format", "rmat", "--nodes", str(n_f), "--edges", str(1 << 20),
                      "--features", str(PAPERS_F), "--features-dtype", "float16"],
                     Path(tmp) / "feat")
        base = res["runs"][0]
        edge_part = (1 << 20) * 1.0 / base["edges_per_s"]
        r["feature_rows_per_s"] = n_f / max(1e-9, r["prep_s"] - edge_part)
        res["features_run"] = r
        print(f"features: {n_f} rows x {PAPERS_F} float16 in {r['prep_s']:.1f}s "
              f"(~{r['feature_rows_per_s'] / 1e6:.2f} M rows/s), peak {r['peak_rss_mib']:.0f} MiB")
        if a.mpi > 1:
            k = min(24, a.max_log2)
            r = run_prep(["--format", "rmat", "--nodes", str((1 << k) // 16), "--edges",
                          str(1 << k)], Path(tmp) / "mpi", mpi=a.mpi)
            serial = next(x for x in res["runs"] if x["log2_edges"] == k)
            r.update({"ranks": a.mpi, "log2_edges": k,
                      "speedup_vs_1": serial["prep_s"] / r["prep_s"]})
            res["mpi_run"] = r
            print(f"mpiexec -n {a.mpi}, 2^{k}: {r['prep_s']:.1f}s, speedup "
                  f"{r['speedup_vs_1']:.2f} on {hardware()['usable_cores']} cores")
    runs = res["runs"]
    rss = [x["peak_rss_mib"] for x in runs]
    big = runs[-1]
    # linearity: seconds per edge of the largest vs the smallest run
    lin = (big["prep_s"] / big["edges"]) / (runs[0]["prep_s"] / runs[0]["edges"])
    rate_e = big["E_stored"] / big["prep_s"]  # stored nonzeros per second, one rank
    rate_f = res["features_run"]["feature_rows_per_s"]
    papers_nnz = 2 * PAPERS_E + PAPERS_N  # symmetrised + self loops (upper bound)
    one = papers_nnz / rate_e + PAPERS_N / rate_f
    res["papers100M_extrapolation"] = {
        "stored_nnz": papers_nnz, "rate_nnz_per_s_per_rank": rate_e,
        "rate_feature_rows_per_s_per_rank": rate_f,
        "hours_one_rank": one / 3600,
        "minutes_per_rank": {str(w): one / w / 60 for w in (16, 64, 256)},
        "note": "edges + features only, assuming perfect scaling over ranks (disjoint tiles); "
                "rank 0's serial part (nodes.h5, sha256 of ~60 GB inputs) adds minutes",
    }
    res["peak_rss_flat"] = max(rss) <= 2048
    res["time_per_edge_ratio_largest_vs_smallest"] = lin
    path = write_json("bench_prep.json", res)
    print(f"wrote {path}")
    result_line(bench="prep", cpu=hardware()["cpu"].replace(" ", "_"),
                **{f"s_2^{x['log2_edges']}": float(x["prep_s"]) for x in runs},
                **{f"rss_mib_2^{x['log2_edges']}": float(x["peak_rss_mib"]) for x in runs},
                rss_flat_le_2GB=res["peak_rss_flat"], time_per_edge_ratio=float(lin),
                papers100M_min_per_rank_at_64=float(one / 64 / 60),
                papers100M_h_one_rank=float(one / 3600))


if __name__ == "__main__":
    main()
