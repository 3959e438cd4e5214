"""The planner counts the float32 y a half-precision attention layer keeps for its backward.

The fused kernel (and a ring's merge) keep y in float32 beside the bf16 output the layer
returns (delta = rowsum(dY ∘ Y) from a bf16 y put 3-4 % errors into a hub row's gradients);
the strategies' Table-1 terms price that output at the activation size only, so a bf16 plan
was 4 bytes per kept output element short per layer."""

from dataclasses import replace

import pytest

from plexgt.parallel.attention.registry import default_registry
from plexgt.plan import step_cost
from plexgt.plan.agp import Workload, memory_of
from plexgt.plan.step_cost import accumulated_y_bytes

STRATEGIES = list(default_registry())
W = Workload("gt", 20000, 200000, 64, 8, hidden=64, heads=4, layers=6)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("p", [1, 4])
def test_bf16_attention_memory_counts_the_float32_y_of_every_layer(strategy, p, monkeypatch):
    half, single = replace(W, esize=2), W
    prob = replace(half.problem, head_parallel=2 if p == 4 else 1)
    work = strategy.work(prob, p)
    y = work.heads * work.rows * (W.hidden // W.heads) * 4
    assert y > 0 and accumulated_y_bytes(strategy, prob, p) == y
    assert accumulated_y_bytes(strategy, replace(prob, esize=4), p) == 0
    hp = prob.head_parallel

    def att(w):
        return memory_of(strategy, w, p, hp)["attention_activations"]

    got = {k: att(w) for k, w in (("train", half), ("f32", single),
                                  ("ckpt", replace(half, checkpoint=True)),
                                  ("infer", replace(half, inference=True)))}
    monkeypatch.setattr(step_cost, "accumulated_y_bytes", lambda *a, **k: 0)
    base = {k: att(w) for k, w in (("train", half), ("f32", single),
                                   ("ckpt", replace(half, checkpoint=True)),
                                   ("infer", replace(half, inference=True)))}
    assert got["train"] - base["train"] == W.layers * y  # every layer keeps its own
    assert got["f32"] == base["f32"]  # float32: the returned y is the kept one
    assert got["ckpt"] - base["ckpt"] == y  # checkpointed: one block's at a time
    assert got["infer"] == base["infer"]  # inference: no backward, nothing kept
