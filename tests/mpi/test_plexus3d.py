"""3D tensor-parallel GCN against the single-process GCN, for every grid of the world size.

Blocks come through the data-prep loader from a prepared directory (double-permuted); the
reference runs on the original graph, rebuilt from the same directory, so the comparison covers
the permutations too. float64 throughout, tolerance 1e-6 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plexgt.data.synthetic import sbm
from plexgt.distributed.collectives import CommLedger
from plexgt.distributed.layout3d import layer_layouts
from plexgt.models.gcn import GCN
from plexgt.models.layers import ModelGraph
from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import gcn_norm
from plexgt.parallel.plexus3d import Plexus3DGCN, plexus_comms
from plexgt.parallel.plexus_loss import (
    parallel_binary_cross_entropy,
    parallel_correct,
    parallel_cross_entropy,
    parallel_scores,
)
from plexgt.plan.plexus_cost import plexus_step_bytes
from plexgt.tasks.gcn import read_plexus_inputs
from plexgt.tasks.metrics import roc_auc, task_roc_auc

from .conftest import grids_for_world, prepare_on_rank0

pytestmark = pytest.mark.timeout(300)
N, F, C = 53, 7, 5
HIDDEN = 6
DT = torch.float64
TOL = dict(rtol=1e-6, atol=1e-9)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare_on_rank0(tmp_path_factory, "plexus", lambda: sbm(
        num_nodes=N, num_edges=360, num_classes=C, num_features=F, seed=3), tiles=3, seed=5)


def _reference(pg):
    """Original-order Â, X, labels, train mask, and perms (position -> original id)."""
    a1 = pg.read_adjacency("A1").tocoo()
    pp, pq = pg.read_perm("P"), pg.read_perm("Q")
    g = CSRGraph.from_coo(pp[a1.row], pq[a1.col], N, N)
    ahat = gcn_norm(g, self_loops=True, dtype=DT)
    x = torch.zeros(N, F, dtype=DT)
    x[pq] = torch.from_numpy(pg.read_features().astype(np.float64))
    labels = np.empty(N, dtype=np.int64)
    labels[pp] = pg.read_labels(None, "P")
    train = np.empty(N, dtype=bool)
    train[pp] = pg.read_mask("train", None, "P")
    return ahat, x, torch.from_numpy(labels), torch.from_numpy(train), pp


def _reference_model(seed: int, dropout: float = 0.0) -> GCN:
    """The single-process GCN (the oracle), three layers."""
    torch.manual_seed(seed)
    return GCN(F, HIDDEN, C, num_layers=3, dropout=dropout, seed=seed).to(DT)


def _reference_forward(model: GCN, ahat, x):
    return model(x, ModelGraph(gcn=ahat))


def _distributed(pg, dist_ctx, grid_groups, grid, block_rows=None, order="aggregate_first",
                 dropout=0.0, seed=0):
    dims = [F, HIDDEN, HIDDEN, C]
    lays = layer_layouts(grid, dist_ctx.rank, N, dims, order)
    ledger = CommLedger()
    comms = plexus_comms(grid_groups(grid), ledger, lays[-1])
    data = read_plexus_inputs(pg, lays, DT)
    model = Plexus3DGCN(lays, comms, data.adj, block_rows=block_rows, dtype=DT, dropout=dropout,
                        seed=seed, node_ids=data.node_ids)
    return lays, ledger, comms, data, model


def _assert_weight_grads(lays, model, ref):
    """Every weight shard's gradient is its block of the reference layer's."""
    for lay, w, lin in zip(lays, model.weights, ref.layers):
        wt = torch.zeros(lay.d_in, lay.d_out, dtype=DT)
        wt[: lay.d_in_true, : lay.d_out_true] = lin.weight.grad.t()
        wt = wt[:, lay.w_column_order]
        torch.testing.assert_close(w.grad, wt[slice(*lay.in_cols), slice(*lay.w_cols)], **TOL)


def _my_slice(t, lay, pp):
    """Reference rows of this rank's output block (output order) and its class columns."""
    r0, r1 = lay.rows
    c0, c1 = lay.out_cols
    return t[torch.from_numpy(pp[r0:r1])][:, min(c0, C):min(c1, C)]


@pytest.mark.parametrize("grid", grids_for_world(every=False), ids=str)
@pytest.mark.parametrize("block_rows", [None, 4])
@pytest.mark.parametrize("order", ["aggregate_first", "gemm_first"])
def test_forward_loss_and_gradients_equal_reference(prepared, dist_ctx, grid_groups, grid,
                                                    block_rows, order):
    pg = prepared
    ahat, x, labels, train, pp = _reference(pg)
    ref = _reference_model(7)
    out_ref = _reference_forward(ref, ahat, x)
    loss_ref = torch.nn.functional.cross_entropy(out_ref[train], labels[train])
    loss_ref.backward()

    lays, ledger, comms, data, model = _distributed(pg, dist_ctx, grid_groups, grid, block_rows,
                                                    order)
    model.load_full([(lin.weight, lin.bias) for lin in ref.layers])
    out = model(data.x)
    last = lays[-1]
    loss = parallel_cross_entropy(out, data.labels, data.masks["train"], last, comms)
    loss.backward()
    # every collective has run: a failing assertion below cannot leave other ranks waiting
    assert data.order == "P"  # three layers: A1, A2, A1
    r = last.rows[1] - last.rows[0]
    mine = _my_slice(out_ref, last, pp)
    torch.testing.assert_close(out[:r, : mine.shape[1]], mine.detach(), **TOL)
    torch.testing.assert_close(loss, loss_ref.detach(), **TOL)
    for lay, w, b, lin in zip(lays, model.weights, model.biases, ref.layers):
        wt = torch.zeros(lay.d_in, lay.d_out, dtype=DT)
        wt[: lay.d_in_true, : lay.d_out_true] = lin.weight.grad.t()
        wt = wt[:, lay.w_column_order]
        torch.testing.assert_close(w.grad, wt[slice(*lay.in_cols), slice(*lay.w_cols)], **TOL)
        bp = torch.zeros(lay.d_out, dtype=DT)
        bp[: lay.d_out_true] = lin.bias.grad
        torch.testing.assert_close(b.grad, bp[slice(*lay.out_cols)], **TOL)
    # the ledger equals the planner's formula, per axis, to the byte
    expect = plexus_step_bytes(grid, dist_ctx.rank, N, [F, HIDDEN, HIDDEN, C], 8, block_rows,
                               order)
    assert ledger.by_name("sent") == expect
    assert ledger.by_name("recv") == expect


@pytest.mark.parametrize("grid", grids_for_world(every=False), ids=str)
@pytest.mark.parametrize("order", ["aggregate_first", "gemm_first"])
def test_canonical_state_is_the_reference_models_and_round_trips(prepared, dist_ctx,
                                                                 grid_groups, grid, order):
    """What a checkpoint holds: the blocks reassembled into the single-process GCN's tensors
    on every rank (any grid resumes them), and sliced back into exactly this rank's blocks."""
    ref = _reference_model(7)
    lays, ledger, comms, data, model = _distributed(prepared, dist_ctx, grid_groups, grid,
                                                    order=order)
    model.load_full([(lin.weight, lin.bias) for lin in ref.layers])
    params = {n: p.detach() for n, p in model.named_parameters()}
    full = model.to_canonical(params)
    want = {k: v.detach() for k, v in ref.state_dict().items()}
    assert sorted(full) == sorted(want)
    for k in want:
        assert torch.equal(full[k], want[k]), k
    # full tensors -> this rank's blocks -> full again, for other values (AdamW's moments)
    g = torch.Generator().manual_seed(3)
    other = {k: torch.randn(v.shape, generator=g, dtype=DT) for k, v in want.items()}
    back = model.to_canonical(model.from_canonical(other))
    assert all(torch.equal(back[k], other[k]) for k in other)


@pytest.mark.parametrize("grid", grids_for_world(every=False, curves=True), ids=str)
def test_twenty_adamw_steps_follow_reference_curve(prepared, dist_ctx, grid_groups, grid):
    """Layer orders 'auto': gemm_first on the narrowing layers 0 and 2, aggregate_first on 1.
    Dropout 0.3 on every layer's input: the counter-based masks drop the reference's entries
    on every grid, so the curves agree with dropout on."""
    pg = prepared
    ahat, x, labels, train, pp = _reference(pg)
    ref = _reference_model(11, dropout=0.3)
    lays, ledger, comms, data, model = _distributed(pg, dist_ctx, grid_groups, grid, 5, "auto",
                                                    dropout=0.3, seed=11)
    assert [lay.order for lay in lays] == ["gemm_first", "aggregate_first", "gemm_first"]
    model.load_full([(lin.weight, lin.bias) for lin in ref.layers])
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    losses = []
    for _ in range(20):
        opt_ref.zero_grad()
        loss_ref = torch.nn.functional.cross_entropy(
            _reference_forward(ref, ahat, x)[train], labels[train])
        loss_ref.backward()
        opt_ref.step()
        opt.zero_grad()
        loss = parallel_cross_entropy(model(data.x), data.labels, data.masks["train"], lays[-1],
                                      comms)
        loss.backward()
        opt.step()
        losses.append((loss.item(), loss_ref.item()))
    # accuracy computed in parallel equals the reference's
    model.eval()
    out = model(data.x)
    got = parallel_correct(out, data.labels, data.masks, lays[-1], comms)
    got_curve, ref_curve = zip(*losses)
    np.testing.assert_allclose(got_curve, ref_curve, rtol=1e-6)
    assert ref_curve[-1] < ref_curve[0]
    ref.eval()
    with torch.no_grad():
        pred = _reference_forward(ref, ahat, x).argmax(1)
    for split in ("train", "valid", "test"):
        m = np.empty(N, dtype=bool)
        m[pp] = pg.read_mask(split, None, "P")
        m = torch.from_numpy(m)
        assert got[split] == (int((pred[m] == labels[m]).sum()), int(m.sum()))
    # and an exact ROC-AUC: class 1 against the rest, logit_1 - logit_0 gathered in parallel
    with torch.no_grad():
        logit = _reference_forward(ref, ahat, x)
    scores = parallel_scores(out, (data.labels == 1).long(), data.masks, lays[-1], comms)
    for split in ("train", "valid", "test"):
        m = np.empty(N, dtype=bool)
        m[pp] = pg.read_mask(split, None, "P")
        s, y = scores[split]
        want = roc_auc((logit[m, 1] - logit[m, 0]).numpy(), (labels[m] == 1).numpy())
        assert roc_auc(s.numpy(), y.numpy()) == pytest.approx(want, rel=1e-9)


def _task_labels(pp, rows_pad, lay):
    """Multi-label targets [N, C] (C tasks of 0/1, some -1) in original order, and this rank's
    padded rows of the last layer's output (P order)."""
    rng = np.random.default_rng(9)
    y = rng.integers(0, 2, (N, C))
    y[rng.random((N, C)) < 0.2] = -1
    mine = np.full((rows_pad, C), -1, dtype=np.int64)
    r0, r1 = lay.rows
    mine[: r1 - r0] = y[pp[r0:r1]]
    return torch.from_numpy(y), torch.from_numpy(mine)


@pytest.mark.parametrize("grid", grids_for_world(every=False), ids=str)
def test_multilabel_loss_gradients_and_roc_auc_equal_reference(prepared, dist_ctx,
                                                               grid_groups, grid):
    """Per-task binary cross-entropy over the task shards of the plane: loss and every
    weight's gradient equal torch's on the gathered logits; the mean ROC-AUC over tasks of the
    gathered scores equals the reference's."""
    pg = prepared
    ahat, x, _, train, pp = _reference(pg)
    ref = _reference_model(7)
    out_ref = _reference_forward(ref, ahat, x)
    lays, ledger, comms, data, model = _distributed(pg, dist_ctx, grid_groups, grid)
    last = lays[-1]
    y, mine = _task_labels(pp, last.rows_pad, last)
    known = (y >= 0) & train[:, None]
    loss_ref = torch.nn.functional.binary_cross_entropy_with_logits(
        out_ref[known], y[known].to(DT))
    loss_ref.backward()
    model.load_full([(lin.weight, lin.bias) for lin in ref.layers])
    out = model(data.x)
    loss = parallel_binary_cross_entropy(out, mine, data.masks["train"], last, comms)
    loss.backward()
    sent = dict(ledger.by_name("sent"))
    scores = parallel_scores(out.detach(), mine, data.masks, last, comms)
    torch.testing.assert_close(loss, loss_ref.detach(), **TOL)
    _assert_weight_grads(lays, model, ref)
    # the step's bytes (before the scores' gathers) are the formula's, binary loss included
    assert sent == plexus_step_bytes(grid, dist_ctx.rank, N, [F, HIDDEN, HIDDEN, C], 8,
                                     multilabel=True)
    for split in ("train", "valid", "test"):
        m = np.empty(N, dtype=bool)
        m[pp] = pg.read_mask(split, None, "P")
        s, lab = scores[split]
        assert s.shape == (int(m.sum()), C)
        want = task_roc_auc(out_ref.detach()[m].numpy(), y[m].numpy())
        assert task_roc_auc(s.numpy(), lab.numpy()) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("grid", grids_for_world(every=False), ids=str)
def test_node_embedding_block_and_its_gradient_equal_reference(prepared, dist_ctx,
                                                               grid_groups, grid):
    """A learnable [N, D] node embedding appended to the input: each rank's block starts as
    the reference table's rows and columns, and after one step the loss, every weight's and
    the block's gradient equal the single-process model's on [X, E]."""
    from plexgt.models.node_embedding import NodeEmbedding
    from plexgt.parallel.node_embedding import WithNodeEmbedding
    from plexgt.tasks.gcn import input_embedding

    d = 4
    pg = prepared
    ahat, x, labels, train, pp = _reference(pg)
    table = NodeEmbedding(torch.arange(N), 0, d, F, 11, 0, (N, d), DT)
    torch.manual_seed(7)
    ref = GCN(F + d, HIDDEN, C, num_layers=3, dropout=0.0).to(DT)
    out_ref = _reference_forward(ref, ahat, table(torch.cat([x, torch.zeros(N, d, dtype=DT)],
                                                            1)))
    loss_ref = torch.nn.functional.cross_entropy(out_ref[train], labels[train])
    loss_ref.backward()
    lays = layer_layouts(grid, dist_ctx.rank, N, [F + d, HIDDEN, HIDDEN, C], "aggregate_first")
    ledger = CommLedger()
    comms = plexus_comms(grid_groups(grid), ledger, lays[-1])
    data = read_plexus_inputs(pg, lays, DT)
    inner = Plexus3DGCN(lays, comms, data.adj, dtype=DT, node_ids=data.node_ids)
    inner.load_full([(lin.weight, lin.bias) for lin in ref.layers])
    emb = input_embedding(pg, lays[0], data.node_ids[0], d, 11, DT)
    model = WithNodeEmbedding(inner, emb)
    start = emb.weight.detach().clone()
    loss = parallel_cross_entropy(model(data.x), data.labels, data.masks["train"], lays[-1],
                                  comms)
    loss.backward()
    torch.testing.assert_close(loss, loss_ref.detach(), **TOL)
    ids = data.node_ids[0][: emb.weight.shape[0]]
    cols = slice(emb.col0, emb.col0 + emb.weight.shape[1])
    torch.testing.assert_close(start, table.weight.detach()[ids][:, cols], rtol=0, atol=0)
    torch.testing.assert_close(emb.weight.grad, table.weight.grad[ids][:, cols], **TOL)
    # layer 0's input gradient now crosses ranks too, as the formula prices it
    assert ledger.by_name("sent") == plexus_step_bytes(
        grid, dist_ctx.rank, N, [F + d, HIDDEN, HIDDEN, C], 8, input_grad=True)
    _assert_weight_grads(lays, inner, ref)


@pytest.fixture(scope="module")
def prepared_sparse(tmp_path_factory):
    from tests.datagen import sparsified

    return prepare_on_rank0(tmp_path_factory, "plexus_csr", lambda: sparsified(sbm(
        num_nodes=N, num_edges=360, num_classes=C, num_features=F, seed=3)), tiles=3, seed=5,
        sparse_features="yes", feature_block_bytes=160)


@pytest.mark.parametrize("grid", grids_for_world(every=False), ids=str)
def test_sparse_features_step_equals_the_dense_reference(prepared_sparse, dist_ctx,
                                                         grid_groups, grid):
    """CSR-stored features, read already gathered over layer 0's c and multiplied as an
    SpMM (layer 0 gemm_first), with input dropout on their stored entries: the loss and every
    weight's gradient equal the single-process model's on the dense matrix, and the ledger is
    the formula's without layer 0's input all-gather."""
    pg = prepared_sparse
    assert pg.sparse_features
    ahat, x, labels, train, pp = _reference(pg)
    ref = _reference_model(7, dropout=0.5)
    out_ref = _reference_forward(ref, ahat, x)
    loss_ref = torch.nn.functional.cross_entropy(out_ref[train], labels[train])
    loss_ref.backward()
    dims = [F, HIDDEN, HIDDEN, C]
    lays = layer_layouts(grid, dist_ctx.rank, N, dims, "aggregate_first",
                         first_order="gemm_first")
    ledger = CommLedger()
    comms = plexus_comms(grid_groups(grid), ledger, lays[-1])
    data = read_plexus_inputs(pg, lays, DT)
    model = Plexus3DGCN(lays, comms, data.adj, dtype=DT, dropout=0.5, seed=7,
                        node_ids=data.node_ids)
    model.load_full([(lin.weight, lin.bias) for lin in ref.layers])
    loss = parallel_cross_entropy(model(data.x), data.labels, data.masks["train"], lays[-1],
                                  comms)
    loss.backward()
    assert isinstance(data.x, CSRGraph) and lays[0].order == "gemm_first"
    torch.testing.assert_close(loss, loss_ref.detach(), **TOL)
    _assert_weight_grads(lays, model, ref)
    assert ledger.by_name("sent") == plexus_step_bytes(grid, dist_ctx.rank, N, dims, 8,
                                                       sparse_input=True)
