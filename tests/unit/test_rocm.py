"""ROCm GPUs have no torch.sparse.sampled_addmm: what reaches it is refused in one line before
anything is built, and plans never choose it there. A ROCm build is simulated by setting
``torch.version.hip`` (what torch itself reads to tell the builds apart).

No built-in strategy needs it any more (the rings' column blocks run on the fused kernel on a
GPU: tests/unit/test_attention_strategies_fused.py), so the refusal and the plan's exclusion
are checked on a registry whose gp_ring is marked as needing it, as a strategy of torch's
kernels would be."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from perf.agp_algorithm3 import plan, scales_for
from plexgt.errors import ConfigError
from plexgt.ops.attention import sampled_addmm_available
from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.agp import SystemModel
from plexgt.plan.choose import GraphSizes, ModelShape, choose, workload
from plexgt.plan.knobs import load_config
from plexgt.plan.machine import load_machine
from plexgt.tasks import devices
from plexgt.tasks.devices import check_attention_kernels
from plexgt.tasks.task import plexus_coefficients_for, system_model_for

GPU = torch.device("cuda", 0)
SIZES = GraphSizes(2_000_000, 60_000_000, 128, 40)
SHAPE = ModelShape("gt", 256, 3, 8)
RINGS = {"gp_ring", "gp_2d"}
"""The strategies marked as needing sampled_addmm in :func:`_registry` (the rings, which
did until their column blocks ran on the fused kernel)."""
FUSED = "gp_ag"


def _registry():
    """The built-in strategies with the rings marked as needing torch's SDDMM."""
    reg = default_registry()
    for name in RINGS:
        reg.register(replace(reg.get(name), needs_sampled_addmm=True), replace=True)
    return reg


@pytest.fixture
def marked(monkeypatch):
    """The run's checks see :func:`_registry` instead of the built-in one."""
    monkeypatch.setattr(devices, "default_registry", _registry)


@pytest.fixture
def rocm(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")


def _cfg(**kw):
    return load_config(None, {"data": "x", "model.name": "gt", "model.hidden": 64,
                              "model.heads": 4, **kw})


def test_only_a_rocm_gpu_lacks_sampled_addmm(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)
    assert sampled_addmm_available(GPU) and sampled_addmm_available("cpu")
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    assert not sampled_addmm_available(GPU) and not sampled_addmm_available("cuda")
    assert sampled_addmm_available("cpu")


def test_no_built_in_strategy_needs_it(rocm):
    """Every registered strategy, the rings included, runs on a ROCm GPU."""
    assert not any(s.needs_sampled_addmm for s in default_registry())
    for name in default_registry().names():
        check_attention_kernels(_cfg(**{"parallel.strategy": name}), GPU)


def test_what_reaches_sampled_addmm_is_refused_on_a_rocm_gpu_naming_the_key(rocm, marked):
    for name in sorted(RINGS):
        with pytest.raises(ConfigError, match=f"'parallel.strategy': {name} .*sampled_addmm"
                                              ".*ROCm.*; use auto, "):
            check_attention_kernels(_cfg(**{"parallel.strategy": name}), GPU)
    with pytest.raises(ConfigError, match=r"'model.heads': d' = 512 is wider .*ROCm"):
        check_attention_kernels(_cfg(**{"model.hidden": 1024, "model.heads": 2}), GPU)
    # what the fused kernel serves runs: d' <= 256 (an edge bias too: model.edge_bias is on
    # by default, and the fused kernel takes it), auto strategy
    check_attention_kernels(_cfg(), GPU)
    check_attention_kernels(_cfg(**{"parallel.strategy": FUSED}), GPU)
    # gcn has no attention; the CPU has sampled_addmm
    check_attention_kernels(load_config(None, {"data": "x"}), GPU)
    check_attention_kernels(_cfg(**{"parallel.strategy": sorted(RINGS)[0]}),
                            torch.device("cpu"))


def test_without_rocm_nothing_is_refused(monkeypatch, marked):
    monkeypatch.setattr(torch.version, "hip", None)
    for name in RINGS:
        check_attention_kernels(_cfg(**{"parallel.strategy": name}), GPU)


def test_the_plan_never_chooses_them_on_a_rocm_gpu(rocm):
    """On a CUDA GPU this workload's fastest layout is a ring; on a ROCm GPU (the run's
    device, whatever the profile says) another is chosen, at every scale, and a ring asked
    for by name has no plan."""
    prof = load_machine("perlmutter").profile(16)
    coef = plexus_coefficients_for(prof)
    cuda = replace(system_model_for(prof), host=replace(system_model_for(prof).host,
                                                        rocm=False))
    reg = _registry()
    assert choose(SIZES, SHAPE, 16, cuda, coef, registry=reg).plan.strategy in RINGS
    amd = system_model_for(prof, GPU)
    assert amd.host.rocm and not system_model_for(prof, torch.device("cpu")).host.rocm
    got = choose(SIZES, SHAPE, 16, amd, coef, any_scale=True, registry=reg)
    assert got.plan.strategy not in RINGS
    assert all(c.strategy not in RINGS for c in got.search.best_per_scale)
    with pytest.raises(ConfigError, match="no configuration"):
        choose(SIZES, SHAPE, 16, amd, coef, strategy=sorted(RINGS)[0], registry=reg)
    # the built-in rings run on the fused kernel there: the plan is the CUDA one's
    assert choose(SIZES, SHAPE, 16, amd, coef).plan.strategy in RINGS


def test_a_rocm_machine_description_plans_without_them():
    """frontier.toml says runtime = "rocm": its profile carries it to the planner, whose
    search and table leave out the strategies that need sampled_addmm (the table says
    why)."""
    prof = load_machine("frontier").profile(16)
    sysm = SystemModel.from_profile(prof)
    assert sysm.host.rocm and not SystemModel.from_profile(
        load_machine("perlmutter").profile(16)).host.rocm
    reg = _registry()
    assert choose(SIZES, SHAPE, 16, sysm, plexus_coefficients_for(prof),
                  registry=reg).plan.strategy not in RINGS
    pl = plan(workload(SIZES, SHAPE), list(reg), scales_for(16), sysm)
    rings = [r for r in pl.rows if r.est.strategy in RINGS]
    assert rings and all(not r.chosen and "sampled_addmm" in r.why for r in rings)
    assert pl.choice is not None and pl.choice.est.strategy not in RINGS
