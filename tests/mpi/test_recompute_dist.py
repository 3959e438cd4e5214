"""Activation checkpointing per block (model.checkpoint = 'block') on every layout: the 3D
GCN (residuals, BatchNorm and LayerNorm, pre-norm, jumping knowledge, dropout on) (gt and gps:
test_recompute_attention). Outputs, loss, gradients and BatchNorm's running
statistics equal the single-process model's, and the ledger equals the formula that counts
every block's forward collectives twice (and differs from the one that does not: the
recompute ran its collectives)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import cross_entropy

from plexgt.models.gcn import GCNArch, op_widths
from plexgt.models.layers import ModelGraph
from plexgt.parallel.plexus_loss import parallel_cross_entropy
from plexgt.plan.plexus_cost import plexus_step_bytes

from .conftest import WORLD, grids_for_world
from .test_plexus3d import TOL, N, prepared  # noqa: F401 - the prepared graph is a fixture
from .test_plexus_options import build, grads, my_rows

pytestmark = pytest.mark.timeout(600)

ARCHS = {
    "pre-bn-identity": (GCNArch(head=True, residual="identity", norm="batch", pre_norm=True),
                        "aggregate_first"),
    "ln-linear-jk-gemm": (GCNArch(input_proj=True, head=True, residual="linear", norm="layer",
                                  jk="cat"), "gemm_first"),
}


@pytest.mark.parametrize("grid", grids_for_world(every=False)[:2], ids=str)
@pytest.mark.parametrize("name", ARCHS)
def test_checkpointed_3d_gcn_equals_reference(prepared, dist_ctx, grid_groups,  # noqa: F811
                                              grid, name):
    arch, order = ARCHS[name]
    ref, (ahat, x, labels, train), model, lays, comms, data, ledger, ops = build(
        prepared, dist_ctx, grid_groups, grid, 4, arch, order, 4, dropout=0.3, seed=5)
    ref.checkpoint = model.checkpoint = True
    out_ref = ref(x, ModelGraph(gcn=ahat))
    cross_entropy(out_ref[train], labels[train]).backward()
    last = lays[-1]
    out = model(data.x)
    parallel_cross_entropy(out, data.labels, data.masks["train"], last, comms).backward()
    sent = ledger.by_name("sent")
    got = grads(model)
    state = model.to_canonical({k: v for k, v in model.state_dict().items()
                                if "running" in k or "tracked" in k})
    r = last.rows[1] - last.rows[0]
    mine = my_rows(prepared, last, out_ref.detach())
    torch.testing.assert_close(out[:r, : mine.shape[1]], mine, **TOL)
    want = dict(ref.named_parameters())
    for k, g in got.items():
        torch.testing.assert_close(g, want[k].grad, **TOL, msg=k)
    ref_state = ref.state_dict()
    for k, v in state.items():  # updated once, not again by the recompute
        torch.testing.assert_close(v, ref_state[k], **TOL, msg=k)
    kw = dict(ops=ops, norm=arch.norm)
    formula = plexus_step_bytes(grid, dist_ctx.rank, N, op_widths(ops), 8, 4, order, **kw,
                                checkpoint=True)
    assert sent == formula
    if WORLD > 1:
        assert formula != plexus_step_bytes(grid, dist_ctx.rank, N, op_widths(ops), 8, 4,
                                            order, **kw)
