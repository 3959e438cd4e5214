"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def world():
    """A one-rank gloo group (the collectives' code paths, without peers), for a module."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
