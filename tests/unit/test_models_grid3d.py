"""sage and mlp (grid3d models of graph operators), the operators' blocks, the model registry."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from plexgt.errors import ConfigError
from plexgt.models import MODELS, ModelGraph, sparse_features
from plexgt.models.mlp import MLP
from plexgt.models.registry import default_registry
from plexgt.models.sage import SAGE
from plexgt.models.spec import ModelSpec, parameter_lists
from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import mean_norm
from plexgt.parallel.operators import identity_block, mean_block_values, operator_block
from plexgt.plan.knobs import load_config


def _toy(n=30, feats=6, seed=0):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, 4 * n), rng.integers(0, n, 4 * n)
    keep = (src != dst) & (dst != n - 1)  # node n-1 has no in-edge: it averages only itself
    src, dst = src[keep], dst[keep]
    x = torch.from_numpy(rng.normal(size=(n, feats)))
    y = torch.from_numpy(rng.integers(0, 3, n))
    return x, ModelGraph.from_edges(dst, src, n, attention=False, gcn=False, mean=True), \
        (dst, src), y


def _dense_mean(edges, n, self_loops=True):
    """M = D^-1 (A + I) by numpy: row r averages the distinct in-neighbours of r."""
    a = np.zeros((n, n))
    a[edges[0], edges[1]] = 1.0
    if self_loops:
        a[np.arange(n), np.arange(n)] = 1.0
    deg = a.sum(1, keepdims=True)
    return np.divide(a, deg, out=np.zeros_like(a), where=deg > 0)


def test_sage_is_the_mean_aggregation_formula():
    """Every layer is ReLU(M (H W_n) + b + H W_s), M the row-normalised pattern with self
    loops: PyG's SAGEConv(aggr='mean') on the graph with self loops, computed densely."""
    x, _, edges, _ = _toy()
    graph = ModelGraph(mean=mean_norm(CSRGraph.from_coo(*edges, 30, 30), dtype=torch.float64))
    torch.manual_seed(0)
    model = SAGE(6, 8, 3, num_layers=2, dropout=0.0).double().eval()
    m = torch.from_numpy(_dense_mean(edges, 30))
    h = x
    for l in range(2):
        lin, root = model.layers[l], model.self_layers[l]
        assert root.bias is None
        h = m @ (h @ lin.weight.t()) + lin.bias + h @ root.weight.t()
        h = torch.relu(h) if l == 0 else h
    torch.testing.assert_close(model(x, graph), h, rtol=1e-12, atol=1e-12)


def test_mean_norm_rows_average_and_an_empty_row_is_zero():
    x, graph, edges, _ = _toy()
    want = _dense_mean(edges, 30, self_loops=False)
    g = CSRGraph.from_coo(*edges, 30, 30)
    got = mean_norm(g, self_loops=False, dtype=torch.float64).to_scipy().toarray()
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert want[29].sum() == 0 and got[29].sum() == 0  # no in-edge, no loop: averages nothing
    rows = got.sum(1)
    assert np.allclose(rows[rows > 0], 1.0)
    np.testing.assert_allclose(graph.mean.to_scipy().toarray(), _dense_mean(edges, 30),
                               rtol=1e-6)


def test_mlp_reads_no_graph():
    x, graph, _, _ = _toy()
    torch.manual_seed(0)
    model = MLP(6, 8, 3, num_layers=3, dropout=0.0).double().eval()
    out = model(x, graph)
    torch.testing.assert_close(out, model(x, None))
    h = torch.relu(model.layers[0](x))
    h = torch.relu(model.layers[1](h))
    torch.testing.assert_close(out, model.layers[2](h))


@pytest.mark.parametrize("cls", [SAGE, MLP])
def test_gradcheck_sparse_features_and_training(cls):
    x, graph, _, y = _toy(n=12, feats=4)
    torch.manual_seed(1)
    model = cls(4, 5, 3, num_layers=2, dropout=0.0).double().eval()
    assert torch.autograd.gradcheck(lambda t: model(t, graph), (x.clone().requires_grad_(),))
    xz = x.clone()
    xz[xz.abs() < 0.5] = 0.0
    dense = model(xz, graph)
    sparse = model(sparse_features(xz.numpy(), dtype=torch.float64), graph)
    torch.testing.assert_close(sparse, dense)
    g1 = torch.autograd.grad(F.cross_entropy(dense, y), list(model.parameters()))
    g2 = torch.autograd.grad(F.cross_entropy(sparse, y), list(model.parameters()))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = F.cross_entropy(model(x, graph), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_sage_without_its_operator_says_so():
    x, _, _, _ = _toy()
    with pytest.raises(ValueError, match="operator 'mean' needs graph.mean"):
        SAGE(6, 8, 3)(x.float(), ModelGraph())


def test_operator_blocks_of_a_permuted_block():
    """A block's rows and columns are positions of other orders: the identity is 1 where
    a row's node is a column's node; the mean's entries are 1 / the whole row's degree."""
    out_ids = np.array([5, 2, 9, 7])
    in_ids = np.array([7, 1, 5, 8, 3])
    want = np.zeros((4, 5))
    want[0, 2] = want[3, 0] = 1.0
    np.testing.assert_array_equal(identity_block(out_ids, in_ids).toarray(), want)
    assert identity_block(out_ids, np.array([], np.int64)).shape == (4, 0)
    pattern = sp.csr_matrix(np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1]], dtype=np.int8))
    got = mean_block_values(pattern, np.array([4, 0, 3])).toarray()
    np.testing.assert_allclose(got, [[0.25, 0, 0.25], [0, 0, 0], [1 / 3, 1 / 3, 1 / 3]])
    self_block = operator_block("self", pattern, np.ones(3), np.ones(3),
                                np.array([4, 1, 2, 99]), np.array([1, 2, 4, 98]))
    np.testing.assert_array_equal(self_block.toarray(), [[0, 0, 1], [1, 0, 0], [0, 1, 0]])
    with pytest.raises(ValueError, match="unknown graph operator 'max'"):
        operator_block("max", pattern, np.ones(3), np.ones(3))


def test_the_registry_names_every_model_and_config_reads_it():
    """A model is its module's SPEC plus its registry line: the config's choices, --model's,
    and the references by name all come from the registry."""
    reg = default_registry()
    assert reg.names() == ["gcn", "gt", "gps", "mlp", "sage", "hgt"]
    assert MODELS["sage"] is SAGE and MODELS["mlp"] is MLP
    assert reg.get("sage").operators == ("mean", "self") and reg.get("sage").planned_as == "gcn"
    assert parameter_lists(("mean", "self")) == ["layers", "self_layers"]
    assert [n for n, _ in SAGE(3, 4, 2).named_parameters()] == [
        "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
        "self_layers.0.weight", "self_layers.1.weight"]
    assert load_config(None, {"model.name": "sage"}).model.name == "sage"
    with pytest.raises(ConfigError, match="'model.name': 'foo' is not one of gcn, gt, gps, "
                                          "mlp, sage, hgt"):
        load_config(None, {}, ["--model.name=foo"])
    with pytest.raises(ConfigError, match=r"and 0 for sage \(super nodes join attention: gt, "
                                          r"gps\)"):
        load_config(None, {}, ["--model.name=sage", "--model.super_nodes=2"])
    with pytest.raises(ConfigError, match="2 would be ignored: mlp has no attention"):
        load_config(None, {}, ["--model.name=mlp", "--parallel.head_parallel=2"])
    with pytest.raises(ValueError, match="operators"):
        ModelSpec("bad", "", SAGE, "grid3d", ("max",))
    with pytest.raises(KeyError, match="unknown model 'x'"):
        reg.get("x")
