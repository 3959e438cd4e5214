"""Reference models: float64 forward/backward, gradcheck, determinism, training lowers loss."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from plexgt.models import GCN, GPS, MODELS, GraphTransformer, ModelGraph, sparse_features
from plexgt.models.layers import AttentionParams
from plexgt.ops.attention import dense_attention_reference
from plexgt.ops.csr import CSRGraph


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


def _toy_edges(n=30, feats=6, edge_dim=3, seed=0):
    """_toy's graph without duplicate edges, with random [E, edge_dim] edge features."""
    x, graph, y = _toy(n=n, feats=feats, seed=seed)
    a = graph.adj.to_scipy().tocoo()
    attr = torch.from_numpy(np.random.default_rng(seed).normal(size=(a.nnz, edge_dim)))
    return x, ModelGraph.from_edges(a.row, a.col, n, edge_attr=attr), y, (a.row, a.col, attr)


def _augmented(edges, n, s):
    """The same graph with S super nodes made real nodes N..N+S-1: every real row gains the S
    super columns, every super row has all N + S columns (their edges' features are zero);
    Â keeps them isolated."""
    r, c, attr = edges
    rows = [r, np.repeat(np.arange(n), s), np.repeat(np.arange(n, n + s), n + s)]
    cols = [c, np.tile(np.arange(n, n + s), n), np.tile(np.arange(n + s), s)]
    extra = torch.zeros(n * s + s * (n + s), attr.shape[1], dtype=attr.dtype)
    graph = ModelGraph.from_edges(np.concatenate(rows), np.concatenate(cols), n + s,
                                  edge_attr=torch.cat([attr, extra]))
    plain = ModelGraph.from_edges(r, c, n)
    g = plain.gcn.to_scipy().tocsr()
    gcn = CSRGraph.from_scipy(sp.csr_matrix((g.data, g.indices, np.r_[g.indptr, [g.nnz] * s]),
                                            shape=(n + s, n + s)))
    gcn.values = gcn.values.double()
    return ModelGraph(graph.adj, gcn, edge_attr=graph.edge_attr)


@pytest.mark.parametrize("edge_dim", [0, 3])
@pytest.mark.parametrize("name", ["gt", "gps"])
def test_super_nodes_equal_real_nodes_on_the_augmented_graph(name, edge_dim):
    """S super nodes are exactly S extra nodes joined to every node (and, for gps, outside
    Â), with and without an edge bias (zero on the super nodes' edges): the model's forward
    and every gradient equal running the plain blocks on that graph."""
    x, graph, y, edges = _toy_edges()
    n, s = 30, 3
    model = _build(name, 6, 3, super_nodes=s, edge_dim=edge_dim).double().eval()
    if not edge_dim:
        graph = ModelGraph(graph.adj, graph.gcn)
    out = model(x, graph)
    F.cross_entropy(out, y).backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    aug = _augmented(edges, n, s)
    h = torch.cat([model.input(x), model.super_init])
    for blk in model.blocks:
        h, _ = blk(h, aug)
    ref = model.classifier(h[:n])
    F.cross_entropy(ref, y).backward()
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-12)
    for k, p in model.named_parameters():
        assert torch.allclose(got[k], p.grad, rtol=1e-8, atol=1e-12), k
    assert got["super_init"].abs().sum() > 0
    if edge_dim:
        assert got["blocks.0.attn.edge.weight"].abs().sum() > 0


def test_edge_bias_equals_dense_reference():
    """An attention sublayer with an edge encoder: its scores gain W_b x_e per head, exactly
    as a dense masked softmax with that bias computes them."""
    x, graph, _, _ = _toy_edges()
    torch.manual_seed(0)
    attn = AttentionParams(8, 2, edge_dim=3).double()
    h = torch.randn(30, 8, dtype=torch.float64)
    got = attn(graph.adj, h, h, edge_attr=graph.edge_attr)
    q, k, v = (attn.split(lin(h)) for lin in (attn.q, attn.k, attn.v))
    bias = attn.edge(graph.edge_attr).t()
    want = attn.o(h) + dense_attention_reference(graph.adj, q, k, v, bias=bias).reshape(30, 8)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    plain = attn(graph.adj, h, h, edge_attr=torch.zeros_like(graph.edge_attr))
    assert not torch.allclose(got, plain)
    with pytest.raises(ValueError, match="encodes 3 edge features, but the graph has none"):
        attn(graph.adj, h, h)
    with pytest.raises(ValueError, match="duplicate"):
        ModelGraph.from_edges([0, 0], [1, 1], 2, edge_attr=torch.zeros(2, 3))


def test_super_nodes_gradcheck_and_init():
    x, graph, _ = _toy(n=10, feats=4)
    model = _build("gt", 4, 2, super_nodes=2).double().eval()
    plain = _build("gt", 4, 2)
    for k, v in plain.state_dict().items():  # super nodes do not shift the other weights
        assert torch.equal(v.double(), model.state_dict()[k]), k
    params = {k: v.detach() for k, v in model.named_parameters()}

    def f(z):
        return torch.func.functional_call(model, {**params, "super_init": z}, (x, graph))

    assert torch.autograd.gradcheck(f, (params["super_init"].clone().requires_grad_(),))
    with pytest.raises(ValueError, match="super_nodes"):
        _build("gt", 4, 2, super_nodes=-1)


def test_gcn_options_are_tunedgnns_forms():
    """The GCN's options written out: tunedGNN's MPNNs (pre_linear, res, ln/bn, jk sum; its
    dropout after each layer is plexgt's before the next, none here) is input Linear, then per
    layer ReLU(N(Â h W + b + h W_r + b_r)), then the classifier; pre-norm (DeeperGCN's res+)
    is h + conv(ReLU(N(h))) after a plain first layer, and a final norm and ReLU before the
    classifier; 'identity' residuals add h itself where the widths agree."""
    from plexgt.models.gcn import GCNArch
    from plexgt.models.layers import gcn_conv, jk_combine

    x, graph, _ = _toy(n=30, feats=6)
    ahat = graph.gcn

    def build(arch, layers=3):
        torch.manual_seed(2)
        return GCN(6, 8, 3, num_layers=layers, dropout=0.0, arch=arch).double().eval()

    for norm in ("layer", "batch"):
        m = build(GCNArch(input_proj=True, head=True, residual="linear", norm=norm, jk="sum"))
        m.train()  # BatchNorm on the batch's statistics, as tunedGNN trains
        h, outs = m.input(x), []
        for i, conv in enumerate(m.layers):
            h = F.relu(m.norms[i](gcn_conv(ahat, h, conv) + m.residuals[i](h)))
            outs.append(h)
        torch.testing.assert_close(m(x, graph), m.head(jk_combine(outs, "sum")))
    m = build(GCNArch(head=True, residual="identity", norm="layer", pre_norm=True))
    h = gcn_conv(ahat, x, m.layers[0]) + m.residuals[0](x)  # widths differ: a projection
    for i in (1, 2):
        h = h + gcn_conv(ahat, F.relu(m.norms[i - 1](h)), m.layers[i])
    torch.testing.assert_close(m(x, graph), m.head(F.relu(m.norms[2](h))))
    m = build(GCNArch(), layers=2)  # the plain model: ReLU between the layers, nothing else
    want = gcn_conv(ahat, F.relu(gcn_conv(ahat, x, m.layers[0])), m.layers[1])
    torch.testing.assert_close(m(x, graph), want)
    assert [n for n, _ in m.named_parameters()] == [f"layers.{i}.{k}" for i in range(2)
                                                    for k in ("weight", "bias")]
