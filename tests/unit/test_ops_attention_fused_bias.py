"""The fused Triton kernel with an edge bias, wide heads and the tile cap, against torch.

The bias is the model's: ``(edge_attr W_bᵀ)ᵀ``, an [h, E] view of the [E, h] output of a linear
map (strided: the kernel reads it in place), so the gradient checked is W_b's, through the
bias gradient the row backward stores per edge. Kernels run under Triton's interpreter here
(tests/conftest.py), compiled on a GPU when one is present.
"""

import pytest
import torch

from plexgt.ops import attention_triton
from plexgt.ops.attention import sparse_attention
from plexgt.ops.csr import CSRGraph

pytestmark = [
    pytest.mark.skipif(attention_triton.triton is None, reason="triton is not installed"),
    pytest.mark.timeout(180),
]
DEV = "cpu" if not torch.cuda.is_available() else "cuda"
FE = 3


def hub_graph(nr: int = 80, nc: int = 250, e: int = 40, hub_degree: int = 200, seed: int = 0,
              empty: tuple[int, ...] = (0, 7)) -> CSRGraph:
    """Sparse random rows (most empty), the rows ``empty`` surely so, and row 3 a hub of
    ``hub_degree`` distinct columns: at least 50x the mean degree."""
    g = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, nr, (e,), generator=g)
    src = torch.randint(0, nc, (e,), generator=g)
    keep = torch.ones(e, dtype=torch.bool)
    for r in (*empty, 3):
        keep &= dst != r
    dst = torch.cat([dst[keep], torch.full((hub_degree,), 3)])
    src = torch.cat([src[keep], torch.randperm(nc, generator=g)[:hub_degree]])
    graph = CSRGraph.from_coo(dst, src, nr, nc)
    deg = graph.degrees()
    assert deg[3] >= 50 * deg.double().mean() and all(deg[r] == 0 for r in empty)
    return graph


def _inputs(graph, h, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    q, k, v = rnd(graph.num_rows, h, d), rnd(graph.num_cols, h, d), rnd(graph.num_cols, h, d)
    attr, w = rnd(graph.num_edges, FE), rnd(h, FE)
    return q, k, v, attr, w, rnd(graph.num_rows, h, d)


def _run(graph, q, k, v, attr, w, dy, scale, kernel, residual=None):
    """y and the gradients of q, k, v and W_b (and the residual's, with one)."""
    leaves = [t.detach().to(DEV).requires_grad_() for t in (q, k, v, w)]
    qq, kk, vv, ww = leaves
    bias = (attr.to(DEV) @ ww.t()).t()  # [h, E], strides (1, h)
    res = None
    if residual is not None:
        res = residual.detach().clone().to(DEV).requires_grad_()
        leaves.append(res)
        res = res.clone()
    y = sparse_attention(graph.to(DEV), qq, kk, vv, scale, residual=res, kernel=kernel,
                         bias=bias)
    grads = torch.autograd.grad(y, leaves, dy.to(DEV).reshape(y.shape))
    return y.detach().cpu().reshape(dy.shape), [g.cpu() for g in grads]


def _reference(graph, q, k, v, attr, w, dy, scale, residual=None):
    """Float64 torch kernels on the same (rounded) inputs."""
    args = [t.double() for t in (q, k, v, attr, w, dy)]
    return _run(graph.to("cpu"), *args, scale, "torch",
                None if residual is None else residual.double())


@pytest.mark.parametrize(("h", "d"), [(1, 8), (3, 24), (8, 16), (2, 64), (1, 256)])
def test_float64_with_bias_matches_reference(h, d):
    """y and dq, dk, dv, dW_b to float64 rounding, with empty rows and a hub (many steps)."""
    graph = hub_graph(seed=h + d)
    q, k, v, attr, w, dy = _inputs(graph, h, d, torch.float64, h * d)
    y, grads = _run(graph, q, k, v, attr, w, dy, 0.31, "fused")
    y_ref, g_ref = _reference(graph, q, k, v, attr, w, dy, 0.31)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    assert torch.all(y[[0, 7]] == 0)
    for a, b, name in zip(grads, g_ref, ("q", "k", "v", "W_b")):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=f"d{name}")


@pytest.mark.parametrize(("h", "d", "dtype", "tol"), [(4, 32, torch.float32, 2e-5),
                                                     (2, 256, torch.float32, 2e-5),
                                                     (2, 16, torch.bfloat16, 2e-2)])
def test_low_precision_with_bias_within_rounding(h, d, dtype, tol):
    """float32 / bfloat16 inputs against float64 arithmetic on the same rounded inputs:
    relative to each result's largest entry, within 2e-5 (float32 sums over the hub's 200
    edges) / 2e-2 (bfloat16's own rounding of the outputs, and of the saved y that delta =
    rowsum(dY ∘ Y) reads)."""
    graph = hub_graph(seed=5)
    q, k, v, attr, w, dy = _inputs(graph, h, d, dtype, 5)
    y, grads = _run(graph, q, k, v, attr, w, dy, 0.2, "fused")
    y_ref, g_ref = _reference(graph, q, k, v, attr, w, dy, 0.2)
    assert y.dtype == dtype and all(g.dtype == dtype for g in grads)
    for a, b, name in zip((y, *grads), (y_ref, *g_ref), ("y", "dq", "dk", "dv", "dW_b")):
        err = (a.double() - b).abs().max() / b.abs().max()
        assert err < tol, (name, float(err))


def test_bias_with_a_residual():
    """The residual gains y in place, keeps its own gradient, and the bias's is unchanged."""
    graph = hub_graph(nr=60, seed=9)
    q, k, v, attr, w, dy = _inputs(graph, 2, 8, torch.float64, 9)
    res = torch.randn(graph.num_rows, 16, dtype=torch.float64)
    y, grads = _run(graph, q, k, v, attr, w, dy, 0.5, "fused", residual=res)
    y_ref, g_ref = _reference(graph, q, k, v, attr, w, dy, 0.5, residual=res)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


def test_tile_never_passes_the_cap():
    """BLOCK_R·BLOCK_E·HG·BLOCK_D <= TILE_ELEMS for every served d', head count and mean
    degree (at d' = 256 and a mean degree of 64 it was 64·256 = 4x the cap, BLOCK_R floored
    at 1); the head group is a power of two (Triton's block shapes), holds every head while
    h·d' fits GROUP_ELEMS and never more than the heads there are, rounded up."""
    for d in range(1, attention_triton.MAX_HEAD_DIM + 1):
        for h in (1, 3, 8, 16):
            for mean in (0, 1, 5, 17, 40, 64, 1000):
                br, be, hg, bd = attention_triton.blocks(100, 100 * mean, d, h)
                assert br * be * hg * bd <= attention_triton.TILE_ELEMS, (d, h, mean)
                assert br >= 1 and be >= 1 and bd >= d and hg & (hg - 1) == 0
                assert hg < 2 * h and hg * bd <= max(bd, attention_triton.GROUP_ELEMS)
                if h * bd <= attention_triton.GROUP_ELEMS:
                    assert hg >= h, (d, h)


def test_indices_are_int32_on_every_device():
    """compact_index (what the fused kernel reads) is int32 wherever E fits, GPUs included
    (a non-CPU graph kept int64: twice the index bytes of every gather step)."""
    graph = hub_graph()
    for dev in ("cpu", "meta"):
        ip, ix = graph.to(dev).compact_index()
        assert ip.dtype == ix.dtype == torch.int32 and ip.device.type == dev
        assert graph.to(dev).compact_transpose_perm().dtype == torch.int32
