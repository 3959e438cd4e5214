"""The node model both planners share: threads of CPU ranks fewer than the cores, κ, the 3D
model's per-group collectives and its whole-step calibration."""

import pytest

from plexgt.distributed.bootstrap import cpu_threads
from plexgt.distributed.collectives import CommOp
from plexgt.distributed.grid import parse_grid
from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.agp import SystemModel, Workload, comm_time, estimate
from plexgt.plan.host import Host
from plexgt.plan.plexus_cost import Coefficients, gcn_step_calibration, rank_cost
from plexgt.plan.plexus_cost import estimate as plexus_estimate


def test_cpu_ranks_share_the_cores_unless_omp_num_threads_says():
    assert cpu_threads(1, {}, cores=8) == 8
    assert cpu_threads(3, {}, cores=8) == 2
    assert cpu_threads(16, {}, cores=8) == 1
    assert cpu_threads(1, {"OMP_NUM_THREADS": "1"}, cores=8) is None


def test_fewer_cpu_ranks_than_cores_run_faster_by_the_measured_thread_speedup():
    h = Host("cpu", cores=8, threads=1, thread_speedup={2: 1.6, 4: 2.5, 8: 3.0})
    assert h.rank_threads(1) == 8 and h.rank_threads(3) == 2 and h.rank_threads(8) == 1
    assert h.thread_factor(1) == pytest.approx(1 / 3.0)
    assert h.thread_factor(3) == pytest.approx(1 / 1.6)  # 2 threads each
    assert h.thread_factor(8) == 1.0 and h.thread_factor(16) == 1.0
    assert Host("cpu", cores=8).thread_factor(1) == 1.0  # not measured: no speedup assumed
    gpu = Host("cuda", cores=64, thread_speedup={2: 1.6})
    assert gpu.thread_factor(1) == 1.0 and gpu.compute_factor(1) == 1.0


def test_agp_prices_one_rank_on_two_cores_with_its_threads():
    w = Workload("gt", 20_000, 400_000, 128, 8, 64, 4, 2)
    c = default_registry().get("gp_ag")
    plain = SystemModel(host=Host("cpu", cores=2))
    fast = SystemModel(host=Host("cpu", cores=2, thread_speedup={2: 1.25}))
    one, one_fast = estimate(c, w, 1, plain), estimate(c, w, 1, fast)
    assert one_fast.compute_s == pytest.approx(one.compute_s / 1.25)
    assert one_fast.calls_s == one.calls_s  # per-call costs do not thread
    assert estimate(c, w, 2, fast).compute_s == estimate(c, w, 2, plain).compute_s


def test_3d_collectives_priced_on_their_operation_at_their_group_size():
    fits = (("all_gather", 2, 1e-4, 1e-9), ("all_gather", 4, 1e-3, 2e-9),
            ("reduce_scatter", 2, 5e-4, 4e-9))
    coef = Coefficients(latency_s=9.0, s_per_byte=9.0, collectives=fits)
    assert coef.call("all_gather", 1) == (0.0, 0.0)
    assert coef.call("all_gather", 2) == (1e-4, 1e-9)
    assert coef.call("all_gather", 3) == pytest.approx((5.5e-4, 1.5e-9))
    assert coef.call("all_gather", 7) == pytest.approx((1e-3 * 6 / 3, 2e-9))  # ring steps
    assert coef.call("reduce_scatter", 4) == pytest.approx((5e-4 * 3, 4e-9))
    assert coef.call("all_reduce", 2) == (9.0, 9.0)  # not profiled: the global pair
    assert Coefficients().call("all_gather", 8) == (Coefficients().latency_s,
                                                    Coefficients().s_per_byte)
    # a 2x1x2 grid's calls run over groups of 2, a 1x1x4's over 4: the latency differs
    n, nnz, dims = 20_000, 400_000, [64, 64, 8]
    g22, g14 = parse_grid("2x1x2"), parse_grid("1x1x4")
    ops = ("all_gather", "reduce_scatter", "all_reduce")
    small = Coefficients(collectives=tuple((op, g, 1e-4, 0.0) for op in ops for g in (2, 4)))
    big4 = Coefficients(collectives=tuple((op, g, 1e-4 if g == 2 else 1e-2, 0.0)
                                          for op in ops for g in (2, 4)))
    assert plexus_estimate(g22, n, nnz, dims, 4, big4).comm_s == pytest.approx(
        plexus_estimate(g22, n, nnz, dims, 4, small).comm_s)
    assert plexus_estimate(g14, n, nnz, dims, 4, big4).comm_s == pytest.approx(
        plexus_estimate(g14, n, nnz, dims, 4, small).comm_s * 100)


def test_3d_compute_takes_kappa_threads_and_calibration():
    n, nnz, dims, g = 20_000, 400_000, [64, 64, 8], parse_grid("2x1x2")
    base = rank_cost(g, 0, n, nnz, dims, 4, Coefficients())
    host = Host("cpu", cores=2, contention={2: 1.2})  # 4 ranks on 2 cores: κ = 1.2·4/2
    cal = rank_cost(g, 0, n, nnz, dims, 4, Coefficients(host=host, compute_scale=1.5))
    assert cal.compute_s == pytest.approx(base.compute_s * 1.5 * 2.4)
    assert cal.comm_s > base.comm_s and cal.nbytes == base.nbytes  # bytes time-shared
    one = Coefficients(host=Host("cpu", cores=2, thread_speedup={2: 1.6}))
    assert rank_cost(parse_grid("1x1x1"), 0, n, nnz, dims, 4, one).compute_s == pytest.approx(
        rank_cost(parse_grid("1x1x1"), 0, n, nnz, dims, 4, Coefficients()).compute_s / 1.6)


def test_gcn_step_calibration_is_the_median_ratio_at_the_profiled_threads():
    coef = Coefficients(host=Host("cpu", cores=2, thread_speedup={2: 1.6}))
    steps = []
    for n, e, f, density in ((4000, 60_000, 256, 0.0), (8000, 120_000, 2048, 0.01),
                             (2000, 20_000, 128, 0.0)):
        pred = rank_cost(parse_grid("1x1x1"), 0, n, e, [f, 64, 8], 4, Coefficients(),
                         input_density=density or None).compute_s
        steps.append([n, e, f, 8, 64, 2, density, 3.0 * pred])
    steps[2][-1] *= 10  # a disturbed sample: the median ignores it
    assert gcn_step_calibration(coef, steps) == pytest.approx(3.0)
    assert gcn_step_calibration(coef, steps[:1]) == 1.0  # one sample does not calibrate
    prof = {"plexus": {"spmm_s_per_nnz_col": 2e-9, "gemm_s_per_fma": 1e-10,
                       "latency_s": 2e-5, "s_per_byte": 1e-9},
            "kernels": {"gcn_step": steps}, "hardware": {"cores": 2, "device": "cpu"},
            "collective_fits": {"all_gather": {"2": {"latency_s": 1e-4, "s_per_byte": 1e-9}},
                                "all_reduce": {"2": {"latency_s": 3e-4, "s_per_byte": 3e-9}}},
            "thread_speedup": {"2": 1.6}}
    c = Coefficients.from_profile(prof)
    assert c.compute_scale == pytest.approx(3.0) and c.host.thread_speedup == {2: 1.6}
    assert c.call("all_reduce", 2) == (3e-4, 3e-9) and c.call("all_gather", 2) == (1e-4, 1e-9)
    assert [row[:2] for row in c.collectives] == [("all_gather", 2), ("all_reduce", 2)]


def test_calls_of_small_groups_wait_on_every_time_sharing_rank():
    h = Host("cpu", cores=2, sync={2: 1e-4, 4: 1e-3})
    assert h.call_group(2, 2) == 2  # 2 ranks fit 2 cores: the group as profiled
    assert h.call_group(2, 4) == 4 and h.call_group(4, 4) == 4
    assert Host("cuda", cores=2).call_group(2, 64) == 2
    fits = tuple((op, g, lat, 0.0) for op in ("all_gather", "reduce_scatter", "all_reduce")
                 for g, lat in ((2, 1e-4), (4, 1e-3)))
    n, nnz, dims, g22 = 20_000, 400_000, [64, 64, 8], parse_grid("2x2x1")
    alone = plexus_estimate(g22, n, nnz, dims, 4, Coefficients(collectives=fits))
    shared = plexus_estimate(g22, n, nnz, dims, 4, Coefficients(collectives=fits, host=h))
    calls = rank_cost(g22, 0, n, nnz, dims, 4, Coefficients()).calls
    assert alone.comm_s == pytest.approx(calls * 1e-4)
    assert shared.comm_s == pytest.approx(calls * (1e-3 + 1e-3))  # 4-rank latency and wait


@pytest.mark.parametrize("host", [Host("cpu", cores=2, sync={2: 1e-4, 4: 3e-4}),
                                  Host("cpu", cores=64, sync={2: 1e-4, 4: 3e-4}),
                                  Host("cuda", cores=2)], ids=["2-cores", "64-cores", "gpu"])
def test_both_planners_price_a_collective_the_same_way(host):
    """The same latency and bandwidth fits priced by the attention model (time curves) and the
    3D model (per call + per byte) give one time for a call over g of a job's p ranks: one
    rule (:meth:`Host.collective_time`) for call groups, loaded waits, time-shared bytes and
    groups beyond the profiled ones."""
    fits = {2: (1e-4, 1e-9), 4: (1e-3, 2e-9)}
    sysm = SystemModel(collectives={"all_gather": fits}, host=host)
    coef = Coefficients(collectives=tuple(("all_gather", g, lat, spb)
                                          for g, (lat, spb) in fits.items()), host=host)
    for g, p in ((2, 2), (2, 4), (3, 4), (4, 8), (8, 8), (2, 16)):
        sent = 1 << 20
        per_call, per_byte = coef.price("all_gather", g, p)
        op = CommOp("all_gather", sent, sent, group="heads", group_size=g)
        assert comm_time([("heads", op)], p, None, sysm) == pytest.approx(
            per_call + per_byte * sent, rel=1e-12), (g, p)
