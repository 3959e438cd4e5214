"""CSRGraph construction, duplicates, transpose cache, rectangular shapes."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from plexgt.ops.csr import CSRGraph
from plexgt.ops.super_nodes import super_columns


def _random_coo(nr, nc, e, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, nr, (e,), generator=g), torch.randint(0, nc, (e,), generator=g)


def test_from_coo_matches_scipy_rectangular():
    dst, src = _random_coo(7, 11, 40, 0)
    g = CSRGraph.from_coo(dst, src, 7, 11)
    ref = sp.coo_matrix((np.ones(40), (dst.numpy(), src.numpy())), shape=(7, 11)).tocsr()
    ref.sum_duplicates()
    ref.data[:] = 1
    assert g.shape == (7, 11)
    assert torch.equal(g.indptr, torch.from_numpy(ref.indptr.astype(np.int64)))
    assert torch.equal(g.indices, torch.from_numpy(ref.indices.astype(np.int64)))
    assert (g.to_scipy() != ref).nnz == 0


def test_duplicates_merge_sums_values_and_error_flag():
    dst = torch.tensor([0, 0, 1, 0])
    src = torch.tensor([2, 2, 0, 1])
    g = CSRGraph.from_coo(dst, src, 2, 3, values=torch.tensor([1.0, 2.0, 5.0, 7.0]))
    assert g.num_edges == 3
    assert torch.equal(g.indices, torch.tensor([1, 2, 0]))
    assert torch.equal(g.values, torch.tensor([7.0, 3.0, 5.0]))
    structural = CSRGraph.from_coo(dst, src, 2, 3)
    assert structural.num_edges == 3 and structural.values is None
    with pytest.raises(ValueError, match="duplicate"):
        CSRGraph.from_coo(dst, src, 2, 3, duplicates="error")
    CSRGraph.from_coo(dst[1:], src[1:], 2, 3, duplicates="error")  # simple graph passes


def test_out_of_range_ids_rejected():
    with pytest.raises(ValueError, match="source"):
        CSRGraph.from_coo(torch.tensor([0]), torch.tensor([3]), 2, 3)
    with pytest.raises(ValueError, match="destination"):
        CSRGraph.from_coo(torch.tensor([2]), torch.tensor([0]), 2, 3)


def test_from_scipy_keeps_orientation():
    m = sp.random(6, 9, density=0.3, random_state=1, format="csr")
    g = CSRGraph.from_scipy(m)
    assert torch.allclose(g.to_dense(torch.float64), torch.from_numpy(m.toarray()))


def test_transpose_cached_and_consistent():
    dst, src = _random_coo(8, 5, 30, 2)
    vals = torch.arange(30, dtype=torch.float64)
    g = CSRGraph.from_coo(dst, src, 8, 5, values=vals)
    t = g.transpose()
    assert t is g.transpose()  # built once
    assert t.shape == (5, 8)
    assert torch.equal(t.to_dense(torch.float64), g.to_dense(torch.float64).t())
    assert torch.equal(t.values, g.values[g.transpose_perm])
    # rows of the transpose are sorted, i.e. a valid CSR
    for r in range(t.num_rows):
        seg = t.indices[t.indptr[r]:t.indptr[r + 1]]
        assert torch.all(seg[1:] > seg[:-1])
    assert t.transpose() is g
    assert torch.equal(t.values[t.transpose_perm], g.values)


def test_row_blocks_and_with_values():
    dst, src = _random_coo(10, 10, 50, 3)
    g = CSRGraph.from_coo(dst, src, 10, 10)
    blocks = g.row_blocks(3)
    assert [(a, b) for a, b, _ in blocks] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    dense = g.to_dense()
    for a, b, blk in blocks:
        assert blk.shape == (b - a, 10)
        assert torch.equal(blk.to_dense(), dense[a:b])
    g.transpose()
    w = g.with_values(torch.rand(g.num_edges))
    assert torch.equal(w.transpose().values, w.values[g.transpose_perm])


def test_empty_graph_and_to_device():
    g = CSRGraph.from_coo(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                          4, 6)
    assert g.num_edges == 0 and g.transpose().shape == (6, 4)
    assert g.to("cpu") is g
    assert torch.equal(g.degrees(), torch.zeros(4, dtype=torch.long))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_to_cuda_round_trip():
    dst, src = _random_coo(8, 5, 30, 4)
    g = CSRGraph.from_coo(dst, src, 8, 5)
    g.transpose()
    gc = g.to("cuda")
    assert gc.device.type == "cuda" and gc.transpose().device.type == "cuda"
    assert torch.equal(gc.to_dense().cpu(), g.to_dense())


def test_super_columns_add_dense_columns_to_real_rows_only():
    rng = np.random.default_rng(3)
    dense = (rng.random((7, 5)) < 0.4).astype(np.float64) * rng.random((7, 5))
    g = CSRGraph.from_scipy(sp.csr_matrix(dense))
    got = super_columns(g, 2, 5)  # rows 5, 6 are padding: no super columns
    want = np.zeros((7, 7))
    want[:, :5] = dense
    want[:5, 5:] = 1.0
    assert got.shape == (7, 7)
    assert np.array_equal(got.to_scipy().toarray(), want)
    assert all(np.all(np.diff(got.indices[a:b].numpy()) > 0)
               for a, b in zip(got.indptr[:-1].tolist(), got.indptr[1:].tolist()))
    assert super_columns(g, 0, 7) is g
    empty = CSRGraph.from_scipy(sp.csr_matrix((3, 4)))
    assert super_columns(empty, 2, 0).num_edges == 0
    assert super_columns(empty, 2, 3).num_edges == 6
