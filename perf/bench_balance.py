"""Load balance of the double permutation: max/mean nonzeros per block of an 8x8 split.

For SNAP ego-twitter and soc-slashdot0902 (as stored, self loops added, duplicates merged, as
``plexgt prep`` stores them): the matrix unpermuted, with one symmetric permutation P A P^T,
and double-permuted (A1 = P A Q^T, A2 = Q A P^T) with uniform P, Q (``--permutation random``,
Plexus), with degree-stratified P, Q (``--permutation degree``) and with stratified P, Q
refined by local search on the edges (``--permutation balanced``, blocks = 8: the split
measured here), over several seeds. The A1 counts are cross-checked against the tile nnz that
``plexgt prep --tiles 8`` records (tile size ceil(N/8) = the 8x8 block size). With uniform
permutations the residual imbalance comes from where the hubs land (the degree sum of N/8
random nodes varies); stratifying removes most of it, leaving sampling noise ~2.4/sqrt(nnz per
block) ("poisson_floor"), which is above 1.01 for graphs of ~1M edges; ``balanced`` is not
drawn independently of the edges, so it goes below that floor, down to the integer rounding of
the block counts. "balanced_seconds" is the time of the refinement alone (mean over seeds).
An R-MAT graph of 2^24 edges shows the trend with size.

Usage: python -m perf.bench_balance [--seeds 5] [--no-rmat]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from perf.harness import DATASETS_DIR, hardware, result_line, today, write_json
from plexgt.data.formats.snap import read_snap
from plexgt.data.graph import GraphData
from plexgt.data.permute import (
    balanced_permutations,
    degree_permutations,
    inverse,
    permutations,
    processed_edges,
)
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.synthetic import rmat

G = 8


def block_imbalance(rows: np.ndarray, cols: np.ndarray, n: int, g: int = G) -> float:
    """max/mean nonzeros over the g x g blocks of ceil(n/g) rows and columns."""
    s = -(-n // g)
    counts = np.bincount((rows // s) * g + cols // s, minlength=g * g)
    return float(counts.max() / counts.mean())


def measure(g: GraphData, seeds: int) -> dict:
    src, dst = processed_edges(g, symmetrize=False, self_loops=True)
    n = g.num_nodes
    out = {"N": n, "nnz": int(src.size), "nnz_per_block": src.size / G**2,
           "unpermuted": block_imbalance(dst, src, n)}
    single, a1s, a2s, d1s, d2s, b1s, b2s, bsec = [], [], [], [], [], [], [], []
    weights = np.bincount(g.src, minlength=n) + np.bincount(g.dst, minlength=n)  # as prep does
    for seed in range(seeds):
        p, q = permutations(n, seed)
        pinv, qinv = inverse(p), inverse(q)
        single.append(block_imbalance(pinv[dst], pinv[src], n))
        a1s.append(block_imbalance(pinv[dst], qinv[src], n))
        a2s.append(block_imbalance(qinv[dst], pinv[src], n))
        p, q = degree_permutations(weights, seed)
        pinv, qinv = inverse(p), inverse(q)
        d1s.append(block_imbalance(pinv[dst], qinv[src], n))
        d2s.append(block_imbalance(qinv[dst], pinv[src], n))
        t0 = time.perf_counter()
        p, q, _ = balanced_permutations(src, dst, n, G, seed)
        bsec.append(time.perf_counter() - t0)
        pinv, qinv = inverse(p), inverse(q)
        b1s.append(block_imbalance(pinv[dst], qinv[src], n))
        b2s.append(block_imbalance(qinv[dst], pinv[src], n))
    out.update({
        "single_perm_mean": float(np.mean(single)), "single_perm_max": float(np.max(single)),
        "double_A1_seed0": a1s[0], "double_A1_mean": float(np.mean(a1s)),
        "double_A2_mean": float(np.mean(a2s)), "double_max_over_seeds": float(max(a1s + a2s)),
        "degree_A1_seed0": d1s[0], "degree_A1_mean": float(np.mean(d1s)),
        "degree_A2_mean": float(np.mean(d2s)), "degree_max_over_seeds": float(max(d1s + d2s)),
        "balanced_A1_seed0": b1s[0], "balanced_A1_mean": float(np.mean(b1s)),
        "balanced_A2_mean": float(np.mean(b2s)),
        "balanced_max_over_seeds": float(max(b1s + b2s)),
        "balanced_seconds": round(float(np.mean(bsec)), 2),
        # Poisson sampling floor: expected max of G^2 counts ~ mean + 2.4 sqrt(mean)
        "poisson_floor": 1 + 2.4 / np.sqrt(src.size / G**2),
    })
    return out


def cross_check(g: GraphData, expect: float, method: str = "random") -> float:
    """The same A1 imbalance, from the tile nnz of a real ``prep --tiles 8`` (seed 0)."""
    with tempfile.TemporaryDirectory() as d:
        m = prepare(MemorySource(g), PrepOptions(out=Path(d) / "p", tiles=G, progress=False,
                                                 permutation=method))
    nnz = np.asarray(m["tile_nnz"]["A1"], dtype=np.float64)
    got = float(nnz.max() / nnz.mean())
    assert abs(got - expect) < 1e-12, (got, expect)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--no-rmat", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    res: dict = {"bench": "balance", "date": today(), "hardware": hardware(), "grid": f"{G}x{G}",
                 "target_after": 1.01, "plexus_reported": "7.70 -> 1.001 (ogbn-papers100M)"}
    graphs = {"ego-twitter": "ego-twitter.txt.gz", "soc-slashdot0902": "soc-slashdot0902.txt.gz"}
    for name, f in graphs.items():
        path = DATASETS_DIR / "snap" / f
        if not path.exists():
            print(f"skip {name}: {path} not found")
            continue
        g = read_snap(path)
        r = measure(g, args.seeds)
        r["prep_tile_imbalance_seed0"] = cross_check(g, r["double_A1_seed0"])
        r["prep_tile_imbalance_degree_seed0"] = cross_check(g, r["degree_A1_seed0"], "degree")
        r["prep_tile_imbalance_balanced_seed0"] = cross_check(g, r["balanced_A1_seed0"],
                                                              "balanced")
        res[name] = r
        print(f"{name}: N={r['N']} nnz={r['nnz']} unpermuted={r['unpermuted']:.3f} "
              f"single={r['single_perm_mean']:.4f} double(A1 mean)={r['double_A1_mean']:.4f} "
              f"double(worst)={r['double_max_over_seeds']:.4f} degree-stratified(A1 mean)="
              f"{r['degree_A1_mean']:.4f} (worst {r['degree_max_over_seeds']:.4f}) "
              f"balanced(A1 mean)={r['balanced_A1_mean']:.5f} (worst "
              f"{r['balanced_max_over_seeds']:.5f}, {r['balanced_seconds']:.1f} s) "
              f"floor~{r['poisson_floor']:.4f}")
    if not args.no_rmat:
        g = rmat(1 << 20, 1 << 24, seed=0)
        r = measure(g, 2)
        res["rmat-2^24"] = r
        print(f"rmat 2^24: unpermuted={r['unpermuted']:.3f} double={r['double_A1_mean']:.4f} "
              f"degree-stratified={r['degree_A1_mean']:.4f} balanced="
              f"{r['balanced_A1_mean']:.5f} ({r['balanced_seconds']:.1f} s) "
              f"floor~{r['poisson_floor']:.4f}")
    res["seconds"] = round(time.time() - t0, 1)
    path = write_json("bench_balance.json", res)
    fields = {}
    for key, short in (("ego-twitter", "twitter"), ("soc-slashdot0902", "slashdot"),
                       ("rmat-2^24", "rmat24")):
        if key in res:
            fields[f"{short}_before"] = res[key]["unpermuted"]
            fields[f"{short}_after"] = res[key]["double_A1_mean"]
            fields[f"{short}_after_degree"] = res[key]["degree_A1_mean"]
            fields[f"{short}_after_balanced"] = res[key]["balanced_A1_mean"]
            fields[f"{short}_balanced_worst"] = res[key]["balanced_max_over_seeds"]
            fields[f"{short}_balanced_s"] = res[key]["balanced_seconds"]
    real = [s for s in ("twitter", "slashdot") if f"{s}_after" in fields]
    fields["target_met"] = bool(real) and all(fields[f"{s}_after"] <= 1.01 for s in real)
    fields["target_met_by_either"] = bool(real) and all(
        min(fields[f"{s}_after"], fields[f"{s}_after_degree"]) <= 1.01 for s in real)
    fields["target_met_balanced"] = bool(real) and all(
        fields[f"{s}_balanced_worst"] <= 1.01 for s in real)
    print(f"wrote {path}")
    result_line(bench="balance", grid=f"{G}x{G}", **fields)


if __name__ == "__main__":
    main()
