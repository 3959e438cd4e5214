"""sage and mlp on the 3D grid against their single-process models, for every grid of the world
size (the non-powers of two of 3 and 6 ranks included).

Their layers sum graph operators, each rank's blocks of them derived at load from the prepared
pattern and degrees: the mean M = D^-1 A (sage) and the identity (sage's self term, mlp's
only operator). Blocks come through the loader from a double-permuted prepared directory; the
reference runs on the original graph rebuilt from it, so the comparison covers the
permutations and the identity's node ids. float64 throughout, tolerance 1e-6 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plexgt.data.synthetic import sbm
from plexgt.distributed.collectives import CommLedger
from plexgt.distributed.layout3d import layer_layouts
from plexgt.models.layers import ModelGraph
from plexgt.models.mlp import MLP
from plexgt.models.sage import SAGE
from plexgt.models.spec import parameter_lists
from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import mean_norm
from plexgt.parallel.plexus3d import Plexus3DGCN, plexus_comms
from plexgt.parallel.plexus_loss import parallel_correct, parallel_cross_entropy
from plexgt.plan.plexus_cost import plexus_step_bytes
from plexgt.tasks.gcn import read_plexus_inputs

from .conftest import grids_for_world, prepare_on_rank0

pytestmark = pytest.mark.timeout(300)
N, F, C = 53, 7, 5
HIDDEN = 6
DIMS = [F, HIDDEN, HIDDEN, C]
DT = torch.float64
TOL = dict(rtol=1e-6, atol=1e-9)
MODELS = {"sage": SAGE, "mlp": MLP}


def _graph(seed=3):
    return sbm(num_nodes=N, num_edges=360, num_classes=C, num_features=F, seed=seed)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare_on_rank0(tmp_path_factory, "operators", _graph, tiles=3, seed=5)


@pytest.fixture(scope="module")
def prepared_no_loops(tmp_path_factory):
    return prepare_on_rank0(tmp_path_factory, "operators_noloops", _graph, tiles=3, seed=5,
                            self_loops=False)


@pytest.fixture(scope="module")
def prepared_sparse(tmp_path_factory):
    from tests.datagen import sparsified

    return prepare_on_rank0(tmp_path_factory, "operators_csr", lambda: sparsified(_graph()),
                            tiles=3, seed=5, sparse_features="yes", feature_block_bytes=160)


def _reference(pg, self_loops=True):
    """Original-order graph (M of the stored pattern), X, labels, train mask, perm P."""
    a1 = pg.read_adjacency("A1").tocoo()
    pp, pq = pg.read_perm("P"), pg.read_perm("Q")
    g = CSRGraph.from_coo(pp[a1.row], pq[a1.col], N, N)
    graph = ModelGraph(mean=mean_norm(g, self_loops=self_loops, dtype=DT))
    x = torch.zeros(N, F, dtype=DT)
    x[pq] = torch.from_numpy(pg.read_features().astype(np.float64))
    labels = np.empty(N, dtype=np.int64)
    labels[pp] = pg.read_labels(None, "P")
    train = np.empty(N, dtype=bool)
    train[pp] = pg.read_mask("train", None, "P")
    return graph, x, torch.from_numpy(labels), torch.from_numpy(train), pp


def _reference_model(name, seed=7, dropout=0.0):
    torch.manual_seed(seed)
    return MODELS[name](F, HIDDEN, C, num_layers=3, dropout=dropout, seed=seed).to(DT)


def _distributed(pg, dist_ctx, grid_groups, grid, name, block_rows=None, order="aggregate_first",
                 dropout=0.0, seed=0, first_order=None):
    ops = MODELS[name].operators
    lays = layer_layouts(grid, dist_ctx.rank, N, DIMS, order, first_order=first_order)
    ledger = CommLedger()
    comms = plexus_comms(grid_groups(grid), ledger, lays[-1])
    data = read_plexus_inputs(pg, lays, DT, ops)
    model = Plexus3DGCN(lays, comms, data.adj, block_rows=block_rows, dtype=DT,
                        dropout=dropout, seed=seed, node_ids=data.node_ids,
                        names=parameter_lists(ops))
    return lays, ledger, comms, data, model


def _block_of(lay, full_weight):
    """This rank's shard of a reference weight [d_out, d_in] (gradient or value)."""
    wt = torch.zeros(lay.d_in, lay.d_out, dtype=DT)
    wt[: lay.d_in_true, : lay.d_out_true] = full_weight.t()
    wt = wt[:, lay.w_column_order]
    return wt[slice(*lay.in_cols), slice(*lay.w_cols)]


def _assert_grads(lays, model, ref):
    """Every weight shard's gradient, of every operator, and every bias shard's, are their
    blocks of the reference's."""
    for l, lay in enumerate(lays):
        for (_, w), lin in zip(model._operator_weights(l), ref.operator_layers(l)):
            torch.testing.assert_close(w.grad, _block_of(lay, lin.weight.grad), **TOL)
        bp = torch.zeros(lay.d_out, dtype=DT)
        bp[: lay.d_out_true] = ref.layers[l].bias.grad
        torch.testing.assert_close(model.biases[l].grad, bp[slice(*lay.out_cols)], **TOL)


def _step_and_compare(pg, dist_ctx, grid_groups, grid, name, block_rows=None,
                      order="aggregate_first", self_loops=True):
    graph, x, labels, train, pp = _reference(pg, self_loops)
    ref = _reference_model(name)
    out_ref = ref(x, graph)
    loss_ref = torch.nn.functional.cross_entropy(out_ref[train], labels[train])
    loss_ref.backward()
    lays, ledger, comms, data, model = _distributed(pg, dist_ctx, grid_groups, grid, name,
                                                    block_rows, order)
    model.load_reference(ref.state_dict())
    out = model(data.x)
    last = lays[-1]
    loss = parallel_cross_entropy(out, data.labels, data.masks["train"], last, comms)
    loss.backward()
    # every collective has run: a failing assertion below cannot leave other ranks waiting
    r0, r1 = last.rows
    c0, c1 = last.out_cols
    mine = out_ref[torch.from_numpy(pp[r0:r1])][:, min(c0, C):min(c1, C)]
    torch.testing.assert_close(out[: r1 - r0, : mine.shape[1]], mine.detach(), **TOL)
    torch.testing.assert_close(loss, loss_ref.detach(), **TOL)
    _assert_grads(lays, model, ref)
    return ledger


@pytest.mark.parametrize("grid", grids_for_world(every=False), ids=str)
@pytest.mark.parametrize("block_rows", [None, 4])
@pytest.mark.parametrize("order", ["aggregate_first", "gemm_first"])
@pytest.mark.parametrize("name", ["sage", "mlp"])
def test_forward_loss_and_gradients_equal_reference(prepared, dist_ctx, grid_groups, grid,
                                                    block_rows, order, name):
    ledger = _step_and_compare(prepared, dist_ctx, grid_groups, grid, name, block_rows, order)
    if name == "mlp":
        # the identity moves rows between the layers' splits as gcn's aggregation does: the
        # same collectives, to the byte, as the planner prices gcn's step
        assert ledger.by_name("sent") == plexus_step_bytes(grid, dist_ctx.rank, N, DIMS, 8,
                                                           block_rows, order)


@pytest.mark.parametrize("grid", grids_for_world(every=False), ids=str)
def test_sage_averages_the_stored_pattern_without_self_loops(prepared_no_loops, dist_ctx,
                                                             grid_groups, grid):
    """Prepared with --no-self-loops, M averages the other neighbours only (the self term is
    W_s's alone), and the blocks follow: the reference's M is built without loops."""
    _step_and_compare(prepared_no_loops, dist_ctx, grid_groups, grid, "sage", order="auto",
                      self_loops=False)


@pytest.mark.parametrize("grid", grids_for_world(every=False), ids=str)
@pytest.mark.parametrize("order", ["aggregate_first", "gemm_first"])
def test_canonical_state_is_the_reference_models_and_round_trips(prepared, dist_ctx,
                                                                 grid_groups, grid, order):
    """A checkpoint holds the single-process SAGE's tensors (layers.* and self_layers.*),
    identical on every rank, and they slice back into exactly this rank's blocks."""
    ref = _reference_model("sage")
    lays, ledger, comms, data, model = _distributed(prepared, dist_ctx, grid_groups, grid,
                                                    "sage", order=order)
    model.load_reference(ref.state_dict())
    full = model.to_canonical({n: p.detach() for n, p in model.named_parameters()})
    want = {k: v.detach() for k, v in ref.state_dict().items()}
    assert sorted(full) == sorted(want) and any(k.startswith("self_layers.") for k in want)
    for k in want:
        assert torch.equal(full[k], want[k]), k
    g = torch.Generator().manual_seed(3)
    other = {k: torch.randn(v.shape, generator=g, dtype=DT) for k, v in want.items()}
    back = model.to_canonical(model.from_canonical(other))
    assert all(torch.equal(back[k], other[k]) for k in other)


@pytest.mark.parametrize("grid", grids_for_world(every=False), ids=str)
@pytest.mark.parametrize("name", ["sage", "mlp"])
def test_sparse_features_step_equals_the_dense_reference(prepared_sparse, dist_ctx,
                                                         grid_groups, grid, name):
    """CSR-stored features (layer 0 gemm_first, its products H·W_k SpMMs) with input
    dropout on their stored entries: loss and every gradient equal the dense reference's."""
    pg = prepared_sparse
    graph, x, labels, train, pp = _reference(pg)
    ref = _reference_model(name, dropout=0.5)
    loss_ref = torch.nn.functional.cross_entropy(ref(x, graph)[train], labels[train])
    loss_ref.backward()
    lays, ledger, comms, data, model = _distributed(pg, dist_ctx, grid_groups, grid, name,
                                                    dropout=0.5, seed=7,
                                                    first_order="gemm_first")
    model.load_reference(ref.state_dict())
    loss = parallel_cross_entropy(model(data.x), data.labels, data.masks["train"], lays[-1],
                                  comms)
    loss.backward()
    assert isinstance(data.x, CSRGraph) and lays[0].order == "gemm_first"
    torch.testing.assert_close(loss, loss_ref.detach(), **TOL)
    _assert_grads(lays, model, ref)


@pytest.mark.parametrize("grid", grids_for_world(every=False, curves=True), ids=str)
def test_twenty_adamw_steps_follow_reference_curve(prepared, dist_ctx, grid_groups, grid):
    """sage, layer orders 'auto' (gemm_first on the narrowing layers 0 and 2), block rows 5,
    dropout 0.3: the loss curve and the accuracy counted in parallel are the reference's."""
    graph, x, labels, train, pp = _reference(prepared)
    ref = _reference_model("sage", seed=11, dropout=0.3)
    lays, ledger, comms, data, model = _distributed(prepared, dist_ctx, grid_groups, grid,
                                                    "sage", 5, "auto", dropout=0.3, seed=11)
    assert [lay.order for lay in lays] == ["gemm_first", "aggregate_first", "gemm_first"]
    model.load_reference(ref.state_dict())
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    losses = []
    for _ in range(20):
        opt_ref.zero_grad()
        loss_ref = torch.nn.functional.cross_entropy(ref(x, graph)[train], labels[train])
        loss_ref.backward()
        opt_ref.step()
        opt.zero_grad()
        loss = parallel_cross_entropy(model(data.x), data.labels, data.masks["train"], lays[-1],
                                      comms)
        loss.backward()
        opt.step()
        losses.append((loss.item(), loss_ref.item()))
    model.eval()
    got = parallel_correct(model(data.x), data.labels, data.masks, lays[-1], comms)
    got_curve, ref_curve = zip(*losses)
    np.testing.assert_allclose(got_curve, ref_curve, rtol=1e-6)
    assert ref_curve[-1] < ref_curve[0]
    ref.eval()
    with torch.no_grad():
        pred = ref(x, graph).argmax(1)
    for split in ("train", "valid", "test"):
        m = np.empty(N, dtype=bool)
        m[pp] = prepared.read_mask(split, None, "P")
        m = torch.from_numpy(m)
        assert got[split] == (int((pred[m] == labels[m]).sum()), int(m.sum()))
