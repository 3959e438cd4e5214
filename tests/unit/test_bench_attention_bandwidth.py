"""perf/bench_attention_bandwidth.py's code path on the CPU (Triton's interpreter, tiny sizes):
every case and pass reports its time, bytes, GB/s and the fraction of the copy bandwidth
measured in the same run. The numbers mean nothing here; the GPU run is perf/gpu_check.sh's."""

import pytest
import torch

from perf import bench_attention_bandwidth as bench
from plexgt.ops import attention_triton

pytestmark = [
    pytest.mark.skipif(attention_triton.triton is None or not attention_triton.interpreted(),
                       reason="needs Triton's interpreter"),
    pytest.mark.timeout(180),
]


def test_every_case_reports_bytes_and_its_fraction_of_the_copy_bandwidth():
    res = bench.measure(torch.device("cpu"), {"powerlaw": (48, 300)}, ["float32"], reps=0,
                        copy_mib=4, name=None)
    assert res["copy_gbps"] > 0
    g = res["graphs"]["powerlaw"]
    assert g["max_degree"] > 5 * g["mean_degree"]  # hubs
    assert set(res["cases"]) == {f"powerlaw/float32/{c}" for c in ("plain", "bias", "ring")}
    for key, case in res["cases"].items():
        assert "error" not in case, (key, case)
        for p in ("forward", "backward_rows", "backward_cols"):
            r = case[p]
            assert r["bytes"] > 0 and r["min_s"] > 0, (key, p)
            assert r["fraction"] == pytest.approx(r["gbps"] / res["copy_gbps"])
            assert r["gbps"] == pytest.approx(r["bytes"] / r["min_s"] / 1e9)
        # node-major K/V: the 8 heads of 16 in one program, each int32 index read once per
        # pass (the ring's blocks split the edges); a program per head read it 8 times
        assert case["index_bytes"] == res["graphs"]["powerlaw"]["edges"] * 4, key
    plain, biased = res["cases"]["powerlaw/float32/plain"], res["cases"]["powerlaw/float32/bias"]
    e, h = res["graphs"]["powerlaw"]["edges"], bench.HEADS
    # the bias adds its [h, E] read to the forward, and read + gradient write to the rows' pass
    assert biased["forward"]["bytes"] - plain["forward"]["bytes"] == e * h * 4
    assert biased["backward_rows"]["bytes"] - plain["backward_rows"]["bytes"] == 2 * e * h * 4
