"""Ring attention (GP-Ring, GP-2D) against single-process attention: operator and model.

The operator tests attend q, k, v of the whole world's rows with each rank's shard and compare
the output and the gradients of q, k and v with :func:`plexgt.ops.attention.sparse_attention`
on one process (float64, 1e-6 relative), for every head axis a of the world (gp_2d a x b),
K/V sent whole and in pieces, on graphs with empty rows, isolated nodes and ranks that own no
rows; the ledger equals the strategy's comm function on every rank. The model tests run gt
and gps with gp_2d at every head axis 1 < a < p (a = 1 and a = p are in test_gt_dist /
test_gps_dist through the registry), and a 20-step curve.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.models.gps import GPS
from plexgt.models.gt import GraphTransformer
from plexgt.ops import attention_triton
from plexgt.ops.attention import sparse_attention
from plexgt.ops.csr import CSRGraph
from plexgt.parallel.attention.gp_2d import factorisations, make_groups
from plexgt.parallel.attention.heads import my_heads
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.strategy import AttentionProblem, make_shard
from plexgt.parallel.gps_dist import DistGPS
from plexgt.parallel.gt_dist import DistGraphTransformer

from . import test_gt_dist as _gt
from .conftest import ALL_GRIDS, RANK, ROW_PARTITIONED, WORLD

pytestmark = [pytest.mark.timeout(600), ROW_PARTITIONED]
prepared = _gt.prepared
groups = _gt.groups
H = 4
TOL = dict(rtol=1e-6, atol=1e-10)
LAYOUTS = [("gp_ring", 1)] + [("gp_2d", a) for a in factorisations(WORLD) if a > 1 or WORLD == 1]
"""gp_2d at every head axis but a = 1 (the ring over all ranks, GP-Ring's own layout, which
test_gt_dist also runs as gp_2d); on one rank its only axis."""
GRAPHS = {"random": (23, 8), "tiny": (WORLD // 2 + 1, 3)}
"""(N, head width) per graph: a random one with empty rows and isolated nodes (width 8: the
compiled CPU kernels' blocks), and one so small that the last ranks own no row (n = 1 a
rank; width 3: torch's kernels, the GPU path)."""


def _graph(n: int) -> CSRGraph:
    g = torch.Generator().manual_seed(n)
    dense = torch.rand(n, n, generator=g) < 0.25
    dense[n // 2] = False  # a row without neighbours
    dense[:, n // 3] = False  # a node no row attends to
    if n > 4:
        dense[n - 2] = False
        dense[:, n - 2] = False  # an isolated node
    return CSRGraph.from_coo(*dense.nonzero().t(), n, n)


@pytest.fixture(scope="module")
def world_groups(dist_ctx):
    """a -> this rank's gp_2d groups for the world (made by every rank in the same order)."""
    ledger = CommLedger()
    world = Comm.from_group(dist.group.WORLD, "rows", ledger)
    return {a: make_groups(world, a, ledger) for a in factorisations(WORLD)}


@pytest.mark.parametrize("chunks", [1, 3] if WORLD <= 4 or ALL_GRIDS else [3])
@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("strategy,a", LAYOUTS)
def test_ring_attention_equals_single_process(world_groups, strategy, a, graph, chunks):
    n, DH = GRAPHS[graph]
    g = _graph(n)
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(n, H, DH, generator=gen, dtype=torch.float64).requires_grad_()
               for _ in range(3))
    w = torch.randn(n, H, DH, generator=gen, dtype=torch.float64)
    y = sparse_attention(g, q, k, v)
    (y * w).sum().backward()

    ledger = CommLedger()
    comm = Comm.from_group(dist.group.WORLD, "rows", ledger)
    sub = {}
    if strategy == "gp_2d":
        sub = {name: Comm(c.group, c.size, c.rank, name, ledger)
               for name, c in world_groups[a].items()}
    strat = default_registry().get(strategy)
    lo, hi = strat.rows_held(n, WORLD, RANK, a)
    held = CSRGraph.from_scipy(g.to_scipy()[lo:hi], keep_values=False)
    shard = make_shard(strat, comm, n, H, held, sub, a, chunks)
    n_loc = shard.n_loc
    r0, r1 = RANK * n_loc, (RANK + 1) * n_loc

    def mine(t):
        out = torch.zeros(WORLD * n_loc, H, DH, dtype=t.dtype)
        out[:n] = t.detach()
        return out[r0:r1]

    ql, kl, vl = (mine(t).clone().requires_grad_() for t in (q, k, v))
    yl = shard.attend(ql, kl, vl)
    (yl * mine(w)).sum().backward()
    # every collective is done
    torch.testing.assert_close(yl.detach(), mine(y), **TOL)
    for name, got, want in (("dq", ql.grad, q.grad), ("dk", kl.grad, k.grad),
                            ("dv", vl.grad, v.grad)):
        torch.testing.assert_close(got, mine(want), **TOL, msg=name)
    prob = AttentionProblem(n, g.num_edges, H * DH, H, 8, head_parallel=a, ring_chunks=chunks)
    want = {}
    for op in strat.comm(prob, RANK, WORLD):
        key = (op.group or "rows", op.op)
        want[key] = want.get(key, 0) + op.total_sent
    assert {k: v for k, v in ledger.sent.items() if v} == {k: v for k, v in want.items() if v}


def _trap(*args, **kwargs):
    raise AssertionError("torch.sparse.sampled_addmm reached on the declared GPU")


@pytest.mark.skipif(attention_triton.triton is None or not attention_triton.interpreted(),
                    reason="the fused kernel on the CPU needs Triton's interpreter")
@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("strategy,a", LAYOUTS)
def test_ring_on_the_fused_kernel_with_bias_equals_single_process(world_groups, strategy, a,
                                                                  chunks, monkeypatch):
    """The rings' GPU dispatch (the CPU declared a GPU type, the fused kernel under Triton's
    interpreter, torch's SDDMM trapped) with an edge bias: y and dq, dk, dv and the bias's
    gradient of every rank's edges equal one process's torch kernels (float64)."""
    n, dh = GRAPHS["random"]
    g = _graph(n)
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(n, H, dh, generator=gen, dtype=torch.float64).requires_grad_()
               for _ in range(3))
    bias = torch.randn(H, g.num_edges, generator=gen, dtype=torch.float64).requires_grad_()
    w = torch.randn(n, H, dh, generator=gen, dtype=torch.float64)
    y = sparse_attention(g, q, k, v, kernel="torch", bias=bias)
    (y * w).sum().backward()

    monkeypatch.setattr(attention_triton, "GPU_TYPES", ("cpu",))
    monkeypatch.setattr(torch.sparse, "sampled_addmm", _trap)
    ledger = CommLedger()
    comm = Comm.from_group(dist.group.WORLD, "rows", ledger)
    sub = {}
    if strategy == "gp_2d":
        sub = {name: Comm(c.group, c.size, c.rank, name, ledger)
               for name, c in world_groups[a].items()}
    strat = default_registry().get(strategy)
    lo, hi = strat.rows_held(n, WORLD, RANK, a)
    held = CSRGraph.from_scipy(g.to_scipy()[lo:hi], keep_values=False)
    shard = make_shard(strat, comm, n, H, held, sub, a, chunks)
    e0, e1 = int(g.indptr[lo]), int(g.indptr[hi])  # the held rows' edges, in order
    n_loc = shard.n_loc
    r0, r1 = RANK * n_loc, (RANK + 1) * n_loc

    def mine(t):
        out = torch.zeros(WORLD * n_loc, H, dh, dtype=t.dtype)
        out[:n] = t.detach()
        return out[r0:r1]

    ql, kl, vl = (mine(t).clone().requires_grad_() for t in (q, k, v))
    bl = bias.detach()[:, e0:e1].clone().requires_grad_()
    yl = shard.attend(ql, kl, vl, bias=bl)
    (yl * mine(w)).sum().backward()
    torch.testing.assert_close(yl.detach(), mine(y), **TOL)
    # gp_2d: a rank's bias gradient is its own heads' (the head group's ranks sum to it)
    h0, h1 = my_heads(H, sub["heads"]) if sub else (0, H)
    dbias = torch.zeros_like(bl)
    dbias[h0:h1] = bias.grad[h0:h1, e0:e1]
    for name, got, want in (("dq", ql.grad, mine(q.grad)), ("dk", kl.grad, mine(k.grad)),
                            ("dv", vl.grad, mine(v.grad)), ("dbias", bl.grad, dbias)):
        torch.testing.assert_close(got, want, **TOL, msg=name)


PROPER = [a for a in factorisations(WORLD) if 1 < a < WORLD]


@pytest.mark.parametrize("a", PROPER or [pytest.param(1, marks=pytest.mark.skip(
    reason=f"{WORLD} ranks have no head axis 1 < a < p"))])
@pytest.mark.parametrize("model", ["gt", "gps"])
def test_gp_2d_model_step_equals_reference(prepared, groups, model, a):
    ref_cls, dist_cls = ((GraphTransformer, DistGraphTransformer) if model == "gt"
                         else (GPS, DistGPS))
    _gt.check_one_step(prepared, groups, WORLD, "gp_2d", ref_cls, dist_cls, model == "gps",
                       head_parallel=a, ring_chunks=2)


@pytest.mark.skipif(not PROPER or (WORLD > 4 and not ALL_GRIDS),
                    reason=f"gp_2d's curve runs at 4 ranks (a = 2); {WORLD} ranks run its steps")
def test_gp_2d_training_follows_reference(prepared, groups):
    _gt.check_training(prepared, groups, WORLD, "gp_2d", GraphTransformer,
                       DistGraphTransformer, False, head_parallel=PROPER[0])
