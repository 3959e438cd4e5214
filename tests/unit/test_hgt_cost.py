"""hgt's cost model: parameter and memory counts against hand counts, the step's structure."""

from __future__ import annotations

import pytest
from torch import nn

from plexgt.errors import ConfigError
from plexgt.plan.agp import SystemModel
from plexgt.plan.batch_cost import ring_exchanges, step_seconds
from plexgt.plan.batch_fits import BatchProfile, BlockFit, Fit, default_profile
from plexgt.plan.batch_memory import memory_parts, stage_memory
from plexgt.plan.batch_shape import BatchMesh, BatchShape, check_mesh, position
from plexgt.plan.host import Host

# d = 8, h = 2, m = 2, N' = 8, N_s = 1, G = 4, F = 5, C = 3, T = 4, |V| = 10, D = 4, float32
SMALL = BatchShape(layers=4, hidden=8, heads=2, size=8, sequences=4, features=5, classes=3,
                 ffn_mult=2, global_nodes=1, targets=4, nodes=10, embed_dim=4, esize=4)


def _count(*mods: nn.Module) -> int:
    return sum(p.numel() for m in mods for p in m.parameters())


def test_parameters_equal_the_torch_modules_of_the_design():
    d, m, h = 8, 2, 2
    block = [nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d), nn.LayerNorm(d),
             nn.Linear(d, m * d), nn.Linear(m * d, d), nn.Embedding(5, h)]
    assert SMALL.block_params == _count(*block) == 610
    embed = [nn.Linear(5 + 4, d), nn.Embedding(10, 4)]
    assert SMALL.embed_params == _count(*embed) + 1 * d
    assert SMALL.head_params == _count(nn.LayerNorm(d), nn.Linear(d, 3))
    assert SMALL.params == 4 * 610 + SMALL.embed_params + SMALL.head_params


def test_memory_parts_by_hand():
    # dp 2, cp 2, K 2: 2 sequences alive per replica, micro-batch b = 1; R = 8/2 + 1 = 5 query
    # rows, Rk = 4 own key rows
    mp = memory_parts(SMALL, BatchMesh(dp=2, pp=2, cp=2, micro_batches=2))
    assert mp.block_states == 610 * 16  # param + grad + 2 AdamW moments, float32
    per_seq = 5 * 8 * 4 * (7 + 2 * 2) + 4 * 5 * (2 + 4)  # [R,d] x 7, [R,md] x 2, lse, LN stats
    assert mp.block_saved == 2 * per_seq
    assert mp.codes == 2 * 4 * 8  # int8 [Rk, N'] per alive sequence
    scores = 3 * 1 * 2 * 5 * (4 + 1) * 4  # 3 float32 [b, h, R, Rk + N_s]
    grads = 1 * 5 * 8 * 4 * (6 + 2)  # [b, R, d] x 6 and [b, R, md] x 1
    ring = 8 * 1 * 4 * 8 * 4  # K, V, dK, dV, current and next
    assert mp.transient == scores + grads + ring
    assert mp.p2p == 2 * 1 * 5 * 8 * 4  # h and dh only: every rank builds its own hop codes
    assert mp.first_states == SMALL.embed_params * 16
    assert mp.first_saved == 2 * 4 * ((5 + 4) * 4 + 8)
    assert mp.last_saved == 2 * 4 * (2 * 8 * 4 + 4 * 3)
    # a stage adds its blocks; the first also its embedding; the only stage both ends
    mid = mp.stage(3, 1)
    assert mid["states"] == 3 * mp.block_states and mid["activations"] == 3 * mp.block_saved
    only = mp.stage(4, 3)
    assert only["states"] == 4 * mp.block_states + mp.first_states + mp.last_states
    prof = BatchProfile({0: BlockFit()}, BlockFit(), BlockFit(), Fit(0, 0), Fit(0, 0), {},
                      memory_scale=1.5, memory_base_bytes=100)
    mesh = BatchMesh(2, 2, 2, 2)
    assert stage_memory(SMALL, prof, mesh, 3, 1) == int(1.5 * sum(mid.values()) + 100)


def test_gpipe_keeps_every_micro_batch_alive():
    """Saved activations depend on the replica's sequences, not on K; the transient on K."""
    a = memory_parts(SMALL, BatchMesh(1, 2, 1, 1))
    b = memory_parts(SMALL, BatchMesh(1, 2, 1, 4))
    assert a.block_saved == b.block_saved and a.codes == b.codes
    assert b.transient * 4 == a.transient
    assert memory_parts(SMALL, BatchMesh(2, 2, 1, 1)).block_saved * 2 == a.block_saved


def test_ring_exchanges_leave_global_nodes_home():
    assert ring_exchanges(SMALL, 1, 3) == (0, 0)
    n, each = ring_exchanges(SMALL, 4, 3)
    assert n == 3 * 3 and each == 2 * 3 * (8 // 4) * 8 * 4


def _unit_profile(**kw) -> BatchProfile:
    return BatchProfile({0: BlockFit(per_call_s=1.0), 2: BlockFit(per_call_s=0.5)},
                      BlockFit(per_call_s=0.3), BlockFit(per_call_s=0.2), Fit(0.01, 0.0),
                      Fit(0.02, 0.0), {2: Fit(0.1, 0.0), 4: Fit(0.2, 0.0)},
                      optimizer_s_per_param=0.0, **kw)


def test_step_is_gpipes_critical_path_plus_the_tail():
    prof = _unit_profile()
    mesh = BatchMesh(dp=2, pp=2, cp=1, micro_batches=2)
    c = step_seconds(SMALL, prof, mesh, (1, 3))
    # stage 0: 1 block + embed + 2 sends; stage 1: 3 blocks + head + 2 sends
    assert c.stage_s == pytest.approx((1 + 0.3 + 0.02, 3 + 0.2 + 0.02))
    # GPipe's critical path: both stages once, then K - 1 = 1 more of the slowest (the
    # (K + P_pp - 1) x slowest form priced 3 x 3.22 = 9.66 s)
    assert c.pipeline_s == pytest.approx(1.32 + 3.22 + (2 - 1) * 3.22)
    assert c.tail_s == pytest.approx(0.1)  # the stage group's all-reduce over dp·cp = 2
    # at cp = 2 the per-cp fit and 3 ring exchanges per block
    c2 = step_seconds(SMALL, prof, BatchMesh(1, 1, 2, 1), (4,))
    assert c2.stage_s[0] == pytest.approx(4 * (0.5 + 3 * 0.02) + 0.3 + 0.2)
    assert c2.tail_s == pytest.approx(0.1)


def test_depth_term_is_piecewise_linear_per_stage():
    prof = _unit_profile(depth=((2, 1.5),))
    assert prof.depth_blocks(2) == 2 and prof.depth_blocks(4) == pytest.approx(2 + 2 * 1.5)
    c = step_seconds(SMALL, prof, BatchMesh(1, 1, 1, 1), (4,))
    assert c.stage_s[0] == pytest.approx(5 + 0.3 + 0.2)


def test_default_profile_prices_with_the_system_model():
    prof = default_profile(SMALL)
    fast = SystemModel(kernels={**SystemModel().kernels, "gemm_s_per_fma": 1e-12,
                                "elementwise_s_per_elem": 1e-12, "copy_s_per_elem": 1e-12})
    quick = default_profile(SMALL, fast)
    assert 0 < quick.block[0].per_row_s < prof.block[0].per_row_s
    assert prof.allreduce_time(8, 1e6) > prof.allreduce_time(2, 1) > 0
    assert prof.allreduce_time(1, 1e6) == 0
    back = BatchProfile.from_dict(prof.to_dict())
    assert back.block == prof.block and back.allreduce == prof.allreduce
    mesh = BatchMesh(1, 2, 2, 2)
    assert step_seconds(SMALL, back, mesh, (2, 2)).step_s == pytest.approx(
        step_seconds(SMALL, prof, mesh, (2, 2)).step_s)


@pytest.mark.parametrize("mesh, msg", [
    (BatchMesh(3, 1, 1, 1), "'parallel.dp': 3 does not divide batch.sequences=4"),
    (BatchMesh(1, 1, 3, 1), "'parallel.cp': 3 does not divide batch.size=8"),
    (BatchMesh(2, 1, 1, 4), "'parallel.micro_batches': 4 does not divide a replica's 2 "
                            "sequences"),
    (BatchMesh(1, 1, 1, 0), "'parallel.micro_batches': 0 does not divide"),
    (BatchMesh(1, 5, 1, 1), "'parallel.pp': 5 stages for model.layers=4"),
])
def test_bad_meshes_name_the_key(mesh, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        check_mesh(SMALL, mesh)
    assert "\n" not in str(e.value)


def test_bad_stages_name_the_problem():
    prof = _unit_profile()
    with pytest.raises(ConfigError, match="sums to 5 layers, not model.layers=4"):
        step_seconds(SMALL, prof, BatchMesh(1, 2, 1, 1), (2, 3))
    with pytest.raises(ConfigError, match="has a stage with no layer"):
        step_seconds(SMALL, prof, BatchMesh(1, 2, 1, 1), (4, 0))
    with pytest.raises(ConfigError, match="'4' is 1 stages, parallel.pp=2"):
        step_seconds(SMALL, prof, BatchMesh(1, 2, 1, 1), (4,))
    assert position(0, 1) == 3 and position(0, 3) == 0 and position(1, 3) == 1


def test_compute_is_priced_at_the_profiles_own_contention_not_the_hosts_cached_one():
    """The cached quick calibration's κ(2) = 1.87 (taken under another load) priced W = 2
    35 % slow; a profile that measured κ in its own run prices with that: 1.4 at 2 ranks,
    2.5 at 4 (above the 2 cores' time-sharing), the host's for sizes it did not measure."""
    host = Host("cpu", cores=2, threads=1, contention={2: 1.87})
    cached = _unit_profile(host=host)
    own = _unit_profile(host=host, contention={2: 1.4, 4: 2.5})
    alone = 4 * 1.0 + 0.3 + 0.2  # 4 blocks, embed, head: one rank's stage
    for dp, kappa_cached, kappa_own in ((2, 1.87, 1.4), (4, 2 * 1.87, 2.5)):
        mesh = BatchMesh(dp=dp, pp=1, cp=1, micro_batches=1)
        assert step_seconds(SMALL, cached, mesh, (4,)).stage_s[0] == pytest.approx(
            alone * kappa_cached)
        assert step_seconds(SMALL, own, mesh, (4,)).stage_s[0] == pytest.approx(
            alone * kappa_own)
    assert own.compute_factor(1) == 1.0
    # beyond: the host's time-sharing rule, κ(full = 2)·p/2, from this profile's κ(2)
    assert own.compute_factor(8) == pytest.approx(1.4 * 8 / 2)
    assert cached.compute_factor(8) == pytest.approx(1.87 * 8 / 2)
    assert BatchProfile.from_dict(own.to_dict(), host).contention == {2: 1.4, 4: 2.5}


def test_a_pipeline_bubble_lends_no_threads():
    """A job of 2 ranks on 2 cores gives each rank 1 thread; a K = 1 pipeline computes on one
    rank at a time, but that rank still has its 1 thread, not the 2 a lone rank would get.
    Priced with the 2-thread speedup (1.68x), pp = 2 at K = 1 came out 1.1x dp = 2 where it
    measured 1.86x (bench_hgt_ablation, Computers, 16 layers)."""
    host = Host("cpu", cores=2, threads=1, thread_speedup={2: 1.68})
    prof = _unit_profile(host=host, contention={2: 1.1})
    assert prof.compute_factor(1) == pytest.approx(1 / 1.68)  # a 1-rank job: 2 threads
    assert prof.compute_factor(1, world=2) == 1.0
    assert host.compute_factor(1, 2) == 1.0
    pp = step_seconds(SMALL, prof, BatchMesh(dp=1, pp=2, cp=1, micro_batches=1), (2, 2))
    one = step_seconds(SMALL, prof, BatchMesh(dp=1, pp=1, cp=1, micro_batches=1), (4,))
    # each stage at its 1 thread (factor 1): blocks, embed / head, the two sends
    assert pp.stage_s == pytest.approx((2 + 0.3 + 0.02, 2 + 0.2 + 0.02))
    alone = 4 * 1.0 + 0.3 + 0.2
    assert one.stage_s[0] == pytest.approx(alone / 1.68)
