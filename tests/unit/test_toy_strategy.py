"""A strategy is one registration: a toy registered here, in this file alone, is planned by
``plexgt plan`` and trained by ``plexgt train``'s task builder and loop, on its own forward."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch
import torch.distributed as dist

from plexgt.commands import plan as plan_cmd
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.synthetic import sbm
from plexgt.distributed.bootstrap import DistContext
from plexgt.distributed.collectives import CommLedger
from plexgt.errors import ConfigError
from plexgt.parallel.attention.gp_ag import GP_AG
from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.knobs import load_config
from plexgt.tasks import build_task
from plexgt.training import loop


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    path = tmp_path_factory.mktemp("toy") / "sbm"
    g = sbm(90, 600, num_features=6, num_classes=3, seed=3)
    prepare(MemorySource(g), PrepOptions(out=path, symmetrize=True, progress=False))
    return path


@pytest.fixture()
def world():
    """A one-rank gloo group (train's collectives, without peers)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def toy_registry(calls: list[int]):
    """The built-in strategies and 'toy': GP-AG's collectives under another name, its forward
    counting its calls (so a run on it is seen to run it)."""

    def forward(*a, **kw):
        calls.append(1)
        return GP_AG.forward(*a, **kw)

    reg = default_registry()
    reg.register(dataclasses.replace(GP_AG, name="toy", description="a test's strategy",
                                     forward=forward))
    return reg


def test_plan_searches_a_registered_toy(prepared, tmp_path):
    reg = toy_registry([])
    parser = argparse.ArgumentParser()
    plan_cmd.add_arguments(parser)
    js = tmp_path / "plan.json"
    args = parser.parse_args(["--data", str(prepared), "--model", "gt", "--world-size", "2",
                              "--hidden", "8", "--heads", "2", "--strategies", "toy",
                              "--json", str(js)])
    args.overrides = []
    assert plan_cmd.run(args, registry=reg) == 0
    assert json.loads(js.read_text())["choice"]["strategy"] == "toy"
    args.overrides = ["--parallel.strategy=toy"]
    args.strategies = None
    assert plan_cmd.run(args, registry=reg) == 0
    assert json.loads(js.read_text())["choice"]["strategy"] == "toy"


def test_train_runs_a_registered_toy_on_the_curve_of_the_strategy_it_copies(prepared, world,
                                                                            tmp_path):
    calls: list[int] = []
    reg = toy_registry(calls)
    base = {"data": str(prepared), "model.name": "gt", "epochs": 3, "progress": False,
            "model.hidden": 8, "model.heads": 2, "dtype": "float64"}
    with pytest.raises(ConfigError, match="'parallel.strategy': 'toy' is not one of"):
        load_config(None, {**base, "parallel.strategy": "toy"})  # not in the built-in one
    ctx = DistContext(0, 1, 0, 1, "gloo", torch.device("cpu"), "single")
    curves = {}
    for name in ("toy", "gp_ag"):
        cfg = load_config(None, {**base, "parallel.strategy": name,
                                 "metrics": str(tmp_path / f"{name}.jsonl")}, registry=reg)
        task = build_task(cfg, ctx, CommLedger(), reg)
        assert task.plan.strategy == name
        loop.train(cfg, ctx, task, log=lambda m: None)
        curves[name] = [json.loads(ln)["loss"]
                        for ln in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert calls and curves["toy"] == curves["gp_ag"]
