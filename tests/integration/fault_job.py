"""A job in which one rank raises while the others wait in a collective (used by test_fault)."""

import sys
import time

import torch
import torch.distributed as dist

from plexgt.distributed.bootstrap import init_distributed

ctx = init_distributed("gloo", timeout_s=600)
bad = int(sys.argv[1])
dist.barrier()
if ctx.rank == bad:
    sys.stderr.write(f"RAISING_AT {time.time():.3f}\n")
    sys.stderr.flush()
    raise RuntimeError(f"injected failure on rank {bad}")
t = torch.ones(1)
dist.all_reduce(t)  # never completes: rank `bad` is gone
print("UNREACHABLE", flush=True)
