"""perf/bench_plexus.py's one-rank calibration, on the input layouts a prepared graph has."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from perf import bench_plexus
from plexgt.models import sparse_features
from plexgt.parallel.plexus_aggregate import BlockedAdjacency


@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_the_calibration_times_the_spmm_whatever_the_input_layout(layout):
    # prep stores features below 10% density as CSR (Coauthor Physics: 0.39%); the
    # calibration sliced the input as a dense tensor and failed on those
    n, f = 300, 500
    adj = sp.random(n, n, density=0.02, format="csr", random_state=0) + sp.eye(n, format="csr")
    feats = sp.random(n, f, density=0.004, format="csr", random_state=1, dtype=np.float32)
    x = (sparse_features(feats) if layout == "csr"
         else torch.from_numpy(feats.toarray()))
    model = SimpleNamespace(adj=[BlockedAdjacency(adj.tocsr(), (n, n), None, torch.float32)])
    out = bench_plexus._calibrate(model, SimpleNamespace(x=x), [SimpleNamespace(d_in=f)], None)
    assert set(out) == {"spmm_s_per_nnz_col", "gemm_s_per_fma"}
    assert all(v > 0 and math.isfinite(v) for v in out.values())
