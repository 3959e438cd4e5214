"""gt / gps model options on the row partition against the single-process models: BatchNorm
(column statistics over every rank's real rows, padding excluded; running statistics in
evaluation), pre-norm blocks with a final norm, jumping knowledge, and a 6-block residual +
LayerNorm gt on every strategy.

Same harness as test_gt_dist (groups of the world, data through the loader, float64, 1e-6):
outputs, loss, every gradient, BatchNorm's running statistics after the step, the evaluation
forward, and the ledger against AGP's priced step (:func:`plexgt.plan.agp.step_ops`: what
``plexgt train`` plans with), per group and operation.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from plexgt.distributed.grid import Grid3D
from plexgt.models.gps import GPS
from plexgt.models.gt import GraphTransformer
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.gps_dist import DistGPS
from plexgt.parallel.gt_dist import DistGraphTransformer
from plexgt.parallel.rows1d import all_reduce_gradients, row_cross_entropy
from plexgt.plan.agp import Workload, step_ops
from tests.parallel_helpers import build_axis_groups

from . import test_gt_dist as _gt
from .conftest import ALL_GRIDS, RANK, ROW_PARTITIONED, WORLD
from .test_gt_dist import F_IN, HEADS, HIDDEN, STRATEGIES, TOL, C, N, reference_inputs, setup_rank

prepared = _gt.prepared  # the fixtures, module-scoped here too
groups = _gt.groups
pytestmark = [pytest.mark.timeout(600), ROW_PARTITIONED]
DT = torch.float64

OPTIONS = {
    "bn": dict(norm="batch"),
    "pre-ln-jk-cat": dict(pre_norm=True, jk="cat"),
    "pre-bn-jk-max": dict(norm="batch", pre_norm=True, jk="max"),
    "none-jk-sum": dict(norm="none", jk="sum"),
}


def build(model_cls, dist_cls, layers, seed=3, dropout=0.0, **kw):
    torch.manual_seed(seed)
    args = dict(num_layers=layers, heads=HEADS, dropout=dropout, seed=seed, **kw)
    ref = model_cls(F_IN, HIDDEN, C, **args).to(DT)
    model = dist_cls(F_IN, HIDDEN, C, **args).to(DT)
    model.load_state_dict(ref.state_dict())
    return ref, model


def check(pg, groups, strategy, gps, layers, grid=None, axis_groups=None, **kw):
    """One step of the options ``kw`` against the reference, and the ledger against AGP."""
    graph_ref, x, labels, masks, pq = reference_inputs(pg, gps)
    ledger, comm, graph, data = setup_rank(pg, groups, WORLD, strategy, gps, grid, axis_groups)
    ref, model = build(GPS if gps else GraphTransformer, DistGPS if gps else
                       DistGraphTransformer, layers, **kw)
    out_ref = ref(x, graph_ref)
    loss_ref = F.cross_entropy(out_ref[masks["train"]], labels[masks["train"]])
    loss_ref.backward()
    out = model(data.x, graph)
    loss = row_cross_entropy(out, data.labels, data.masks["train"], comm)
    loss.backward()
    all_reduce_gradients(model, comm)
    got = {k: dict(getattr(ledger, k)) for k in ("sent", "recv")}
    model.eval()
    ref.eval()
    with torch.no_grad():
        out_eval, eval_ref = model(data.x, graph), ref(x, graph_ref)
    # all collectives are done
    lo, hi = data.rows
    torch.testing.assert_close(out[: hi - lo], out_ref[pq[lo:hi]].detach(), **TOL)
    torch.testing.assert_close(loss.detach(), loss_ref.detach(), **TOL)
    ref_grads = dict(ref.named_parameters())
    for name, prm in model.named_parameters():
        torch.testing.assert_close(prm.grad, ref_grads[name].grad, **TOL, msg=name)
    ref_state = ref.state_dict()
    for name, buf in model.state_dict().items():  # running statistics
        torch.testing.assert_close(buf, ref_state[name], **TOL, msg=name)
    torch.testing.assert_close(out_eval[: hi - lo], eval_ref[pq[lo:hi]], **TOL)
    w = Workload("gps" if gps else "gt", N, pg.E, F_IN, C, HIDDEN, HEADS, layers, 2, 8,
                 gcn_grid=grid, gcn_block_rows=4 if grid is not None else None, **kw)
    assert w.num_params == sum(t.numel() for t in model.parameters())
    ops = step_ops(default_registry().get(strategy), w, WORLD, comm.rank)
    for kind in ("sent", "recv"):
        want = defaultdict(int)
        for name, op in ops:
            want[name, op.op] += op.total_sent if kind == "sent" else op.total_recv
        assert {k: v for k, v in got[kind].items() if v} == \
            {k: v for k, v in want.items() if v}, kind


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_six_block_gt_equals_reference(prepared, groups, strategy):
    """The default residual + post-LayerNorm blocks, six deep, on every strategy."""
    check(prepared, groups, strategy, False, 6)


@pytest.mark.parametrize("name", OPTIONS)
@pytest.mark.parametrize("model", ["gt", "gps"])
def test_options_equal_reference(prepared, groups, model, name):
    strategy = STRATEGIES[(list(OPTIONS).index(name) + (model == "gps")) % len(STRATEGIES)]
    check(prepared, groups, strategy, model == "gps", 3, **OPTIONS[name])


def _grid() -> Grid3D:
    return Grid3D(*{1: (1, 1, 1), 3: (3, 1, 1), 4: (2, 2, 1), 6: (1, 2, 3)}.get(
        WORLD, (WORLD, 1, 1)))


@pytest.fixture(scope="module")
def axis_groups(groups):
    return build_axis_groups(_grid(), RANK)


def test_gps_3d_path_with_batchnorm_pre_norm(prepared, groups, axis_groups):
    """gps's GCN path on the 3D grid reads the pre-norm BatchNorm of its block input."""
    check(prepared, groups, "gp_ag", True, 2, _grid(), axis_groups, norm="batch",
          pre_norm=True)


@pytest.mark.skipif(WORLD > 4 and not ALL_GRIDS, reason="row-partitioned curves run up to 4 "
                    "ranks (as test_gt_dist's); the one-step tests run at every size")
def test_training_with_batchnorm_and_dropout_follows_reference(prepared, groups):
    """Eight AdamW steps of a pre-norm BatchNorm gt with dropout: the loss curve, and the
    evaluation forward on the running statistics, equal the reference's."""
    graph_ref, x, labels, masks, pq = reference_inputs(prepared)
    ledger, comm, graph, data = setup_rank(prepared, groups, WORLD, "gp_ag")
    ref, model = build(GraphTransformer, DistGraphTransformer, 2, seed=11, dropout=0.3,
                       norm="batch", pre_norm=True)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    curve = []
    for _ in range(8):
        opt_ref.zero_grad()
        loss_ref = F.cross_entropy(ref(x, graph_ref)[masks["train"]], labels[masks["train"]])
        loss_ref.backward()
        opt_ref.step()
        opt.zero_grad()
        loss = row_cross_entropy(model(data.x, graph), data.labels, data.masks["train"], comm)
        loss.backward()
        all_reduce_gradients(model, comm)
        opt.step()
        curve.append((loss.item(), loss_ref.item()))
    model.eval()
    ref.eval()
    with torch.no_grad():
        out, out_ref = model(data.x, graph), ref(x, graph_ref)
    mine, theirs = zip(*curve)
    np.testing.assert_allclose(mine, theirs, rtol=1e-6)
    assert theirs[-1] < theirs[0]
    lo, hi = data.rows
    torch.testing.assert_close(out[: hi - lo], out_ref[pq[lo:hi]], **TOL)


def test_adam_weights_only_decay_and_global_clipping_follow_reference(prepared, groups):
    """Five Adam steps of a BatchNorm gt, L2 decay on the weight matrices only, the gradient
    clipped to a global norm below its own: the replicated parameters count once (rank 0's),
    so the norm and the loss curve are the reference's under torch's clip_grad_norm_."""
    from plexgt.parallel.rows1d import RowParallel
    from plexgt.training.optim import clip_gradients, param_groups

    graph_ref, x, labels, masks, _ = reference_inputs(prepared)
    ledger, comm, graph, data = setup_rank(prepared, groups, WORLD, "gp_ag")
    ref, model = build(GraphTransformer, DistGraphTransformer, 2, seed=5, norm="batch")
    wrapped = RowParallel(model, graph, comm)
    opt_ref = torch.optim.Adam(param_groups(ref, 0.05, "weights"), lr=0.05)
    opt = torch.optim.Adam(param_groups(wrapped, 0.05, "weights"), lr=0.05)
    curve, norms = [], []
    for _ in range(5):
        opt_ref.zero_grad()
        loss_ref = F.cross_entropy(ref(x, graph_ref)[masks["train"]], labels[masks["train"]])
        loss_ref.backward()
        norms_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        opt_ref.step()
        opt.zero_grad()
        loss = row_cross_entropy(wrapped(data.x), data.labels, data.masks["train"], comm)
        loss.backward()
        norm = clip_gradients(wrapped, 0.05)
        opt.step()
        curve.append((loss.item(), loss_ref.item()))
        norms.append((norm.item(), norms_ref.item()))
    mine, theirs = zip(*curve)
    np.testing.assert_allclose(mine, theirs, rtol=1e-6)
    got, want = zip(*norms)
    np.testing.assert_allclose(got, want, rtol=1e-9)
    assert min(want) > 0.05
