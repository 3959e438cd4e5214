"""Global super nodes on every strategy against the single-process model.

Operator: real rows' attention (neighbours + S super keys) through each strategy's shard, super
rows through the all-reduce merge, against :func:`~plexgt.ops.attention.sparse_attention` on
the pattern with super columns and :func:`~plexgt.ops.super_nodes.super_attention` on one
process: outputs and the gradients of q, k, v and the super q, k, v (float64, 1e-6), on a
graph with empty rows and isolated nodes and one so small that the last ranks own no row; the
ledger equals each strategy's comm function. Model: one gt and one gps step per strategy
(gp_2d at a proper head axis where the world has one) and a 20-step gt curve with dropout.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.models.gps import GPS
from plexgt.models.gt import GraphTransformer
from plexgt.ops.attention import sparse_attention
from plexgt.ops.csr import CSRGraph
from plexgt.ops.super_nodes import super_attention, super_columns
from plexgt.parallel.attention.gp_2d import factorisations, make_groups
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.strategy import AttentionProblem, make_shard
from plexgt.parallel.attention.super_nodes import super_comm, super_rows
from plexgt.parallel.gps_dist import DistGPS
from plexgt.parallel.gt_dist import DistGraphTransformer

from . import test_gt_dist as _gt
from . import test_ring_dist as _ring
from .conftest import RANK, WORLD

pytestmark = pytest.mark.timeout(600)
prepared = _gt.prepared
groups = _gt.groups
H, S = 4, 2
TOL = dict(rtol=1e-6, atol=1e-10)
PROPER = [a for a in factorisations(WORLD) if 1 < a < WORLD]
LAYOUTS = [(s, 1) for s in default_registry().names() if s != "gp_2d"] + \
    [("gp_2d", PROPER[0] if PROPER else WORLD)]
"""Every strategy; gp_2d at a head axis strictly inside the world where it has one."""


@pytest.fixture(scope="module")
def world_groups(dist_ctx):
    ledger = CommLedger()
    world = Comm.from_group(dist.group.WORLD, "rows", ledger)
    return {a: make_groups(world, a, ledger) for a in sorted({a for _, a in LAYOUTS})}


@pytest.mark.parametrize("graph", sorted(_ring.GRAPHS))
@pytest.mark.parametrize("strategy,a", LAYOUTS)
def test_super_attention_equals_single_process(world_groups, strategy, a, graph):
    n, dh = _ring.GRAPHS[graph]
    g = _ring._graph(n)
    gen = torch.Generator().manual_seed(11)
    q, k, v, w = (torch.randn(n, H, dh, generator=gen, dtype=torch.float64) for _ in range(4))
    qs, ks, vs, ws = (torch.randn(S, H, dh, generator=gen, dtype=torch.float64)
                      for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v, qs, ks, vs)]
    scale = 1.0 / math.sqrt(dh)
    aug = super_columns(g, S, n)
    y = sparse_attention(aug, q, torch.cat([k, ks]), torch.cat([v, vs]))
    ys = super_attention(qs, k, v, ks, vs, scale)
    ((y * w).sum() + (ys * ws).sum()).backward()
    want_grads = [t.grad.clone() for t in leaves]

    ledger = CommLedger()
    comm = Comm.from_group(dist.group.WORLD, "rows", ledger)
    sub = {}
    if strategy == "gp_2d":
        sub = {name: Comm(c.group, c.size, c.rank, name, ledger)
               for name, c in world_groups[a].items()}
    strat = default_registry().get(strategy)
    lo, hi = strat.rows_held(n, WORLD, RANK, a)
    held = CSRGraph.from_scipy(g.to_scipy()[lo:hi], keep_values=False)
    shard = make_shard(strat, comm, n, H, held, sub, a, 1, super_nodes=S)
    n_loc = shard.n_loc
    r0, r1 = RANK * n_loc, (RANK + 1) * n_loc

    def mine(t):
        out = torch.zeros(WORLD * n_loc, H, dh, dtype=t.dtype)
        out[:n] = t.detach()
        return out[r0:r1]

    ql, kl, vl = (mine(t).clone().requires_grad_() for t in (q, k, v))
    qsl, ksl, vsl = (t.detach().clone().requires_grad_() for t in (qs, ks, vs))
    yl = shard.attend(ql, kl, vl, None, (ksl, vsl))
    real = shard.real_rows
    ysl = super_rows(qsl, ksl, vsl, kl[:real], vl[:real], comm, scale)
    # the replicated super rows count once in the objective, like a parameter's loss term;
    # each rank then holds its part of the super q, k, v gradients
    ((yl * mine(w)).sum() + (ysl * ws).sum() * (RANK == 0)).backward()
    sup = torch.cat([t.grad.reshape(-1) for t in (qsl, ksl, vsl)])
    dist.all_reduce(sup)
    # every collective is done
    torch.testing.assert_close(yl.detach(), mine(y), **TOL)
    torch.testing.assert_close(ysl.detach(), ys.detach(), **TOL)
    for name, got, want in (("dq", ql.grad, want_grads[0]), ("dk", kl.grad, want_grads[1]),
                            ("dv", vl.grad, want_grads[2])):
        torch.testing.assert_close(got, mine(want), **TOL, msg=name)
    torch.testing.assert_close(sup, torch.cat([t.reshape(-1) for t in want_grads[3:]]), **TOL)
    prob = AttentionProblem(n, g.num_edges, H * dh, H, 8, head_parallel=a, super_nodes=S)
    want = {}
    for op in strat.comm(prob, RANK, WORLD) + super_comm(prob, WORLD):
        key = (op.group or "rows", op.op)
        want[key] = want.get(key, 0) + op.sent
    assert {k: v for k, v in ledger.sent.items() if v} == {k: v for k, v in want.items() if v}


@pytest.mark.parametrize("strategy,a", LAYOUTS)
@pytest.mark.parametrize("model", ["gt", "gps"])
def test_super_nodes_model_step_equals_reference(prepared, groups, model, strategy, a):
    ref_cls, dist_cls = ((GraphTransformer, DistGraphTransformer) if model == "gt"
                         else (GPS, DistGPS))
    _gt.check_one_step(prepared, groups, WORLD, strategy, ref_cls, dist_cls, model == "gps",
                       head_parallel=a, super_nodes=3)


def test_super_nodes_training_follows_reference(prepared, groups):
    _gt.check_training(prepared, groups, WORLD, "gp_ring", GraphTransformer,
                       DistGraphTransformer, False, super_nodes=2)
