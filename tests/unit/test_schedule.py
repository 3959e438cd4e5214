"""The learning-rate schedule and what a run says at its end."""

from __future__ import annotations

import math

import pytest

from plexgt.commands.train import final_line
from plexgt.config import TrainConfig, notes
from plexgt.errors import ConfigError
from plexgt.plan.knobs import load_config
from plexgt.training.loop import lr_at


def _rates(*overrides: str, epochs: int = 200) -> list[float]:
    cfg = load_config(None, {"epochs": epochs}, list(overrides))
    return [lr_at(cfg, e) for e in range(epochs)]


def test_a_small_lr_is_never_raised_to_the_default_min_lr():
    """lr 3e-5 (below the default min_lr 1e-4): the cosine from lr 'down' to min_lr climbed
    to 1e-4, 3.3x the rate asked for; now it warms up to lr and stays there."""
    rates = _rates("--optim.lr=3e-5")
    assert max(rates) == pytest.approx(3e-5, rel=1e-12)
    assert rates[:10] == sorted(rates[:10])  # the warm-up, from lr/10
    assert rates[0] == pytest.approx(3e-6)
    assert all(r == pytest.approx(3e-5, rel=1e-12) for r in rates[10:])


def test_the_cosine_decays_from_lr_to_min_lr_and_the_default_is_unchanged():
    rates = _rates("--optim.lr=3e-5", "--optim.min_lr=1e-6")
    assert max(rates) == pytest.approx(3e-5) and rates[-1] == pytest.approx(1e-6)
    assert all(a >= b for a, b in zip(rates[10:], rates[11:]))
    # the defaults (lr 0.01, min_lr 1e-4, warm-up 10) give the schedule they always gave
    d = _rates()
    for e in (0, 5, 10, 50, 199):
        old = (0.01 * (0.1 + 0.9 * e / 10) if e < 10 else
               1e-4 + 0.5 * (0.01 - 1e-4) * (1 + math.cos(math.pi * min(1.0, (e - 10) / 189))))
        assert d[e] == pytest.approx(old, rel=1e-12), e


def test_a_constant_schedule_is_lr_at_every_epoch():
    assert set(_rates("--optim.lr=0.003", "--optim.schedule=constant", epochs=30)) == {0.003}
    with pytest.raises(ConfigError, match="config key 'optim.schedule': 'step' is not one of "
                                          "cosine, constant"):
        load_config(None, {}, ["--optim.schedule=step"])


def test_the_schedule_key_leaves_older_configurations_hashes_alone():
    """Checkpoints record the configuration's hash and refuse a resume under another: the
    new key at its old behaviour ('cosine') must not change the hash of any older
    configuration (these are the hashes before the key existed)."""
    assert TrainConfig().hash() == "01856008f94684f1"
    cfg = load_config(None, {}, ["--model.name=gt", "--optim.lr=0.003"])
    assert cfg.hash() == "e592644d805e3980"
    assert load_config(None, {}, ["--optim.schedule=constant"]).hash() != TrainConfig().hash()


def test_a_min_lr_set_above_lr_is_one_note():
    cfg = load_config(None, {}, ["--optim.lr=3e-5", "--optim.min_lr=1e-3"])
    assert notes(cfg) == ["optim.min_lr=0.001 is above optim.lr=3e-05; the schedule never "
                          "raises the rate above lr, so it stays at lr after the warm-up "
                          "(no decay)"]
    assert notes(load_config(None, {}, ["--optim.lr=3e-5"])) == []  # the default's cap
    assert notes(load_config(None, {}, ["--optim.lr=3e-5", "--optim.min_lr=1e-3",
                                        "--optim.schedule=constant"])) == []


def _summary(**kw):
    base = {"stopped": "", "start_epoch": 0, "last_epoch": 20, "best_epoch": 18,
            "metric": "acc", "best_valid": 0.8, "test_at_best": 0.75, "checkpoint": ""}
    return {**base, **kw}


def test_the_last_line_names_only_what_was_written():
    assert final_line(_summary()) == ("plexgt train: finished after epoch 20; best validation "
                                      "epoch 18: valid_acc=0.8000 test_acc=0.7500")
    assert final_line(_summary(checkpoint="ck/epoch_000020")).endswith(
        "; checkpoint ck/epoch_000020 written")
    line = final_line(_summary(stopped="signal 15", last_epoch=7, best_epoch=-1,
                               best_valid=-1.0, test_at_best=0.0))
    # nothing evaluated before the stop: it printed 'best validation epoch -1:
    # valid_acc=-1.0000 test_acc=0.0000' before
    assert line == ("plexgt train: stopped by signal 15 after epoch 7; no best validation "
                    "epoch yet")
    assert final_line(_summary(start_epoch=20)).startswith(
        "plexgt train: finished after epoch 20 (nothing left to train: resumed at the last "
        "epoch); best validation epoch 18")
