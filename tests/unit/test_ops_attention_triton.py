"""The fused Triton attention kernel against the torch reference: outputs and every gradient.

Here (no GPU) the kernels run under Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 before plexgt is imported), so these are the kernels' own arithmetic and
indexing, not a stand-in; the ``cuda`` tests compile them for a GPU when one is present.
"""

import pytest
import torch

from plexgt.ops import attention_triton
from plexgt.ops.attention import sparse_attention
from plexgt.ops.csr import CSRGraph

pytestmark = [
    pytest.mark.skipif(attention_triton.triton is None, reason="triton is not installed"),
    pytest.mark.timeout(120),
]
ON_CPU = not torch.cuda.is_available()
DEV = "cpu" if ON_CPU else "cuda"


def _graph(nr, nc, e, seed, empty=(), hub=None, hub_degree=0):
    """Random pattern with the rows in ``empty`` left without edges and row ``hub`` given
    ``hub_degree`` more (several of the kernel's edge steps)."""
    g = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, nr, (e,), generator=g)
    src = torch.randint(0, nc, (e,), generator=g)
    if hub is not None:
        dst = torch.cat([dst, torch.full((hub_degree,), hub)])
        src = torch.cat([src, torch.randint(0, nc, (hub_degree,), generator=g)])
    keep = torch.ones(dst.numel(), dtype=torch.bool)
    for r in empty:
        keep &= dst != r
    return CSRGraph.from_coo(dst[keep], src[keep], nr, nc)


def _qkv(nr, nc, h, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, h, d, generator=g, dtype=torch.float64).to(dtype)
            for n in (nr, nc, nc)]


def _reference(graph, q, k, v, dy, scale, residual=None):
    """Float64 torch path on the same (rounded) inputs: y and (dq, dk, dv)."""
    qq, kk, vv = (t.detach().double().requires_grad_() for t in (q, k, v))
    y = sparse_attention(graph, qq, kk, vv, scale, kernel="torch")
    grads = torch.autograd.grad(y, (qq, kk, vv), dy.double())
    if residual is not None:
        y = y + residual.double().view_as(y)
    return y, grads


def _fused(graph, q, k, v, dy, scale, residual=None, need=(True, True, True)):
    gd = graph.to(DEV)
    ins = [t.detach().to(DEV).requires_grad_(n) for t, n in zip((q, k, v), need)]
    res = None if residual is None else residual.detach().clone().to(DEV).requires_grad_()
    base = res.clone() if res is not None else None  # mark_dirty needs a non-leaf
    y = sparse_attention(gd, *ins, scale, residual=base, kernel="fused")
    dyy = dy.to(DEV).reshape(y.shape)
    wrt = [t for t in ins if t.requires_grad] + ([res] if res is not None else [])
    grads = torch.autograd.grad(y, wrt, dyy)
    return y.view(dy.shape).cpu(), [g.cpu() for g in grads]


@pytest.mark.parametrize(("h", "d", "seed"), [(1, 8, 0), (3, 24, 1), (8, 16, 2), (2, 64, 3)])
def test_float64_matches_reference(h, d, seed):
    """Exact to float64 rounding on graphs with empty rows and a high-degree row."""
    nr, nc = 37, 200
    graph = _graph(nr, nc, 140, seed, empty=(0, 5, 36), hub=11, hub_degree=150)
    assert graph.degrees().max() > 64 and (graph.degrees() == 0).sum() >= 3
    q, k, v = _qkv(nr, nc, h, d, torch.float64, seed)
    dy = torch.randn(nr, h, d, dtype=torch.float64)
    scale = 0.37
    y, grads = _fused(graph, q, k, v, dy, scale)
    y_ref, g_ref = _reference(graph, q, k, v, dy, scale)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    assert torch.all(y[[0, 5, 36]] == 0)
    for a, b, name in zip(grads, g_ref, "qkv"):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12, msg=f"d{name}")


def test_residual_and_partial_gradients():
    """y added into the residual in place, its gradient passed through; only dk asked for."""
    nr, nc, h, d = 20, 20, 2, 8
    graph = _graph(nr, nc, 90, 7, empty=(3,))
    q, k, v = _qkv(nr, nc, h, d, torch.float64, 7)
    dy = torch.randn(nr, h, d, dtype=torch.float64)
    res = torch.randn(nr, h * d, dtype=torch.float64)
    y, grads = _fused(graph, q, k, v, dy, 0.5, residual=res)
    y_ref, g_ref = _reference(graph, q, k, v, dy, 0.5, residual=res)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, (*g_ref, dy.reshape(nr, h * d))):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
    _, only_k = _fused(graph, q, k, v, dy, 0.5, need=(False, True, False))
    torch.testing.assert_close(only_k[0], g_ref[1], rtol=1e-11, atol=1e-12)


def test_int64_indices_and_strided_inputs(monkeypatch):
    """The int64 index path (graphs past 2^31 edges) and node-major strided views."""
    nr, nc, h, d = 16, 100, 4, 8
    graph = _graph(nr, nc, 80, 9, hub=2, hub_degree=70)
    monkeypatch.setattr(CSRGraph, "_fits_int32", lambda self: False)
    assert graph.compact_index()[1].dtype == torch.int64
    base = torch.randn(nc, 3, h, d, dtype=torch.float64)
    q = torch.randn(nr, h, d, dtype=torch.float64)
    k, v = base[:, 0], base[:, 2]  # strided over dim 0, as slices of a fused QKV projection
    dy = torch.randn(nr, h, d, dtype=torch.float64)
    y, grads = _fused(graph, q, k, v, dy, 0.3)
    y_ref, g_ref = _reference(graph, q, k, v, dy, 0.3)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
def test_low_precision_accumulates_in_float32(dtype, tol):
    """float32 and bfloat16 inputs against float64 arithmetic on the same rounded inputs:
    the error is the output's own rounding (bf16: 2^-8 relative), not accumulated over a
    row's edges, which is what accumulating in the input dtype would give on the hub row."""
    nr, nc, h, d = 24, 400, 2, 32
    graph = _graph(nr, nc, 100, 4, empty=(1,), hub=6, hub_degree=400)
    assert graph.degrees().max() > 200
    q, k, v = _qkv(nr, nc, h, d, dtype, 4)
    dy = torch.randn(nr, h, d, dtype=torch.float64).to(dtype)
    y, grads = _fused(graph, q, k, v, dy, 0.2)
    assert y.dtype == dtype and all(g.dtype == dtype for g in grads)
    y_ref, g_ref = _reference(graph, q, k, v, dy, 0.2)
    for a, b in zip((y, *grads), (y_ref, *g_ref)):
        err = (a.double() - b).abs().max() / b.abs().max()
        assert err < tol, (dtype, float(err))


def test_edge_cases():
    """No edges at all, and a graph of zero rows."""
    q, k, v = _qkv(5, 4, 2, 8, torch.float64)
    dy = torch.randn(5, 2, 8, dtype=torch.float64)
    empty = CSRGraph.from_coo(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64),
                              5, 4)
    y, grads = _fused(empty, q, k, v, dy, 0.5)
    assert torch.all(y == 0) and all(torch.all(g == 0) for g in grads)
    none = CSRGraph.from_coo(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64),
                             0, 4)
    y, grads = _fused(none, q[:0], k, v, dy[:0], 0.5)
    assert y.shape == (0, 2, 8) and all(torch.all(g == 0) for g in grads[1:])


def _kernel_taken(y):
    """'fused' or 'torch': which kernel computed ``y`` (its autograd node says)."""
    return "fused" if "Fused" in type(y.grad_fn).__name__ else "torch"


def test_an_unknown_kernel_is_refused_by_name():
    graph = _graph(6, 6, 12, 0)
    q, k, v = _qkv(6, 6, 1, 8, torch.float64)
    with pytest.raises(ValueError, match="unknown attention kernel 'flash'"):
        sparse_attention(graph, q, k, v, kernel="flash")


def test_interpreted_reads_the_variable_where_triton_has_no_knobs(monkeypatch):
    """Triton 3.0 (torch 2.4's, the floor) has no ``triton.knobs``: the interpreter's switch is
    then TRITON_INTERPRET itself (the knobs lookup raised AttributeError there)."""
    monkeypatch.delattr(attention_triton.triton, "knobs", raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert attention_triton.interpreted()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not attention_triton.interpreted()


def test_dispatch_on_cpu_inputs_is_torch_whatever_gpu_the_machine_has(monkeypatch):
    """'auto' is decided on the inputs' device, not the machine's: CPU inputs take torch's
    kernels on a machine with a GPU too (the GPU is made visible here), and also under the
    interpreter, where the fused kernel could serve them. (The old test expected the fused
    kernel for CPU inputs whenever a GPU existed, and so failed on every GPU machine.)"""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    graph = _graph(6, 6, 12, 0)
    q, k, v = _qkv(6, 6, 1, 8, torch.float64)
    assert attention_triton.supports(q) == attention_triton.interpreted()
    assert _kernel_taken(sparse_attention(graph, q.requires_grad_(), k, v)) == "torch"


def test_dispatch_on_gpu_inputs_is_fused_where_the_kernel_serves_them(monkeypatch):
    """GPU inputs take the fused kernel, with an edge bias too, unless d' is over
    MAX_HEAD_DIM. Without a GPU the CPU stands in for one under Triton's interpreter."""
    if ON_CPU:
        if not attention_triton.interpreted():
            pytest.skip("no GPU and no Triton interpreter")
        monkeypatch.setattr(attention_triton, "GPU_TYPES", ("cpu",))
    graph = _graph(6, 6, 12, 0).to(DEV)
    q, k, v = (t.to(DEV).requires_grad_() for t in _qkv(6, 6, 1, 8, torch.float64))
    assert _kernel_taken(sparse_attention(graph, q, k, v)) == "fused"
    bias = torch.zeros(1, graph.num_edges, dtype=torch.float64, device=DEV)
    assert _kernel_taken(sparse_attention(graph, q, k, v, bias=bias)) == "fused"
    wide = attention_triton.MAX_HEAD_DIM + 8
    q, k, v = (t.to(DEV).requires_grad_() for t in _qkv(6, 6, 1, wide, torch.float64))
    assert _kernel_taken(sparse_attention(graph, q, k, v)) == "torch"


@pytest.mark.cuda
@pytest.mark.skipif(ON_CPU, reason="needs a CUDA or ROCm device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_kernel_on_gpu(dtype):
    """The compiled kernel on a real GPU against the CPU float64 reference."""
    nr, nc, h, d = 3000, 2500, 4, 32
    graph = _graph(nr, nc, 40000, 11, empty=(0, 17), hub=5, hub_degree=3000)
    q, k, v = _qkv(nr, nc, h, d, dtype, 11)
    dy = torch.randn(nr, h, d, dtype=torch.float64).to(dtype)
    y, grads = _fused(graph, q, k, v, dy, 0.25)
    y_ref, g_ref = _reference(graph, q, k, v, dy, 0.25)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    for a, b in zip((y, *grads), (y_ref, *g_ref)):
        assert (a.double() - b).abs().max() / b.abs().max() < tol


def test_nothing_of_size_e_is_kept_for_backward():
    """Between forward and backward the fused kernel keeps q, k, v, y (for delta =
    rowsum(dY ∘ Y)) and the [h, Nr] log-sum-exp; the torch path keeps the [h, E]
    probabilities (what makes it run out of memory first)."""
    nr, nc, h, d = 30, 30, 4, 8
    graph = _graph(nr, nc, 400, 5)
    q, k, v = (t.requires_grad_() for t in _qkv(nr, nc, h, d, torch.float64))
    e = graph.num_edges
    assert e > nr * d  # so an [h, E] array is the largest thing either path could save

    def saved_sizes(kernel):
        sizes = []

        def pack(t):
            sizes.append(t.numel())
            return t

        gd = graph.to(DEV)
        ins = [t.detach().to(DEV).requires_grad_() for t in (q, k, v)]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            sparse_attention(gd, *ins, kernel=kernel)
        return sizes

    fused = saved_sizes("fused")
    assert sorted(fused) == sorted([nr * h * d, nc * h * d, nc * h * d, nr * h * d, h * nr])
    assert h * e in saved_sizes("torch")
