"""Inference priced by the one chooser (``plexgt plan --inference``, ``predict --grid auto``):
one forward holds no gradients, no optimizer state and one layer's activations at a time, so
it fits memory that a training step of the same model does not."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from plexgt.cli import main
from plexgt.distributed.grid import Grid3D
from plexgt.models.stack import GCNArch, gcn_ops, op_widths
from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.agp import SystemModel, Workload, step_ops
from plexgt.plan.agp import estimate as agp_estimate
from plexgt.plan.choose import GraphSizes, ModelShape, NothingFits, choose
from plexgt.plan.plexus_cost import (
    Coefficients,
    chain_bytes,
    chain_layouts,
    estimate,
    rank_cost,
)

# a graph where memory, not the process base, decides: 10^6 nodes, 2·10^7 edges
SIZES = GraphSizes(1_000_000, 20_000_000, 128, 40)
FLAGS = ["--nodes", "1000000", "--edges", "20000000", "--features", "128", "--classes", "40",
         "--hidden", "256", "--layers", "3", "--world-size", "4"]


@pytest.mark.parametrize("model", ["gcn", "gt", "gps"])
def test_inference_prices_less_memory_and_fits_where_training_does_not(model):
    """The training step's least memory on 4 ranks is over the limit (NothingFits); the same
    model priced for inference fits it, below the limit, on 4 ranks."""
    sysm, coef = SystemModel(), Coefficients()
    train = ModelShape(model, 256 if model == "gcn" else 128, 3)
    infer = ModelShape(model, train.hidden, 3, inference=True)
    t = choose(SIZES, train, 4, sysm, coef).plan
    i = choose(SIZES, infer, 4, sysm, coef).plan
    # gcn: 2.69 against 3.17 GiB (training keeps each layer's saved tensors plus one layer's
    # working set, not every layer's working set); gt, gps: 0.52-0.54 of training's (priced
    # at its peak moment since issue 35's fix; 0.43 when every temporary was added at once)
    assert i.memory_bytes < (0.9 if model == "gcn" else 0.6) * t.memory_bytes, \
        (i.memory_bytes, t.memory_bytes)
    limit = (i.memory_bytes + t.memory_bytes) // 2
    with pytest.raises(NothingFits) as e:
        choose(SIZES, train, 4, sysm, coef, limit)
    assert e.value.least_memory is not None and e.value.least_memory[0] > limit
    fit = choose(SIZES, infer, 4, sysm, coef, limit).plan
    assert fit.memory_bytes <= limit and fit.scale == 4


def test_an_inference_pass_sends_only_the_forward_collectives():
    """Priced traffic of a forward is a strict part of the step's (no weight-gradient
    reduce-scatters, no backward all-gathers), and its compute is less."""
    g = Grid3D(2, 2, 1)
    dims = [128, 256, 256, 40]
    lays = chain_layouts(g, 0, 100_000, dims, "aggregate_first")
    step = chain_bytes(lays, 4, None, False, False)
    fwd = chain_bytes(lays, 4, None, False, False, forward_only=True)
    assert 0 < len(fwd) < len(step)
    assert not Counter(fwd) - Counter(step)  # each forward call is one of the step's
    a = estimate(g, 100_000, 2_000_000, dims, 4, Coefficients())
    b = estimate(g, 100_000, 2_000_000, dims, 4, Coefficients(), inference=True)
    assert b.bytes_per_rank < a.bytes_per_rank
    assert b.compute_s < a.compute_s and b.memory_bytes < a.memory_bytes


def test_inference_ignores_checkpointing():
    """A forward has no backward to recompute for: ``checkpoint`` changes neither planner's
    inference price (3D gcn: bytes, calls, compute, memory; gt on GP-AG with BatchNorm:
    collectives, compute, memory), while it does change the training step's."""
    arch = GCNArch(input_proj=True, head=True, residual="identity", norm="batch")
    ops = gcn_ops(64, 64, 8, 6, arch)
    g = Grid3D(2, 1, 2)
    cost = {(inf, ck): rank_cost(g, 0, 20000, 200000, op_widths(ops), 4, Coefficients(),
                                 ops=ops, norm="batch", inference=inf, checkpoint=ck)
            for inf in (False, True) for ck in (False, True)}
    assert cost[True, True] == cost[True, False]
    assert cost[False, True].mem < cost[False, False].mem
    assert cost[False, True].nbytes > cost[False, False].nbytes
    strat, sysm = default_registry().get("gp_ag"), SystemModel()
    est = {(inf, ck): agp_estimate(strat, Workload("gt", 20000, 200000, 64, 8, 64, 4, 6,
                                                   norm="batch", inference=inf,
                                                   checkpoint=ck), 4, sysm)
           for inf in (False, True) for ck in (False, True)}
    sent = {k: sum(o.total_sent for _, o in step_ops(strat, Workload(
        "gt", 20000, 200000, 64, 8, 64, 4, 6, norm="batch", inference=k[0],
        checkpoint=k[1]), 4)) for k in est}
    assert est[True, True] == est[True, False] and sent[True, True] == sent[True, False]
    assert est[False, True].memory["total"] < est[False, False].memory["total"]
    assert sent[False, True] > sent[False, False] > sent[True, False]


def test_plan_inference_fits_where_plan_of_training_does_not(tmp_path, capsys):
    """``plexgt plan`` at a limit between the two: the training plan exits 1 (nothing fits on
    4 ranks), ``--inference`` exits 0 with a choice under the limit and says it prices one
    forward pass (what predict --grid auto runs)."""
    js_t, js_i = tmp_path / "t.json", tmp_path / "i.json"
    assert main(["plan", "--model", "gcn", *FLAGS, "--json", str(js_t)]) == 0
    assert main(["plan", "--model", "gcn", *FLAGS, "--inference", "--json", str(js_i)]) == 0
    t, i = (json.loads(p.read_text())["choice"] for p in (js_t, js_i))
    gib = (t["memory_bytes"] + i["memory_bytes"]) / 2 / 2**30
    capsys.readouterr()
    assert main(["plan", "--model", "gcn", *FLAGS, "--memory-per-rank", f"{gib:.4f}"]) == 1
    assert "no configuration fits" in capsys.readouterr().out
    rc = main(["plan", "--model", "gcn", *FLAGS, "--memory-per-rank", f"{gib:.4f}",
               "--inference", "--json", str(js_i)])
    out = capsys.readouterr().out
    assert rc == 0
    got = json.loads(js_i.read_text())
    assert got["inference"] is True
    assert got["choice"]["memory_bytes"] <= gib * 2**30
    assert "what predict --grid auto runs" in out and "a forward" in out
    assert "plexgt train" not in out  # no train command for an inference plan
