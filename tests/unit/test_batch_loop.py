"""The training loop's path for batch-trained models (hgt): an epoch of several optimizer
steps, each the task's forward/backward then the loop's clipping and optimizer step."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from plexgt.distributed.collectives import CommLedger
from plexgt.plan.knobs import load_config
from plexgt.tasks.task import Task
from plexgt.training.loop import step


def _task(calls: list) -> Task:
    torch.manual_seed(0)
    model = nn.Linear(3, 2, bias=False)
    data = [torch.randn(4, 3, dtype=torch.float32) for _ in range(3)]

    def train_step(epoch: int, i: int) -> torch.Tensor:
        calls.append((epoch, i, model.weight.detach().clone()))
        loss = model(data[i]).pow(2).mean()
        loss.backward()
        return loss.detach()

    return Task(model=model, inputs=torch.zeros(0), loss=lambda o: o, correct=lambda o: {},
                ledger=CommLedger(), grid="dp1xpp1xcp1", strategy="gpipe",
                steps=lambda epoch: 3, train_step=train_step)


@pytest.fixture
def world():
    """A one-rank gloo group (the step's barrier)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_an_epoch_of_a_batch_task_is_its_steps_each_with_an_optimizer_step(world):
    """Three steps an epoch: each sees the weights the previous step's update left (the
    optimizer stepped between them, not once at the end), and the epoch's loss is the mean
    of the three losses computed on those weights."""
    cfg = load_config(None, {"data": "x"}, ["optim.schedule=constant", "optim.lr=0.1",
                                            "optim.weight_decay=0"])
    calls: list = []
    task = _task(calls)
    opt = torch.optim.SGD(task.model.parameters(), lr=0.1)
    ref = nn.Linear(3, 2, bias=False)
    ref.load_state_dict(task.model.state_dict())
    loss, _, _ = step(cfg, task, opt, epoch=0)
    assert [(e, i) for e, i, _ in calls] == [(0, 0), (0, 1), (0, 2)]
    torch.manual_seed(0)
    nn.Linear(3, 2, bias=False)
    data = [torch.randn(4, 3) for _ in range(3)]
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    losses = []
    for i in range(3):
        assert torch.equal(calls[i][2], ref.weight.detach())
        ref_opt.zero_grad()
        lo = ref(data[i]).pow(2).mean()
        lo.backward()
        ref_opt.step()
        losses.append(lo.item())
    assert abs(float(loss) - sum(losses) / 3) < 1e-6
