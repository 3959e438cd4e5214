"""Sparse multi-head attention: dense reference, gradcheck, blocked mode, edge cases, CUDA."""

import pytest
import torch

from plexgt.ops import attention_triton
from plexgt.ops.attention import dense_attention_reference, sparse_attention
from plexgt.ops.csr import CSRGraph


def _graph(nr, nc, e, seed, empty_rows=()):
    g = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, nr, (e,), generator=g)
    src = torch.randint(0, nc, (e,), generator=g)
    keep = torch.ones(e, dtype=torch.bool)
    for r in empty_rows:
        keep &= dst != r
    return CSRGraph.from_coo(dst[keep], src[keep], nr, nc)


def _qkv(nr, nc, h, d, dtype=torch.float64, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(nr, h, d, generator=g, dtype=dtype)
    k = torch.randn(nc, h, d, generator=g, dtype=dtype)
    v = torch.randn(nc, h, d, generator=g, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v)]


@pytest.mark.parametrize("h", [1, 2, 8])
@pytest.mark.parametrize("shape", [(12, 12), (9, 15), (15, 6)])
def test_matches_dense_reference(h, shape):
    nr, nc = shape
    graph = _graph(nr, nc, 50, seed=h, empty_rows=(2,))
    q, k, v = _qkv(nr, nc, h, 4)
    y = sparse_attention(graph, q, k, v)
    ref = dense_attention_reference(graph, q, k, v)
    assert y.shape == (nr, h, 4)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    assert torch.all(y[2] == 0)  # row without neighbours
    # gradients agree with autograd through the dense reference
    w = torch.randn_like(ref)
    g1 = torch.autograd.grad((y * w).sum(), (q, k, v))
    g2 = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("h", [1, 2, 8])
def test_gradcheck_float64(h):
    graph = _graph(6, 8, 20, seed=10 + h, empty_rows=(1,))
    q, k, v = _qkv(6, 8, h, 3, seed=h)
    assert torch.autograd.gradcheck(lambda a, b, c: sparse_attention(graph, a, b, c), (q, k, v))


def test_gradcheck_blocked_and_custom_scale():
    graph = _graph(7, 5, 22, seed=3)
    q, k, v = _qkv(7, 5, 2, 3, seed=5)
    assert torch.autograd.gradcheck(
        lambda a, b, c: sparse_attention(graph, a, b, c, scale=0.7, block_rows=3), (q, k, v)
    )


def test_partial_requires_grad():
    graph = _graph(6, 6, 20, seed=4)
    q, k, v = _qkv(6, 6, 2, 3)
    k.requires_grad_(False)
    y = sparse_attention(graph, q, k, v)
    gq, gv = torch.autograd.grad(y.sum(), (q, v))
    ref = dense_attention_reference(graph, q, k, v)
    rq, rv = torch.autograd.grad(ref.sum(), (q, v))
    torch.testing.assert_close(gq, rq)
    torch.testing.assert_close(gv, rv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_blocked_equals_unblocked(dtype):
    graph = _graph(40, 30, 300, seed=7, empty_rows=(0, 39))
    q, k, v = _qkv(40, 30, 4, 8, dtype=dtype)
    y0 = sparse_attention(graph, q, k, v)
    w = torch.randn_like(y0)
    g0 = torch.autograd.grad((y0 * w).sum(), (q, k, v))
    for block in (1, 7, 16, 39):
        y1 = sparse_attention(graph, q, k, v, block_rows=block)
        g1 = torch.autograd.grad((y1 * w).sum(), (q, k, v))
        tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
        torch.testing.assert_close(y1, y0, **tol)
        for a, b in zip(g1, g0):
            torch.testing.assert_close(a, b, **tol)


def test_numerically_stable_with_large_scores():
    graph = _graph(10, 10, 40, seed=8)
    q, k, v = _qkv(10, 10, 2, 4, dtype=torch.float32, grad=False)
    y = sparse_attention(graph, q * 300.0, k * 300.0, v)  # scores ~1e5: exp would overflow
    assert torch.isfinite(y).all()
    ref = dense_attention_reference(graph, q.double() * 300, k.double() * 300, v.double())
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4)


def test_graph_without_edges_and_head_major_input():
    graph = _graph(5, 4, 0, seed=0)
    q, k, v = _qkv(5, 4, 2, 3)
    y = sparse_attention(graph, q, k, v)
    assert torch.all(y == 0)
    y.sum().backward()
    assert torch.all(q.grad == 0) and torch.all(k.grad == 0)
    # inputs that are views of head-major memory take the no-copy path and agree
    graph = _graph(8, 8, 30, seed=9)
    q, k, v = _qkv(8, 8, 2, 3, grad=False)
    hm = [t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v)]
    torch.testing.assert_close(sparse_attention(graph, *hm), sparse_attention(graph, q, k, v))


def test_shape_errors():
    graph = _graph(5, 4, 10, seed=0)
    q, k, v = _qkv(5, 5, 2, 3)
    with pytest.raises(ValueError):
        sparse_attention(graph, q, k, v)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("block_rows", [None, 5])
def test_cuda_matches_cpu(block_rows):
    graph = _graph(30, 25, 200, seed=11, empty_rows=(3,))
    q, k, v = _qkv(30, 25, 4, 8, dtype=torch.float64)
    y = sparse_attention(graph, q, k, v, block_rows=block_rows)
    w = torch.randn_like(y)
    grads = torch.autograd.grad((y * w).sum(), (q, k, v))
    gc = graph.to("cuda")
    qc, kc, vc = (t.detach().cuda().requires_grad_() for t in (q, k, v))
    yc = sparse_attention(gc, qc, kc, vc, block_rows=block_rows)
    grads_c = torch.autograd.grad((yc * w.cuda()).sum(), (qc, kc, vc))
    torch.testing.assert_close(yc.cpu(), y)
    for a, b in zip(grads_c, grads):
        torch.testing.assert_close(a.cpu(), b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spmm_overwrites_garbage_output(dtype):
    """The per-head SpMM writes into uninitialised memory: NaN there must never leak through."""
    from plexgt.ops.attention import spmm

    graph = _graph(30, 20, 120, seed=12, empty_rows=(4,))
    vals = torch.rand(3, graph.num_edges, dtype=dtype)
    x = torch.randn(3, 20, 5, dtype=dtype)
    out = torch.full((30, 3, 5), float("nan"), dtype=dtype)  # node-major output
    spmm(graph, vals, x, out=out)
    dense = graph.to_dense(dtype)
    for i in range(3):
        a = torch.zeros_like(dense)
        a[graph.row, graph.indices] = vals[i]
        torch.testing.assert_close(out[:, i], a @ x[i])
    assert torch.all(out[4] == 0)


def test_bfloat16_reference_computes_in_float32():
    """Half-precision inputs on the torch path (CPU, or cuSPARSE) are computed in float32 and
    rounded once, also under autocast (whose mm would cast them back): y and the gradients
    agree with float32 arithmetic on the same rounded inputs to bfloat16's own rounding."""
    graph = _graph(30, 30, 200, seed=4, empty_rows=(3,))
    q, k, v = (t.detach().to(torch.bfloat16).requires_grad_() for t in _qkv(30, 30, 2, 8))
    res = torch.randn(30, 16).to(torch.bfloat16).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = sparse_attention(graph, q, k, v, residual=res.clone())
    assert y.dtype == torch.bfloat16
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v, res)]
    ref = sparse_attention(graph, *ref_in[:3]).reshape(30, 16) + ref_in[3]
    w = torch.randn(30, 16)
    g = torch.autograd.grad((y.double() * w).sum(), (q, k, v, res))
    g_ref = torch.autograd.grad((ref * w).sum(), ref_in)
    for a, b in zip((y, *g), (ref, *g_ref)):
        assert (a.double() - b).abs().max() <= 2e-2 * b.abs().max()


@pytest.mark.parametrize("block_rows", [None, 5])
def test_edge_bias_equals_dense_reference_with_gradients(block_rows):
    """A per-edge, per-head bias added to the scores: output and the gradients of q, k, v
    and the bias equal the dense masked softmax's (float64), unblocked and blocked."""
    g = _bias_graph()
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(g.num_rows if i == 0 else g.num_cols, 3, 8, generator=gen,
                           dtype=torch.float64).requires_grad_() for i in range(3))
    b = torch.randn(3, g.num_edges, generator=gen, dtype=torch.float64).requires_grad_()
    w = torch.randn(g.num_rows, 3, 8, generator=gen, dtype=torch.float64)
    got = sparse_attention(g, q, k, v, block_rows=block_rows, bias=b)
    grads = torch.autograd.grad((got * w).sum(), (q, k, v, b))
    ref = dense_attention_reference(g, q, k, v, bias=b)
    want = torch.autograd.grad((ref * w).sum(), (q, k, v, b))
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    for name, a, c in zip("qkvb", grads, want):
        torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-12, msg=name)
    with pytest.raises(ValueError, match=r"bias must be \[heads, edges\]"):
        sparse_attention(g, q, k, v, bias=b[:, 1:])
    if attention_triton.supports(q):  # the fused kernel takes the bias too (it once refused)
        fused = sparse_attention(g, q, k, v, bias=b, kernel="fused")
        torch.testing.assert_close(fused, ref, rtol=1e-10, atol=1e-12)
        for name, a, c in zip("qkvb", torch.autograd.grad((fused * w).sum(), (q, k, v, b)),
                              want):
            torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-12, msg=name)


def _bias_graph() -> CSRGraph:
    gen = torch.Generator().manual_seed(2)
    dense = torch.rand(13, 11, generator=gen) < 0.35
    dense[4] = False  # a row without neighbours
    return CSRGraph.from_coo(*dense.nonzero().t(), 13, 11)
