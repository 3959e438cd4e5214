"""perf/bench_predict.py's PyG baseline computes plexgt's function: with plexgt's weights
copied in, the torch_geometric stacks it times give the single-process model's logits
(float64), so the benchmark compares the same architecture, not a smaller one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from perf.bench_predict import pyg_model
from plexgt.config import ModelConfig
from plexgt.models.gcn import GCN
from plexgt.models.gps import GPS
from plexgt.models.gt import GraphTransformer
from plexgt.models.layers import ModelGraph

N, F, C, H = 60, 12, 5, 16


def _graph() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    s, d = torch.randint(0, N, (300,), generator=g), torch.randint(0, N, (300,), generator=g)
    loops = torch.arange(N)
    e = torch.unique(torch.stack([torch.cat([s, d, loops]), torch.cat([d, s, loops])]), dim=1)
    return e, torch.randn(N, F, generator=g, dtype=torch.float64)


def _copy_blocks(pm: torch.nn.Module, ref: torch.nn.Module, gps: bool) -> None:
    pm.input.load_state_dict(ref.input.state_dict())
    pm.classifier.load_state_dict(ref.classifier.state_dict())
    for b, r in zip(pm.blocks, ref.blocks):
        for theirs, ours in (("lin_query", "q"), ("lin_key", "k"), ("lin_value", "v"),
                             ("lin_skip", "o")):
            getattr(b.attn, theirs).load_state_dict(getattr(r.attn, ours).state_dict())
        b.ffn1.load_state_dict(r.ffn1.state_dict())
        b.ffn2.load_state_dict(r.ffn2.state_dict())
        b.norm_attn.load_state_dict((r.norm_attn if gps else r.norm1).state_dict())
        b.norm_out.load_state_dict((r.norm_out if gps else r.norm2).state_dict())
        if gps:
            b.norm_local.load_state_dict(r.norm_local.state_dict())
            b.local.lin.weight.copy_(r.local.weight)
            b.local.bias.copy_(r.local.bias)


@pytest.mark.parametrize("name", ["gcn", "gt", "gps"])
def test_pyg_baseline_is_plexgts_model(name):
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    e, x = _graph()
    torch.manual_seed(1)
    kw = {} if name == "gcn" else {"heads": 4}
    ref = {"gcn": GCN, "gt": GraphTransformer, "gps": GPS}[name](F, H, C, num_layers=2,
                                                                **kw).double().eval()
    cfg = SimpleNamespace(model=ModelConfig(name=name, hidden=H, layers=2, heads=4))
    pm = pyg_model(cfg, F, C).double().eval()
    assert sum(p.numel() for p in pm.parameters()) == sum(p.numel() for p in ref.parameters())
    with torch.no_grad():
        if name == "gcn":
            params = dict(ref.named_parameters())
            for i, conv in enumerate(pm.convs):
                conv.lin.weight.copy_(params[f"layers.{i}.weight"])
                conv.bias.copy_(params[f"layers.{i}.bias"])
        else:
            _copy_blocks(pm, ref, name == "gps")
        want = ref(x, ModelGraph.from_edges(e[1], e[0], N))
        got = pm(x, (e,), gcn_norm(e, None, N, add_self_loops=True))
    # plexgt's Â holds float32 values: GCN paths agree to their rounding
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)


def test_options_without_a_baseline_are_refused():
    pytest.importorskip("torch_geometric")
    cfg = SimpleNamespace(model=ModelConfig(name="gt", hidden=H, layers=2, pre_norm=True))
    with pytest.raises(ValueError, match="no PyG baseline"):
        pyg_model(cfg, F, C)
