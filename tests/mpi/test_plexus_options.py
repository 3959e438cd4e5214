"""The 3D GCN's options (input projection, classifier, residuals, LayerNorm / BatchNorm, pre-
or post-norm, jumping knowledge) against the single-process GCN with the same options.

float64; outputs, loss, every parameter's gradient (reassembled into the reference's names),
BatchNorm's running statistics and the evaluation forward that reads them, and the ledger
against the cost model's formula, to the byte, on the representative grids of the world.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.functional import cross_entropy

from plexgt.distributed.collectives import CommLedger
from plexgt.models.gcn import GCN, GCNArch, gcn_ops, op_widths
from plexgt.models.layers import ModelGraph
from plexgt.parallel.plexus3d import Plexus3DGCN, plexus_comms
from plexgt.parallel.plexus_loss import parallel_cross_entropy
from plexgt.plan.plexus_cost import chain_layouts, plexus_step_bytes
from plexgt.tasks.gcn import read_plexus_inputs

from .conftest import WORLD, grids_for_world
from .test_plexus3d import (  # noqa: F401 - the prepared graphs are fixtures
    DT,
    TOL,
    C,
    F,
    N,
    _reference,
    prepared,
    prepared_sparse,
)

pytestmark = pytest.mark.timeout(300)
HIDDEN = 6

ARCHS = {
    # tunedGNN's form, six GCN layers deep: input Linear, conv(x) + Linear(x), LayerNorm
    "deep-linear-ln": (6, GCNArch(input_proj=True, head=True, residual="linear",
                                  norm="layer"), "auto", 4),
    # identity residuals (projections on the first and the class layer), BatchNorm
    "identity-bn": (3, GCNArch(residual="identity", norm="batch"), "aggregate_first", None),
    # pre-norm (DeeperGCN's res+) with a classifier: the raw stream gathered beside
    "pre-ln-gemm": (3, GCNArch(head=True, residual="identity", norm="layer", pre_norm=True),
                    "gemm_first", 4),
    "pre-bn-linear": (3, GCNArch(residual="linear", norm="batch", pre_norm=True),
                      "aggregate_first", 4),
    # jumping knowledge over 5 layers: each output hopped 1, 2, 3 (orders differ) or 0 times
    # into the classifier's layout; 'cat' with pre-norm: a LayerNorm over the concatenation
    "jk-cat-pre-ln": (5, GCNArch(head=True, norm="layer", pre_norm=True, jk="cat"), "auto", 4),
    "jk-max-bn": (4, GCNArch(input_proj=True, head=True, residual="identity", norm="batch",
                             jk="max"), "auto", None),
    # 'cat' after post-norm layers: the last layer's own norm is one layer wide
    "jk-cat-post-bn": (2, GCNArch(input_proj=True, head=True, residual="linear",
                                  norm="batch", jk="cat"), "auto", None),
}


def build(pg, dist_ctx, grid_groups, grid, layers, arch, order, block_rows, dropout=0.0,
          seed=7, sparse=False):
    """(reference GCN, its inputs, distributed model, layouts, comms, data, ledger, ops)."""
    ahat, x, labels, train, _ = _reference(pg)
    torch.manual_seed(seed)
    ref = GCN(F, HIDDEN, C, num_layers=layers, dropout=dropout, seed=seed, arch=arch).to(DT)
    ops = gcn_ops(F, HIDDEN, C, layers, arch)
    lays = chain_layouts(grid, dist_ctx.rank, N, op_widths(ops), order, sparse, ops)
    ledger = CommLedger()
    comms = plexus_comms(grid_groups(grid), ledger, lays[-1])
    data = read_plexus_inputs(pg, lays, DT)
    model = Plexus3DGCN(lays, comms, data.adj, block_rows=block_rows, dtype=DT,
                        dropout=dropout, seed=seed, node_ids=data.node_ids, ops=ops,
                        arch=arch, out_ids=data.out_ids)
    model.load_reference(ref.state_dict())
    return ref, (ahat, x, labels, train), model, lays, comms, data, ledger, ops


def my_rows(pg, lay, t):
    """The reference rows [N, C] of this rank's output block (its order) and class columns."""
    perm = pg.read_perm(lay.out_order)
    r0, r1 = lay.rows
    c0, c1 = lay.out_cols
    return t[torch.from_numpy(perm[r0:r1])][:, min(c0, C):min(c1, C)]


def grads(model):
    return model.to_canonical({n: p.grad for n, p in model.named_parameters()})


def cases() -> list:
    """The deep model on every representative grid (two of them at 8 ranks), each other
    option on two of them (one from 6 ranks on), in turn, so every grid runs some: the
    suite's runtime stays small where the ranks oversubscribe the cores."""
    grids = grids_for_world(every=False)
    each = 2 if WORLD <= 4 else 1
    out = []
    for i, name in enumerate(ARCHS):
        use = ([grids[(i + j) % len(grids)] for j in range(min(each, len(grids)))]
               if name != "deep-linear-ln" else grids if WORLD <= 6 else grids[:2])
        out += [pytest.param(name, g, id=f"{name}-{g}") for g in use]
    return out


@pytest.mark.parametrize("name,grid", cases())
def test_step_equals_reference(prepared, dist_ctx, grid_groups, grid, name):  # noqa: F811
    layers, arch, order, block_rows = ARCHS[name]
    check_step(prepared, dist_ctx, grid_groups, grid, layers, arch, order, block_rows)


@pytest.mark.parametrize("grid", grids_for_world(every=False)[:1], ids=str)
@pytest.mark.parametrize("arch", [GCNArch(residual="linear", norm="layer"),
                                  GCNArch(input_proj=True, head=True, residual="identity")],
                         ids=["residual", "input-linear"])
def test_sparse_features_with_residual_and_norm(prepared_sparse, dist_ctx,  # noqa: F811
                                                grid_groups, grid, arch):
    """CSR-stored features into a first layer with a learned residual (both products are
    SpMMs of the input read already gathered, gemm_first), then LayerNorm; or into the input
    Linear (an SpMM, then the identity's block)."""
    check_step(prepared_sparse, dist_ctx, grid_groups, grid, 2, arch, "auto", 4, sparse=True)


def check_step(pg, dist_ctx, grid_groups, grid, layers, arch, order, block_rows,
               sparse=False):
    """One step against the reference: outputs, loss, gradients, running statistics, the
    evaluation forward, and the ledger against the formula."""
    ref, (ahat, x, labels, train), model, lays, comms, data, ledger, ops = build(
        pg, dist_ctx, grid_groups, grid, layers, arch, order, block_rows, sparse=sparse)
    out_ref = ref(x, ModelGraph(gcn=ahat))
    loss_ref = cross_entropy(out_ref[train], labels[train])
    loss_ref.backward()
    last = lays[-1]
    out = model(data.x)
    loss = parallel_cross_entropy(out, data.labels, data.masks["train"], last, comms)
    loss.backward()
    sent = ledger.by_name("sent")
    got = grads(model)
    state = model.to_canonical({k: v for k, v in model.state_dict().items()
                                if "running" in k or "tracked" in k})
    model.eval()
    ref.eval()
    with torch.no_grad():
        out_eval = model(data.x)
        eval_ref = ref(x, ModelGraph(gcn=ahat))
    # every collective has run
    r = last.rows[1] - last.rows[0]
    mine = my_rows(pg, last, out_ref.detach())
    torch.testing.assert_close(out[:r, : mine.shape[1]], mine, **TOL)
    torch.testing.assert_close(loss, loss_ref.detach(), **TOL)
    want = dict(ref.named_parameters())
    assert sorted(got) == sorted(want)
    for k, g in got.items():
        torch.testing.assert_close(g, want[k].grad, **TOL, msg=k)
    ref_state = ref.state_dict()
    for k, v in state.items():  # BatchNorm's running statistics after the step
        torch.testing.assert_close(v, ref_state[k], **TOL, msg=k)
    torch.testing.assert_close(out_eval[:r, : mine.shape[1]], my_rows(pg, last, eval_ref),
                               **TOL)
    assert sent == plexus_step_bytes(grid, dist_ctx.rank, N, op_widths(ops), 8, block_rows,
                                     order, ops=ops, norm=arch.norm, sparse_input=sparse)


CURVE_ARCH = "deep-linear-ln"


@pytest.mark.parametrize("grid", grids_for_world(every=False, curves=True), ids=str)
def test_training_with_dropout_and_batchnorm_follows_reference(prepared, dist_ctx,  # noqa: F811
                                                               grid_groups, grid):
    """Eight AdamW steps of a residual BatchNorm GCN with a classifier and dropout: the loss
    curve and the evaluation forward (running statistics) equal the reference's."""
    arch = GCNArch(input_proj=True, head=True, residual="identity", norm="batch")
    ref, (ahat, x, labels, train), model, lays, comms, data, _, _ = build(
        prepared, dist_ctx, grid_groups, grid, 3, arch, "auto", None, dropout=0.3, seed=11)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    curve = []
    graph = ModelGraph(gcn=ahat)
    for _ in range(8):
        opt_ref.zero_grad()
        loss_ref = cross_entropy(ref(x, graph)[train], labels[train])
        loss_ref.backward()
        opt_ref.step()
        opt.zero_grad()
        loss = parallel_cross_entropy(model(data.x), data.labels, data.masks["train"], lays[-1],
                                      comms)
        loss.backward()
        opt.step()
        curve.append((loss.item(), loss_ref.item()))
    model.eval()
    ref.eval()
    with torch.no_grad():
        out = model(data.x)
        out_ref = ref(x, graph)
    mine, theirs = zip(*curve)
    np.testing.assert_allclose(mine, theirs, rtol=1e-6)
    assert theirs[-1] < theirs[0]
    last = lays[-1]
    r = last.rows[1] - last.rows[0]
    want = my_rows(prepared, last, out_ref)
    torch.testing.assert_close(out[:r, : want.shape[1]], want, **TOL)


@pytest.mark.parametrize("grid", grids_for_world(every=False, curves=True), ids=str)
def test_adam_weights_only_decay_and_global_clipping_follow_reference(prepared,  # noqa: F811
                                                                     dist_ctx, grid_groups,
                                                                     grid):
    """Five Adam steps (L2 weight decay on the weight matrices only), the gradient clipped to
    a global norm below its own: the sharded weights count once, the biases' and norms' copies
    over c once; the norm before clipping and the loss curve equal the reference's under
    torch's clip_grad_norm_."""
    from plexgt.training.optim import clip_gradients, param_groups

    arch = GCNArch(input_proj=True, head=True, residual="linear", norm="layer")
    ref, (ahat, x, labels, train), model, lays, comms, data, _, _ = build(
        prepared, dist_ctx, grid_groups, grid, 2, arch, "auto", None)
    opt_ref = torch.optim.Adam(param_groups(ref, 0.05, "weights"), lr=0.05)
    opt = torch.optim.Adam(param_groups(model, 0.05, "weights"), lr=0.05)
    assert len(opt.param_groups[1]["params"]) == len(opt_ref.param_groups[1]["params"]) > 0
    curve, norms = [], []
    graph = ModelGraph(gcn=ahat)
    for _ in range(5):
        opt_ref.zero_grad()
        loss_ref = cross_entropy(ref(x, graph)[train], labels[train])
        loss_ref.backward()
        norm_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        opt_ref.step()
        opt.zero_grad()
        loss = parallel_cross_entropy(model(data.x), data.labels, data.masks["train"], lays[-1],
                                      comms)
        loss.backward()
        norm = clip_gradients(model, 0.05)
        opt.step()
        curve.append((loss.item(), loss_ref.item()))
        norms.append((norm.item(), norm_ref.item()))
    mine, theirs = zip(*curve)
    np.testing.assert_allclose(mine, theirs, rtol=1e-6)
    got, want = zip(*norms)
    np.testing.assert_allclose(got, want, rtol=1e-9)
    assert min(want) > 0.05  # every step clipped
