"""The attention strategies plexgt knows, by name: the one place a new strategy is added.

Each strategy is one module of this package holding its forward, its exact bytes and its
memory (:class:`~plexgt.parallel.attention.strategy.AttentionStrategy`); the registry is an
object the caller builds and may extend (``reg.register(...)``), so there is no module-level
mutable state.
"""

from __future__ import annotations

from plexgt.parallel.attention.gp_2d import GP_2D
from plexgt.parallel.attention.gp_a2a import GP_A2A
from plexgt.parallel.attention.gp_ag import GP_AG
from plexgt.parallel.attention.gp_ring import GP_RING
from plexgt.parallel.attention.strategy import StrategyRegistry

STRATEGIES = (GP_AG, GP_A2A, GP_RING, GP_2D)
"""Every built-in strategy, in the order plans list them."""


def default_registry() -> StrategyRegistry:
    """A fresh registry holding every built-in strategy ('gp_ag', 'gp_a2a', 'gp_ring', 'gp_2d')."""
    reg = StrategyRegistry()
    for s in STRATEGIES:
        reg.register(s)
    return reg
