"""The models ``plexgt train`` knows: the one place a new model is added.

Each model is one module of this package ending in its ``SPEC``
(:class:`~plexgt.models.spec.ModelSpec`); the registry is an object the caller builds and
may extend (``reg.register(...)``), so there is no module-level mutable state.
"""

from __future__ import annotations

from plexgt.models import gcn, gps, gt, hgt, mlp, sage
from plexgt.models.spec import ModelRegistry

MODELS = (
    gcn.SPEC,
    gt.SPEC,
    gps.SPEC,
    mlp.SPEC,
    sage.SPEC,
    hgt.SPEC,
)
"""Every built-in model, in the order ``--help`` lists them."""


def default_registry() -> ModelRegistry:
    """A fresh registry holding every built-in model."""
    reg = ModelRegistry()
    for spec in MODELS:
        reg.register(spec)
    return reg
