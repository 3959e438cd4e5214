"""Every attention strategy's GPU dispatch on the fused Triton kernel, with no torch SDDMM.

On one rank each strategy still runs its own forward (gp_ring / gp_2d: the column blocks of
K/V chunks and the super keys, merged online by the log-sum-exp rule, and the backward from
the whole rows' lse and delta). The GPU dispatch is selected by declaring the CPU a GPU type
(``attention_triton.GPU_TYPES``, the one device check every path asks through
:func:`~plexgt.ops.attention_triton.gpu_default`); the kernels then run under Triton's
interpreter. ``torch.sparse.sampled_addmm`` is replaced by a function that raises: the same
calls without the declared GPU reach it (so the trap is live), with it none does, and the
results equal torch's kernels on the whole pattern. On a machine with a GPU the same runs
there, compiled (the trap stays; the CPU run shows it live).
"""

import pytest
import torch

from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.ops import attention_triton
from plexgt.ops.attention import sparse_attention
from plexgt.ops.csr import CSRGraph
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.strategy import make_shard

ON_GPU = torch.cuda.is_available()
pytestmark = [
    pytest.mark.skipif(attention_triton.triton is None
                       or not (ON_GPU or attention_triton.interpreted()),
                       reason="needs a GPU or Triton's interpreter"),
    pytest.mark.timeout(240),
]
STRATEGIES = default_registry().names()
N, S, FE = 40, 2, 3


class SampledAddmmReached(RuntimeError):
    pass


def _trap(*args, **kwargs):
    raise SampledAddmmReached("torch.sparse.sampled_addmm reached")


def _graph() -> CSRGraph:
    """Empty rows (0, 9), a node no row attends to, and a hub row of degree 30 (the mean is
    about 3.5)."""
    g = torch.Generator().manual_seed(3)
    dense = torch.rand(N, N, generator=g) < 0.06
    dense[[0, 9]] = False
    dense[:, 5] = False
    dense[4] = False
    dense[4, torch.randperm(N, generator=g)[:30]] = True
    dense[4, 5] = False
    return CSRGraph.from_coo(*dense.nonzero().t(), N, N)


def _shard(name: str, heads: int, chunks: int):
    strat = default_registry().get(name)
    ledger = CommLedger()
    comm = Comm.single("rows", ledger)
    groups = strat.groups(comm, 1, ledger, None) if strat.groups is not None else {}
    return make_shard(strat, comm, N, heads, _graph(), groups, 1, chunks, S)


def _inputs(shard, heads, d, dtype):
    g = torch.Generator().manual_seed(heads * d)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    n = shard.n_loc
    return (rnd(n, heads, d), rnd(n, heads, d), rnd(n, heads, d), rnd(S, heads, d),
            rnd(S, heads, d), rnd(shard.graph.num_edges, FE), rnd(heads, FE), rnd(n, heads, d))


def _attend(shard, q, k, v, ks, vs, attr, w, dy, dev="cpu"):
    """y and the gradients of q, k, v, the super k, v and W_b on ``dev`` (back on the CPU)."""
    shard = shard.to(dev)
    leaves = [t.detach().to(dev).requires_grad_() for t in (q, k, v, ks, vs, w)]
    qq, kk, vv, kks, vvs, ww = leaves
    y = shard.attend(qq, kk, vv, kv_super=(kks, vvs), bias=(attr.to(dev) @ ww.t()).t())
    grads = torch.autograd.grad(y, leaves, dy.to(dev))
    return y.detach().cpu(), [g.cpu() for g in grads]


def _gpu_dispatch(monkeypatch) -> str:
    """The device whose dispatch is the GPU's: a real GPU, else the CPU declared one."""
    if ON_GPU:
        return "cuda"
    monkeypatch.setattr(attention_triton, "GPU_TYPES", ("cpu",))
    return "cpu"


def _reference(shard, q, k, v, ks, vs, attr, w, dy):
    """torch's kernels on the shard's whole pattern (real and super columns), float64."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, ks, vs, w)]
    qq, kk, vv, kks, vvs, ww = leaves
    y = sparse_attention(shard.graph, qq, torch.cat([kk, kks]), torch.cat([vv, vvs]),
                         kernel="torch", bias=(attr.double() @ ww.t()).t())
    return y.detach(), torch.autograd.grad(y, leaves, dy.double())


NAMES = ("y", "dq", "dk", "dv", "dk_super", "dv_super", "dW_b")


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize(("heads", "d", "chunks"), [(1, 8, 3), (4, 32, 2)])
def test_gpu_dispatch_never_reaches_sampled_addmm(name, heads, d, chunks, monkeypatch):
    """float64: the fused kernel's result (ring: blocks merged) equals the whole pattern's."""
    shard = _shard(name, heads, chunks)
    args = _inputs(shard, heads, d, torch.float64)
    y_ref, g_ref = _reference(shard, *args)
    monkeypatch.setattr(torch.sparse, "sampled_addmm", _trap)
    with pytest.raises(SampledAddmmReached):  # the CPU dispatch (a bias: torch's kernels)
        _attend(shard, *args)
    y, grads = _attend(shard, *args, dev=_gpu_dispatch(monkeypatch))
    for a, b, what in zip((y, *grads), (y_ref, *g_ref), NAMES):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=what)


@pytest.mark.parametrize("name", ["gp_ring", "gp_2d"])
def test_ring_blocks_float32_within_rounding(name, monkeypatch):
    """float32 ring on the fused kernel against float64 arithmetic on the same rounded
    inputs: within 2e-5 of each result's largest entry."""
    shard = _shard(name, 2, 3)
    args = _inputs(shard, 2, 16, torch.float32)
    y_ref, g_ref = _reference(shard, *args)
    monkeypatch.setattr(torch.sparse, "sampled_addmm", _trap)
    y, grads = _attend(shard, *args, dev=_gpu_dispatch(monkeypatch))
    for a, b, what in zip((y, *grads), (y_ref, *g_ref), NAMES):
        assert a.dtype == torch.float32
        err = (a.double() - b).abs().max() / b.abs().max()
        assert err < 2e-5, (what, float(err))
