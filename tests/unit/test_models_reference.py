"""Reference models: float64 forward/backward, gradcheck, determinism, training lowers loss."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from plexgt.models import GCN, GPS, MODELS, GraphTransformer, ModelGraph, sparse_features


def _toy(n=40, feats=12, classes=3, seed=0):
    """Two-community graph whose labels follow the communities (learnable from structure)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    src, dst = [], []
    for _ in range(6 * n):
        a, b = rng.integers(0, n, 2)
        if labels[a] == labels[b] or rng.random() < 0.1:
            src += [a, b]
            dst += [b, a]
    x = rng.normal(size=(n, feats)) * 0.5
    x[np.arange(n), labels] += 1.0  # weak feature signal
    graph = ModelGraph.from_edges(np.array(dst), np.array(src), n)
    return torch.tensor(x), graph, torch.tensor(labels)


def _build(name, in_dim, classes, dropout=0.0, seed=0, **kw):
    torch.manual_seed(seed)
    hidden = 8
    if name == "gcn":
        return GCN(in_dim, hidden, classes, num_layers=2, dropout=dropout)
    return MODELS[name](in_dim, hidden, classes, num_layers=2, heads=2, dropout=dropout, **kw)


@pytest.mark.parametrize("name", ["gcn", "gt", "gps"])
def test_forward_backward_float64(name):
    x, graph, y = _toy()
    model = _build(name, x.shape[1], 3, dropout=0.3).double()
    out = model(x, graph)
    assert out.shape == (40, 3) and out.dtype == torch.float64
    F.cross_entropy(out, y).backward()
    for p in model.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()


@pytest.mark.parametrize("name", ["gcn", "gt", "gps"])
def test_gradcheck_tiny_model(name):
    x, graph, _ = _toy(n=10, feats=4)
    model = _build(name, 4, 2).double().eval()
    xg = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: model(t, graph), (xg,))
    # and a weight deep inside the model
    w = dict(model.named_parameters())
    key = "layers.0.weight" if name == "gcn" else "blocks.0.attn.k.weight"
    params = {k: v.detach() for k, v in w.items()}

    def f(weight):
        return torch.func.functional_call(model, {**params, key: weight}, (x, graph))

    assert torch.autograd.gradcheck(f, (params[key].clone().requires_grad_(),))


@pytest.mark.parametrize("name", ["gcn", "gt", "gps"])
def test_deterministic_init_and_float32(name):
    x, graph, _ = _toy()
    a, b = _build(name, x.shape[1], 3, seed=5), _build(name, x.shape[1], 3, seed=5)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    out32 = a.eval()(x.float(), graph)
    out64 = b.double().eval()(x, graph)
    torch.testing.assert_close(out32.double(), out64, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gcn", "gt", "gps"])
def test_sparse_features_equal_dense(name):
    x, graph, y = _toy()
    x[x.abs() < 0.4] = 0.0
    model = _build(name, x.shape[1], 3).double().eval()
    xs = sparse_features(x.numpy(), dtype=torch.float64)
    dense_out = model(x, graph)
    sparse_out = model(xs, graph)
    torch.testing.assert_close(sparse_out, dense_out)
    g1 = torch.autograd.grad(F.cross_entropy(dense_out, y), list(model.parameters()))
    g2 = torch.autograd.grad(F.cross_entropy(sparse_out, y), list(model.parameters()))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


def test_block_rows_model_equals_unblocked():
    x, graph, _ = _toy()
    a = _build("gt", x.shape[1], 3, seed=1).double().eval()
    b = _build("gt", x.shape[1], 3, seed=1, block_rows=7).double().eval()
    torch.testing.assert_close(a(x, graph), b(x, graph))


@pytest.mark.parametrize("name", ["gcn", "gt", "gps"])
def test_training_lowers_loss(name):
    x, graph, y = _toy(seed=3)
    model = _build(name, x.shape[1], 3, dropout=0.1)
    x = x.float()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = F.cross_entropy(model(x, graph), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_model_rejects_missing_operator():
    x, graph, _ = _toy()
    with pytest.raises(ValueError):
        GraphTransformer(x.shape[1], 8, 3, heads=2)(x, ModelGraph(gcn=graph.gcn))
    with pytest.raises(ValueError):
        GPS(x.shape[1], 8, 3, heads=2)(x, ModelGraph(adj=graph.adj))
    with pytest.raises(ValueError, match="divisible"):
        GraphTransformer(x.shape[1], 10, 3, heads=3)
