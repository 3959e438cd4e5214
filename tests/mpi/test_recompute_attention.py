"""Activation checkpointing per block (model.checkpoint = 'block') on gt and gps, every
attention strategy: outputs, gradients, BatchNorm's running statistics and the ledger
against the single-process model and AGP's priced step, which counts every block's forward
collectives twice (test_gt_options.check)."""

from __future__ import annotations

import pytest

from . import test_gt_dist as _gt
from .conftest import ROW_PARTITIONED
from .test_gt_dist import STRATEGIES
from .test_gt_options import _grid, axis_groups, check  # noqa: F401 - a fixture

prepared = _gt.prepared  # the fixtures, module-scoped here too
groups = _gt.groups
pytestmark = pytest.mark.timeout(600)


@ROW_PARTITIONED
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("model", ["gt", "gps"])
def test_checkpointed_attention_models_equal_reference(prepared, groups, model, strategy):
    """A 3-block pre-norm BatchNorm model (gt), or post-LayerNorm with jumping knowledge
    (gps), checkpointed on both sides; test_gt_options.check compares outputs, gradients,
    running statistics and the ledger with AGP's step, which prices the recompute."""
    kw = (dict(norm="batch", pre_norm=True) if model == "gt" else dict(jk="max"))
    check(prepared, groups, strategy, model == "gps", 3, checkpoint=True, **kw)


@ROW_PARTITIONED
def test_checkpointed_gps_3d_path(prepared, groups, axis_groups):  # noqa: F811
    """gps's GCN path on the 3D grid inside a checkpointed block: its redistribution and
    aggregation collectives run again in backward, a pre-norm BatchNorm's statistics too."""
    check(prepared, groups, "gp_ag", True, 2, _grid(), axis_groups, norm="batch",
          pre_norm=True, checkpoint=True)
