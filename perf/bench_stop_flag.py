"""The cost of agreeing on a stop signal between every two optimizer steps of a batch-trained
epoch (:class:`plexgt.training.loop.MidEpoch`): one MAX all-reduce of one int64 in host
memory over the gloo world (:func:`plexgt.training.loop.host_group`), timed on 2 and 4 ranks
of this machine, against an empty loop.

Writes perf/results/bench_stop_flag.json and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from perf.harness import hardware, launch, module, mpiexec, result_line, today, write_json

CALLS = 2000


def worker(calls: int) -> None:
    """One rank: ``calls`` flag all-reduces after 100 warm-up ones; rank 0 prints the
    per-call microseconds (median and 90th percentile of 20 blocks)."""
    import torch
    import torch.distributed as dist

    from plexgt.distributed.bootstrap import init_distributed, shutdown

    ctx = init_distributed("gloo", timeout_s=120)
    flag = torch.zeros(1, dtype=torch.int64)
    for _ in range(100):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    blocks = []
    per = calls // 20
    for _ in range(20):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(per):
            flag = torch.tensor([0], dtype=torch.int64)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            int(flag[0])
        blocks.append((time.perf_counter() - t0) / per * 1e6)
    if ctx.rank == 0:
        blocks.sort()
        print(f"US {statistics.median(blocks):.2f} {blocks[int(0.9 * len(blocks))]:.2f}",
              flush=True)
    shutdown(ctx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--calls", type=int, default=CALLS)
    ap.add_argument("--ranks", default="2,4")
    args = ap.parse_args()
    if args.worker:
        worker(args.calls)
        return
    runs = {}
    for n in map(int, args.ranks.split(",")):
        r = launch(mpiexec(n, module("perf.bench_stop_flag", "--worker", "--calls",
                                     str(args.calls))), timeout=600)
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith("US "))
        med, p90 = map(float, line.split()[1:])
        runs[f"{n} ranks"] = {"median_us": med, "p90_us": p90}
        print(f"{n} ranks: {med:.1f} us a step (median of 20 blocks), p90 {p90:.1f} us",
              file=sys.stderr, flush=True)
    write_json("bench_stop_flag.json", {"date": today(), "hardware": hardware(),
                                        "calls": args.calls, "runs": runs})
    result_line(**{f"us_{k.split()[0]}ranks": v["median_us"] for k, v in runs.items()})


if __name__ == "__main__":
    main()
