"""Bytes read per rank by the loader, grids 1x1x1 ... 2x2x2, against the ideal share.

A learnable SBM graph (50K nodes, 1M edges, 64 float32 features) is prepared twice: with T=8
tiles per side (every 2-way block boundary falls on a tile boundary) and T=5 (boundaries cut
through tiles, so a rank reads whole tile rows and drops the columns it does not own). For each
rank of each grid, 2 layers (A1 then A2):

- ``needed``: the irreducible payload of its blocks: per layer nnz x 4 B column indices and
  the degrees of its rows and columns; layer-0 features; labels and masks of its output rows.
  The row structure (per tile: 1-4 B counts a row + anchors) and the columns of a tile row
  outside the block are the loader's overhead above this.
- ``read``: what :class:`PreparedGraph` counted (``bytes_read``).
- ``share``: the whole dataset's payload (both matrices, features, node arrays) / P, the naive
  ideal if nothing were replicated; 3D parallelism replicates blocks along one axis, so
  needed > share is expected when Gy > 1.

Usage: python -m perf.bench_loader
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from perf.harness import hardware, result_line, today, write_json
from plexgt.data.loader import PreparedGraph, read_rank_blocks
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.synthetic import sbm
from plexgt.distributed.grid import Grid3D

GRIDS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (2, 1, 2), (1, 2, 2), (2, 2, 2)]
LAYERS = 2


def needed_bytes(rb, idx_bytes: int, feat_bytes: int) -> int:
    n = 0
    for lb in rb.layers:
        rows = lb.rows[1] - lb.rows[0]
        cols = lb.cols[1] - lb.cols[0]
        n += lb.adj.nnz * idx_bytes + (rows + cols) * 8
    n += rb.features.size * feat_bytes
    r = rb.output_rows[1] - rb.output_rows[0]
    return n + r * 8 + 3 * r


def dataset_bytes(pg: PreparedGraph) -> int:
    m = pg.manifest
    idx = np.dtype(m["dtypes"]["indices"]).itemsize
    adj = 2 * (pg.E * idx + pg.T * (pg.N + pg.T) * 8)
    return adj + pg.N * pg.F * np.dtype(m["dtypes"]["features"]).itemsize + pg.N * 8 * 2


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    t0 = time.time()
    g = sbm(50_000, 1_000_000, 8, 64, seed=0)
    res: dict = {"bench": "loader", "date": today(), "hardware": hardware(),
                 "graph": g.name, "layers": LAYERS, "tilings": {}}
    worst = {}
    with tempfile.TemporaryDirectory() as d:
        for t in (8, 5):
            out = Path(d) / f"t{t}"
            prepare(MemorySource(g), PrepOptions(out=out, tiles=t, progress=False))
            rows = []
            with PreparedGraph(out) as pg:
                idx_b = np.dtype(pg.manifest["dtypes"]["indices"]).itemsize
                f_b = np.dtype(pg.manifest["dtypes"]["features"]).itemsize
                total = dataset_bytes(pg)
                for shape in GRIDS:
                    grid = Grid3D(*shape)
                    per = []
                    for rank in range(grid.size):
                        rb = read_rank_blocks(pg, grid, rank, LAYERS)
                        per.append((rb.bytes_read, needed_bytes(rb, idx_b, f_b)))
                    read = np.array([p[0] for p in per], dtype=np.float64)
                    need = np.array([p[1] for p in per], dtype=np.float64)
                    row = {"grid": str(grid), "ranks": grid.size,
                           "read_mib_max": read.max() / 2**20, "read_mib_mean": read.mean() / 2**20,
                           "needed_mib_max": need.max() / 2**20,
                           "share_mib": total / grid.size / 2**20,
                           "read_over_needed_max": float((read / need).max()),
                           "read_over_needed_mean": float((read / need).mean())}
                    rows.append(row)
                    print(f"T={t} {grid}: read {row['read_mib_max']:7.2f} MiB max/rank, needed "
                          f"{row['needed_mib_max']:7.2f}, share {row['share_mib']:7.2f}, "
                          f"read/needed max {row['read_over_needed_max']:.3f}", flush=True)
            res["tilings"][f"T={t}"] = rows
            worst[t] = max(r["read_over_needed_max"] for r in rows)
    res["seconds"] = round(time.time() - t0, 1)
    path = write_json("bench_loader.json", res)
    print(f"wrote {path}")
    g222 = {k: next(r for r in v if r["grid"] == "2x2x2") for k, v in res["tilings"].items()}
    result_line(bench="loader", read_over_needed_max_T8=worst[8],
                read_over_needed_max_T5=worst[5],
                mib_per_rank_2x2x2_T8=g222["T=8"]["read_mib_max"],
                needed_mib_2x2x2=g222["T=8"]["needed_mib_max"],
                share_mib_2x2x2=g222["T=8"]["share_mib"])


if __name__ == "__main__":
    main()
