"""Activation checkpointing per block (model.checkpoint = 'block') on the single-process
models: outputs, gradients and BatchNorm's running statistics equal to no checkpointing
(float64, dropout on: the recomputed masks are the original ones), and the recompute really
runs (each block's forward twice)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plexgt.distributed.collectives import all_reduce_bytes
from plexgt.distributed.grid import Grid3D
from plexgt.models import GPS, GraphTransformer, ModelGraph
from plexgt.models.gcn import GCN
from plexgt.models.mlp import MLP
from plexgt.models.recompute import checkpointed, recomputing
from plexgt.models.sage import SAGE
from plexgt.models.stack import GCNArch, gcn_ops, op_widths
from plexgt.ops.rng import CounterRNG
from plexgt.parallel.attention.registry import default_registry
from plexgt.plan.agp import Workload, memory_of, step_ops
from plexgt.plan.plexus_cost import Coefficients, rank_cost

DT = torch.float64


def _graph(n=30, f=5, seed=1):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, 4 * n), rng.integers(0, n, 4 * n)
    keep = src != dst
    src, dst = np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])
    g = ModelGraph.from_edges(dst, src, n, mean=True)
    x = torch.from_numpy(rng.normal(size=(n, f)))
    y = torch.from_numpy(rng.integers(0, 3, n))
    return x, g, y


def _step(model, x, g, y, steps=2):
    outs = []
    for _ in range(steps):
        model.zero_grad()
        out = model(x, g)
        torch.nn.functional.cross_entropy(out, y).backward()
        outs.append((out.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}))
    return outs, {k: b.clone() for k, b in model.state_dict().items()}


def _both(make, x, g, y):
    """(no checkpointing, checkpointing) of two training steps from the same weights."""
    plain = make(False).to(DT)
    ckpt = make(True).to(DT)
    ckpt.load_state_dict(plain.state_dict())
    return _step(plain, x, g, y), _step(ckpt, x, g, y)


def _assert_equal(a, b):
    (outs_a, state_a), (outs_b, state_b) = a, b
    for (oa, ga), (ob, gb) in zip(outs_a, outs_b):
        torch.testing.assert_close(ob, oa, rtol=0, atol=0)
        assert sorted(ga) == sorted(gb)
        for k in ga:
            torch.testing.assert_close(gb[k], ga[k], rtol=1e-12, atol=1e-14, msg=k)
    for k in state_a:  # running statistics updated once a step, num_batches_tracked too
        torch.testing.assert_close(state_b[k], state_a[k], rtol=0, atol=0, msg=k)


ARCHS = {
    "plain": GCNArch(),
    "linear-bn": GCNArch(input_proj=True, head=True, residual="linear", norm="batch"),
    "pre-bn-jk": GCNArch(head=True, residual="identity", norm="batch", pre_norm=True,
                         jk="cat"),
    "pre-ln": GCNArch(head=True, residual="identity", norm="layer", pre_norm=True),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cls", [GCN, SAGE, MLP], ids=lambda c: c.__name__)
def test_grid3d_models_equal_without_checkpointing(cls, arch):
    x, g, y = _graph()

    def make(ck):
        torch.manual_seed(4)
        return cls(5, 8, 3, num_layers=4, dropout=0.3, seed=9, arch=ARCHS[arch],
                   checkpoint=ck)

    plain, ckpt = _both(make, x, g, y)
    _assert_equal(plain, ckpt)


@pytest.mark.parametrize("norm,pre", [("layer", False), ("batch", True)])
@pytest.mark.parametrize("cls", [GraphTransformer, GPS], ids=lambda c: c.__name__)
def test_attention_models_equal_without_checkpointing(cls, norm, pre):
    x, g, y = _graph()

    def make(ck):
        torch.manual_seed(4)
        return cls(5, 8, 3, num_layers=3, heads=2, dropout=0.3, seed=9, norm=norm,
                   pre_norm=pre, jk="max", checkpoint=ck)

    plain, ckpt = _both(make, x, g, y)
    _assert_equal(plain, ckpt)


def test_each_block_runs_again_in_backward_with_the_same_dropout_mask():
    """The recompute runs (recomputing() inside it) and draws the mask the forward drew."""
    x = torch.randn(6, 4, dtype=DT, requires_grad=True)
    rng = CounterRNG(1, 2, torch.arange(6))
    seen: list[tuple[bool, torch.Tensor]] = []

    def block(t):
        y = rng.dropout(t, 0.5, 3, 0)
        seen.append((recomputing(), (y != 0).clone()))
        return (y * y).sum(1, keepdim=True)

    checkpointed(block, x).sum().backward()
    assert [r for r, _ in seen] == [False, True]
    assert torch.equal(seen[0][1], seen[1][1])
    mask = seen[0][1].to(DT)
    torch.testing.assert_close(x.grad, 2 * x * mask * 4)  # (x/(1-p))² -> 2x/(1-p)², p = 0.5
    with torch.no_grad():  # evaluation: no recompute machinery
        checkpointed(block, x)
    assert len(seen) == 3


def test_the_planner_prices_checkpointing():
    """Deeper stacks: checkpointing keeps the inputs plus one block's activations (memory
    falls, and grows with depth by an input per layer only) for one more forward of compute
    and of the blocks' forward collectives."""
    arch = GCNArch(input_proj=True, head=True, residual="identity", norm="layer")
    grid = Grid3D(2, 1, 2)
    cost = {}
    for layers in (6, 12):
        ops = gcn_ops(64, 64, 8, layers, arch)
        for ck in (False, True):
            cost[layers, ck] = rank_cost(grid, 0, 20000, 200000, op_widths(ops), 4,
                                         Coefficients(), 256, "aggregate_first", ops=ops,
                                         norm="layer", checkpoint=ck)
    for layers in (6, 12):
        plain, ck = cost[layers, False], cost[layers, True]
        assert ck.mem < plain.mem and ck.compute_s > plain.compute_s
        assert ck.nbytes > plain.nbytes and ck.calls > plain.calls
    assert cost[12, True].mem - cost[6, True].mem < (cost[12, False].mem
                                                     - cost[6, False].mem) / 2
    strat = default_registry().get("gp_ag")
    w = {ck: Workload("gt", 20000, 200000, 64, 8, 64, 4, 12, norm="batch", checkpoint=ck)
         for ck in (False, True)}
    mem = {ck: memory_of(strat, w[ck], 4) for ck in w}
    assert mem[True]["total"] < mem[False]["total"]
    sent = {ck: sum(o.total_sent for _, o in step_ops(strat, w[ck], 4)) for ck in w}
    fwd = sum(o.total_sent for _, o in step_ops(strat, w[False], 4) if o.phase == "forward")
    loss = all_reduce_bytes(2 * 4, 4)  # the loss statistics' (forward, in no block)
    assert sent[True] - sent[False] == fwd - loss > 0  # every block's forward once more
