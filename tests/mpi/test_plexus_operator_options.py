"""The model options (input Linear, residuals, norms, pre-norm, jumping knowledge, head) on
grid3d models of several operators (sage: the mean and the identity; mlp: the identity):
one step on the 3D grid equals the single-process model (outputs, loss, every canonical
gradient), the operators' stacked block and the residual's identity in one collective."""

from __future__ import annotations

import pytest
import torch

from plexgt.distributed.collectives import CommLedger
from plexgt.models.spec import parameter_lists
from plexgt.models.stack import GCNArch, gcn_ops, op_widths
from plexgt.parallel.plexus3d import Plexus3DGCN, plexus_comms
from plexgt.parallel.plexus_loss import parallel_cross_entropy
from plexgt.plan.plexus_cost import chain_layouts
from plexgt.tasks.gcn import read_plexus_inputs

from .conftest import grids_for_world
from .test_plexus3d_operators import (  # noqa: F401 - the prepared graph is a fixture
    DT,
    HIDDEN,
    MODELS,
    TOL,
    C,
    F,
    N,
    _reference,
    prepared,
)

pytestmark = pytest.mark.timeout(300)

ARCHS = {
    "linear-ln": (GCNArch(input_proj=True, head=True, residual="linear", norm="layer"),
                  "aggregate_first"),
    "pre-bn-identity": (GCNArch(head=True, residual="identity", norm="batch", pre_norm=True),
                        "aggregate_first"),
    "pre-bn-identity-g": (GCNArch(head=True, residual="identity", norm="batch",
                                  pre_norm=True), "gemm_first"),
    "pre-ln-identity": (GCNArch(head=True, residual="identity", norm="layer", pre_norm=True),
                        "aggregate_first"),
    "pre-bn-linear": (GCNArch(head=True, residual="linear", norm="batch", pre_norm=True),
                        "aggregate_first"),
    "jk-cat-gemm": (GCNArch(input_proj=True, head=True, residual="identity", norm="layer",
                            jk="cat"), "gemm_first"),
}


@pytest.mark.parametrize("grid", grids_for_world(every=False)[:2], ids=str)
@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("name", ["sage", "mlp"])
def test_options_on_operator_models_equal_reference(prepared, dist_ctx,  # noqa: F811
                                                    grid_groups, grid, arch, name):
    a, order = ARCHS[arch]
    graph, x, labels, train, _ = _reference(prepared)
    torch.manual_seed(7)
    ref = MODELS[name](F, HIDDEN, C, num_layers=3, dropout=0.0, seed=7, arch=a).to(DT)
    out_ref = ref(x, graph)
    loss_ref = torch.nn.functional.cross_entropy(out_ref[train], labels[train])
    loss_ref.backward()
    ops = gcn_ops(F, HIDDEN, C, 3, a)
    operators = MODELS[name].operators
    lays = chain_layouts(grid, dist_ctx.rank, N, op_widths(ops), order, False, ops)
    comms = plexus_comms(grid_groups(grid), CommLedger(), lays[-1])
    data = read_plexus_inputs(prepared, lays, DT, operators)
    model = Plexus3DGCN(lays, comms, data.adj, dtype=DT, node_ids=data.node_ids, ops=ops,
                        arch=a, out_ids=data.out_ids, names=parameter_lists(operators))
    model.load_reference(ref.state_dict())
    out = model(data.x)
    last = lays[-1]
    loss = parallel_cross_entropy(out, data.labels, data.masks["train"], last, comms)
    loss.backward()
    got = model.to_canonical({k: p.grad for k, p in model.named_parameters()})
    # every collective has run
    r0, r1 = last.rows
    c0, c1 = last.out_cols
    # the last op's rows are in its output order: P after an odd number of ops, Q after an
    # even one (three convs and a classifier end in Q)
    perm = prepared.read_perm(last.out_order)
    mine = out_ref[torch.from_numpy(perm[r0:r1])][:, min(c0, C):min(c1, C)]
    torch.testing.assert_close(out[: r1 - r0, : mine.shape[1]], mine.detach(), **TOL)
    torch.testing.assert_close(loss, loss_ref.detach(), **TOL)
    want = dict(ref.named_parameters())
    assert sorted(got) == sorted(want)
    for k, g in got.items():
        torch.testing.assert_close(g, want[k].grad, **TOL, msg=k)
