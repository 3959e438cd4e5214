"""The planner budgets what a plan may fill of a GPU, not its whole memory: 0.9 of it less a
1.5 GiB reserve (CUDA context, NCCL communicators) by default, configurable per run and per
machine description. No GPU here: torch.cuda.get_device_properties is monkeypatched."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from plexgt.data.loader import PreparedGraph
from plexgt.errors import ConfigError
from plexgt.plan.knobs import load_config
from plexgt.plan.machine import MachineError, load_machine, usable_memory
from plexgt.tasks.task import memory_limit, run_plan
from tests.datagen import prepared_sbm

GiB = 2**30
GPU = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return PreparedGraph(prepared_sbm(tmp_path_factory.mktemp("headroom") / "prep", 90, 600,
                                      num_features=6, num_classes=3, seed=3))


def _gpu_of(monkeypatch, total: int) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(total_memory=total))


def test_what_a_plan_may_fill_is_a_fraction_less_a_reserve(monkeypatch):
    assert usable_memory(80 * GiB) == int(0.9 * 80 * GiB - 1.5 * GiB)
    assert usable_memory(GiB) == 0 and usable_memory(10 * GiB, 1.0, 0.0) == 10 * GiB
    _gpu_of(monkeypatch, 80 * GiB)
    cfg = load_config(None, {"data": "x"})
    assert memory_limit(cfg, GPU) == int(70.5 * GiB)
    own = load_config(None, {"data": "x", "parallel.gpu_memory_fraction": 0.5,
                             "parallel.gpu_memory_reserve_gb": 0})
    assert memory_limit(own, GPU) == 40 * GiB
    given = load_config(None, {"data": "x", "parallel.memory_per_rank_gb": 79})
    assert memory_limit(given, GPU) == 79 * GiB  # the user's own limit is taken as given
    assert memory_limit(cfg, torch.device("cpu")) is None


@pytest.mark.parametrize("key,value", [("gpu_memory_fraction", 0), ("gpu_memory_fraction", 1.2),
                                       ("gpu_memory_reserve_gb", -1)])
def test_a_bad_headroom_is_a_one_line_error(key, value):
    with pytest.raises(ConfigError, match=f"parallel.{key}"):
        load_config(None, {f"parallel.{key}": value})


def test_a_plan_that_fits_the_whole_gpu_but_not_the_headroom_is_not_chosen(prepared,
                                                                           monkeypatch):
    """gt's whole-row plan needs M bytes; on a GPU of M/0.95 it fit before (the whole GPU
    was budgeted), and OOMs in practice. Now, with the reserve off, 0.9 of that GPU holds
    only a blocked plan; with the default 1.5 GiB reserve nothing fits such a small GPU."""
    # 8 heads of width 2: the attention's [h, E] scores, which blocking cuts, set the peak
    # (at 2 heads the FFN backward's moment is the peak, and blocked rows save 3.5 %)
    base = {"data": str(prepared.path), "model.name": "gt", "model.hidden": 16,
            "model.heads": 8}
    whole = run_plan(load_config(None, base), prepared, 1)
    assert whole.attention_block_rows == 0
    total = int(whole.memory_bytes / 0.95)
    _gpu_of(monkeypatch, total)
    cfg = load_config(None, {**base, "parallel.gpu_memory_reserve_gb": 0})
    rp = run_plan(cfg, prepared, 1, GPU)
    assert rp.attention_block_rows > 0 and rp.memory_bytes <= 0.9 * total < whole.memory_bytes
    full = load_config(None, {**base, "parallel.gpu_memory_fraction": 1.0,
                              "parallel.gpu_memory_reserve_gb": 0})
    assert run_plan(full, prepared, 1, GPU).attention_block_rows == 0  # as before
    with pytest.raises(ConfigError, match="no configuration fits"):
        run_plan(load_config(None, base), prepared, 1, GPU)


def test_machine_descriptions_budget_the_headroom_too(tmp_path):
    m = load_machine("perlmutter")
    assert m.memory_per_gpu_bytes == 40 * GiB
    assert m.usable_memory_bytes == int(0.9 * 40 * GiB - 1.5 * GiB)
    text = (load_machine("dgx-a100").path and open(load_machine("dgx-a100").path).read())
    own = tmp_path / "m.toml"
    own.write_text(text.replace("memory_fraction = 0.9", "memory_fraction = 1.0")
                   .replace("memory_reserve_gib = 1.5", "memory_reserve_gib = 0"))
    assert load_machine(own).usable_memory_bytes == 40 * GiB
    own.write_text(text.replace("memory_fraction = 0.9", "memory_fraction = 2"))
    with pytest.raises(MachineError, match="node.memory_fraction = 2 must be"):
        load_machine(own)
