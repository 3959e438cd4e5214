"""Process-wide numerics of a run: determinism, TF32, the libraries' environment switches.

Why one place: these are global switches of torch, cuBLAS and MKL, several of which are read
only once, at the library's first call (cuBLAS's workspace layout, MKL's conditional numerical
reproducibility); so they are set here, before the process group, the data or any GEMM exists.
A user's own environment variable wins over the defaults set here.
"""

from __future__ import annotations

import os

import torch

from plexgt.config import TrainConfig

CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS's deterministic workspace configuration (eight 4 MiB buffers, one of the two its
documentation names): without it cuBLAS may pick a reduction split per call, and
``torch.use_deterministic_algorithms`` raises on the first CUDA GEMM."""


def apply_numerics(cfg: TrainConfig) -> dict[str, object]:
    """Set the switches ``cfg`` asks for; returns what was set (logged with the run)."""
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        # MKL's CPU GEMMs pick kernels by the operands' memory alignment, which differs between
        # a run and its resume (and at random between runs): 1-ulp drifts that a resumed run
        # never loses (the kill-and-resume test failed ~1 run in 3). COMPATIBLE,STRICT removes
        # the dependence (AUTO,STRICT measured not enough), at the cost of MKL's slower generic
        # kernels in deterministic runs.
        os.environ.setdefault("MKL_CBWR", "COMPATIBLE,STRICT")
        # warn_only=False: torch runs the deterministic variant of every op that has one
        # (on CUDA: index_add_, scatter_add_, index_put_ with accumulate and the backward of
        # index_select and gather, sorted instead of atomic) and raises for the few that have
        # none (a float cumsum, a weighted bincount, ... on CUDA), which a step turns into a
        # one-line error (loop.step). warn_only=True only warned for those, and a
        # "deterministic" GPU run then drifted. cuSPARSE's SpMM is bit-wise reproducible for a
        # non-transposed CSR operand (cuSPARSE, cusparseSpMM), the only form plexgt calls (its
        # transposes are stored); the fused attention kernel has no atomics.
        torch.use_deterministic_algorithms(True, warn_only=False)
    # TF32 (10-bit mantissa products, float32 sums) for float32 GEMMs on GPUs that have it;
    # never under deterministic, whose point is bit-equal reruns of the float32 model
    tf32 = cfg.tf32 and not cfg.deterministic
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return {"deterministic": cfg.deterministic, "tf32": tf32,
            "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""),
            "MKL_CBWR": os.environ.get("MKL_CBWR", "")}
