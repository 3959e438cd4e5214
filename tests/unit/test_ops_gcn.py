"""GCN normalisation and SpMM: values, gradcheck, rectangular blocks, CUDA."""

import pytest
import torch

from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import gcn_norm, gcn_spmm


def _sym_graph(n, e, seed):
    g = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, n, (e,), generator=g)
    src = torch.randint(0, n, (e,), generator=g)
    return CSRGraph.from_coo(torch.cat([dst, src]), torch.cat([src, dst]), n, n)


def _dense_gcn(a):
    a = a.clone()
    a.fill_diagonal_(1.0)
    deg = a.sum(1)
    return deg.pow(-0.5)[:, None] * a * deg.pow(-0.5)[None, :]


def test_gcn_norm_matches_dense_formula():
    graph = _sym_graph(12, 25, 0)
    norm = gcn_norm(graph, dtype=torch.float64)
    ref = _dense_gcn(graph.to_dense(torch.float64))
    torch.testing.assert_close(norm.to_dense(torch.float64), ref)


def test_existing_self_loop_not_doubled():
    graph = CSRGraph.from_coo(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]), 3, 3)
    norm = gcn_norm(graph, dtype=torch.float64)
    d = norm.to_dense(torch.float64)
    # node 0: neighbours {0, 1} -> deg 2; node 1: {0, 1} -> 2; node 2 isolated: {2} -> 1
    assert d[0, 0] == pytest.approx(0.5) and d[2, 2] == pytest.approx(1.0)
    assert norm.num_edges == 5  # (0,0) (0,1) (1,0) (1,1) (2,2)


def test_gradcheck_spmm():
    graph = gcn_norm(_sym_graph(9, 20, 1), dtype=torch.float64)
    x = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: gcn_spmm(graph, t), (x,))
    torch.testing.assert_close(gcn_spmm(graph, x), graph.to_dense(torch.float64) @ x)


def test_rectangular_row_block_equals_rows_of_full():
    full_struct = _sym_graph(15, 40, 2)
    full = gcn_norm(full_struct, dtype=torch.float64)
    col_deg = gcn_norm(full_struct).degrees().double()  # exact counts incl. loops
    blk_struct = full_struct.row_slice(5, 11)
    blk = gcn_norm(blk_struct, row_offset=5, col_degrees=col_deg, dtype=torch.float64)
    torch.testing.assert_close(blk.to_dense(torch.float64), full.to_dense(torch.float64)[5:11])
    x = torch.randn(15, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: gcn_spmm(blk, t), (x,))
    with pytest.raises(ValueError, match="col_degrees"):
        gcn_norm(blk_struct, row_offset=5)


def test_float32_and_float64_share_graph():
    graph = gcn_norm(_sym_graph(10, 30, 3))
    x = torch.randn(10, 5)
    torch.testing.assert_close(gcn_spmm(graph, x.double()).float(), gcn_spmm(graph, x))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    graph = gcn_norm(_sym_graph(20, 60, 4), dtype=torch.float64)
    x = torch.randn(20, 6, dtype=torch.float64, requires_grad=True)
    y = gcn_spmm(graph, x)
    (gx,) = torch.autograd.grad(y.square().sum(), x)
    xc = x.detach().cuda().requires_grad_()
    yc = gcn_spmm(graph.to("cuda"), xc)
    (gxc,) = torch.autograd.grad(yc.square().sum(), xc)
    torch.testing.assert_close(yc.cpu(), y)
    torch.testing.assert_close(gxc.cpu(), gx)


def test_bfloat16_spmm_sums_in_float32():
    """bfloat16 features: the product runs in float32 (CPU sparse kernels have no bfloat16,
    and autocast would cast its mm back), rounded once."""
    import numpy as np

    rng = np.random.default_rng(0)
    n = 40
    src, dst = rng.integers(0, n, 400), rng.integers(0, n, 400)
    graph = gcn_norm(CSRGraph.from_coo(torch.from_numpy(dst), torch.from_numpy(src), n, n))
    x = torch.randn(n, 8).to(torch.bfloat16).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = gcn_spmm(graph, x)
    assert y.dtype == torch.bfloat16
    ref = gcn_spmm(graph.with_values(graph.values.double()), x.detach().double())
    assert (y.double() - ref).abs().max() <= 1e-2 * ref.abs().max()
    (dx,) = torch.autograd.grad(y.float().sum(), x)
    assert dx.dtype == torch.bfloat16
