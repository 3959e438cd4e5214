"""``model.init``: 'glorot' draws the graph layers as PyG's GCNConv (tunedGNN's GCN); 'torch'
draws what the model always drew."""

from __future__ import annotations

import math

import pytest
import torch

from plexgt.config import read_config
from plexgt.errors import ConfigError
from plexgt.models.gcn import GCN, GCNArch
from plexgt.plan.choose import ModelShape
from plexgt.plan.knobs import load_config

TUNED = dict(head=True, residual="linear", norm="layer")


def _model(init: str) -> GCN:
    torch.manual_seed(0)
    return GCN(300, 256, 7, 3, arch=GCNArch(**TUNED, init=init))


def test_glorot_draws_the_graph_layers_glorot_and_zero_biases():
    m = _model("glorot")
    for lin in m.layers:
        fan_out, fan_in = lin.weight.shape
        bound = math.sqrt(6 / (fan_in + fan_out))
        w = lin.weight.detach()
        assert w.abs().max() <= bound
        # torch's bound 1/sqrt(fan_in) is below Glorot's here: a torch draw never reaches it
        assert w.abs().max() > 1.2 / math.sqrt(fan_in)
        assert torch.equal(lin.bias.detach(), torch.zeros(fan_out))
    # the residual Linears and the classifier stay nn.Linear's (nonzero biases)
    assert all(r.bias.detach().abs().sum() > 0 for r in m.residuals)
    assert m.head.bias.detach().abs().sum() > 0


def test_torch_init_is_what_the_model_always_drew():
    torch.manual_seed(0)
    plain = GCN(300, 256, 7, 3, arch=GCNArch(**TUNED))
    for a, b in zip(_model("torch").state_dict().values(), plain.state_dict().values()):
        assert torch.equal(a, b)
    for lin in plain.layers:
        assert lin.weight.detach().abs().max() <= 1 / math.sqrt(lin.weight.shape[1])


def test_config_key_reaches_the_model_and_is_checked(tmp_path):
    cfg = read_config(None, {"model.init": "glorot", "model.head": True})
    assert ModelShape.of(cfg).gcn_arch.init == "glorot"
    assert read_config().hash() == read_config(None, {"model.init": "torch"}).hash()
    assert read_config().hash() != cfg.hash()
    with pytest.raises(ConfigError, match="'model.init': 'xavier' is not one of torch, glorot"):
        read_config(None, {"model.init": "xavier"})
    with pytest.raises(ConfigError, match="config key 'model.init' is the grid3d models'"):
        load_config(None, {"model.name": "gt", "model.init": "glorot"})
    with pytest.raises(ValueError, match="init 'he' is not torch or glorot"):
        GCNArch(init="he")
