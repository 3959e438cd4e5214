"""The training options of ``plexgt train`` on one in-process rank: Adam or AdamW, weight
decay on weights only, gradient clipping, early stopping with the best epoch's state kept
(the multi-rank exactness of clipping is tests/mpi/test_plexus_options.py's and
test_gt_options.py's)."""

import pytest
import torch

from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.synthetic import sbm
from plexgt.distributed.bootstrap import DistContext
from plexgt.distributed.collectives import CommLedger
from plexgt.errors import ConfigError
from plexgt.plan.knobs import load_config
from plexgt.tasks import build_task
from plexgt.training import loop
from plexgt.training.optim import make_optimizer

pytestmark = [pytest.mark.timeout(240), pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    path = tmp_path_factory.mktemp("options") / "prep"
    g = sbm(120, 900, num_features=8, num_classes=3, seed=4)
    prepare(MemorySource(g), PrepOptions(out=path, symmetrize=True, progress=False))
    return path



def _run(prepared, **keys):
    """(task, summary) of ``plexgt train`` with ``keys``: constant learning rate (no warm-up,
    min_lr = lr), so a shorter run follows a longer one's first epochs exactly."""
    cfg = load_config(None, {"data": str(prepared), "progress": False, "model.hidden": 16,
                             "dtype": "float64", "deterministic": True, "optim.lr": 0.05,
                             "optim.min_lr": 0.05, "optim.warmup_epochs": 0,
                             "model.dropout": 0.3, **keys})
    ctx = DistContext(0, 1, 0, 1, "gloo", torch.device("cpu"), "single")
    task = build_task(cfg, ctx, CommLedger())
    return task, loop.train(cfg, ctx, task, log=lambda m: None)


@pytest.mark.parametrize("model", ["gcn", "gt"])
def test_early_stopping_stops_on_patience_and_keeps_the_best_epochs_state(prepared, world,
                                                                         model):
    """With patience 3 the run stops 3 epochs past its best validation epoch B, well before
    its 60 epochs, and ends holding epoch B's state: the state a run stopped after B holds
    (BatchNorm's running statistics included)."""
    keys = {"model.name": model, "model.heads": 2, "model.norm": "batch", "epochs": 60}
    task, summary = _run(prepared, patience=3, **keys)
    best = summary["best_epoch"]
    assert summary["stopped"] == "early stopping (patience 3)"
    assert summary["last_epoch"] == best + 3 < 60
    kept = {k: v.clone() for k, v in task.model.state_dict().items()}
    again, short = _run(prepared, stop_after=best, **keys)
    assert short["last_epoch"] == best
    want = again.model.state_dict()
    assert sorted(kept) == sorted(want) and any("running_mean" in k for k in kept)
    for k, v in want.items():
        assert torch.equal(kept[k], v), k


def test_optimizer_choices_and_weights_only_decay(prepared, world):
    """optim.name picks Adam or AdamW; optim.decay='weights' leaves every vector (biases,
    norm parameters) undecayed and decays every matrix; a run with clipping trains."""
    cfg = load_config(None, {"data": str(prepared), "model.name": "gcn",
                             "model.norm": "layer", "model.residual": "linear",
                             "optim.name": "adam", "optim.decay": "weights",
                             "optim.weight_decay": 0.01})
    ctx = DistContext(0, 1, 0, 1, "gloo", torch.device("cpu"), "single")
    task = build_task(cfg, ctx, CommLedger())
    opt = make_optimizer(cfg, task.model)
    assert type(opt) is torch.optim.Adam
    decayed, kept = opt.param_groups
    assert decayed["weight_decay"] == 0.01 and kept["weight_decay"] == 0.0
    assert {p.ndim for p in decayed["params"]} == {2} and {p.ndim for p in kept["params"]} == {1}
    names = {id(p): n for n, p in task.model.named_parameters()}
    assert any("norms" in names[id(p)] for p in kept["params"])
    _, summary = _run(prepared, **{"model.name": "gcn", "epochs": 4, "optim.clip_norm": 0.1,
                                   "optim.name": "adam", "optim.decay": "weights"})
    assert summary["last_epoch"] == 4


@pytest.mark.parametrize("overrides,message", [
    (["--optim.name=sgd"], "config key 'optim.name': 'sgd' is not one of adamw, adam"),
    (["--optim.decay=biases"], "config key 'optim.decay': 'biases' is not one of all, "
                               "weights"),
    (["--optim.clip_norm=-1"], "config key 'optim.clip_norm': -1.0 must be a finite"),
    (["--patience=-2"], "config key 'patience': -2 must be >= 0"),
])
def test_bad_training_options_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, {}, overrides)


def test_patience_is_not_part_of_the_computation():
    """A run resumed with another patience continues the same computation (as with epochs)."""
    a = load_config(None, {}, ["--patience=5"])
    b = load_config(None, {}, [])
    assert a.hash() == b.hash()
    assert load_config(None, {}, ["--optim.clip_norm=1"]).hash() != b.hash()
