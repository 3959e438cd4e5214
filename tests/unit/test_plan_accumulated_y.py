"""The planner counts the float32 y a half-precision attention layer keeps for its backward.

The fused kernel (and a ring's merge) keep y in float32 beside the bf16 output the layer
returns (delta = rowsum(dY ∘ Y) from a bf16 y put 3-4 % errors into a hub row's gradients);
the strategies' Table-1 terms price that output at the activation size only, so a bf16 plan
was 4 bytes per kept output element short per layer."""

from dataclasses import replace

import pytest

from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.agp import Workload, memory_of
from plexgt.plan.step_cost import accumulated_y_bytes

STRATEGIES = list(default_registry())
W = Workload("gt", 20000, 200000, 64, 8, hidden=64, heads=4, layers=6)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("p", [1, 4])
def test_bf16_attention_memory_counts_the_float32_y_of_every_layer(strategy, p):
    half, single = replace(W, esize=2), W
    prob = replace(half.problem, head_parallel=2 if p == 4 else 1)
    work = strategy.work(prob, p)
    y = work.heads * work.rows * (W.hidden // W.heads) * 4
    assert y > 0 and accumulated_y_bytes(strategy, prob, p) == y
    assert accumulated_y_bytes(strategy, replace(prob, esize=4), p) == 0
    hp = prob.head_parallel
    got = memory_of(strategy, half, p, hp)["attention_activations"]
    att = strategy.memory(prob, p)
    table = W.layers * att.activation_bytes + att.transient_bytes + 3 * att.score_elems * 2
    assert got - table == W.layers * y  # every layer keeps its own until its backward
    # float32 activations: the returned y is the kept one; nothing added
    att32 = strategy.memory(replace(prob, esize=4), p)
    assert memory_of(strategy, single, p, hp)["attention_activations"] == (
        W.layers * att32.activation_bytes + att32.transient_bytes + 3 * att32.score_elems * 4)
    # checkpointed: one block's at a time; inference: no backward, nothing kept
    ck = memory_of(strategy, replace(half, checkpoint=True), p, hp)["attention_activations"]
    assert ck - (att.activation_bytes + att.transient_bytes + 3 * att.score_elems * 2) == y
    inf = memory_of(strategy, replace(half, inference=True), p, hp)["attention_activations"]
    assert inf == att.activation_bytes + att.transient_bytes
