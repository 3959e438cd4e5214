"""The planner's score: one definition for the two validations that measure it.

bench_agp times AGP's own choice between GP-AG and GP-A2A at p = 1, 2, 4 on the distributed
graph transformer alone (nine graphs of every degree, the two strategies' steps alternated
pair by pair); validate_plan times every configuration the search can run at p = 1-4 (gcn,
gt and gps, every grid, strategy and head axis) through the task builder ``plexgt train``
uses. What they time differs, and each keeps its own decisions and its noise-aware extras;
what they score is one thing: how far the predicted step time is from the measured one (the
mean absolute percentage error), and whether the configuration the planner chose is within
:data:`WITHIN` of the measured fastest.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

WITHIN = 0.10
"""A choice counts as good when its measured step is at most this much slower than the
measured fastest option's (the planner's target: 90% of its choices)."""


def ape(predicted: float, measured: float) -> float:
    """The absolute percentage error of one prediction, as a fraction of the measurement."""
    return abs(predicted - measured) / measured


def mape(errors: Iterable[float]) -> float:
    """The mean of predictions' :func:`ape`."""
    return statistics.fmean(errors)


def decision(pick: Hashable, measured: Mapping[Any, float]) -> dict[str, Any]:
    """A choice among measured options (``measured``: option -> its measured step): the
    fastest option, how much slower the pick measured (``slower``: 0.0 when it is the
    fastest), and whether that is within :data:`WITHIN`."""
    fastest = min(measured, key=measured.get)
    slower = measured[pick] / measured[fastest] - 1
    return {"fastest": fastest, "slower": slower, "within": slower <= WITHIN}


def score(errors: Iterable[float], slowdowns: Iterable[float | None]) -> dict[str, Any]:
    """The planner's score: the ``mape`` of the predictions' step times (their :func:`ape`),
    and over the choices' slowdowns against the measured fastest (:func:`decision`'s
    ``slower``; None for a choice nobody measured, left out) the fraction ``within_10pct``
    within :data:`WITHIN` (None when no choice was scored) and how many were ``scored``."""
    scored = [s for s in slowdowns if s is not None]
    return {"mape": mape(errors),
            "within_10pct": (sum(s <= WITHIN for s in scored) / len(scored) if scored
                             else None),
            "scored": len(scored)}
