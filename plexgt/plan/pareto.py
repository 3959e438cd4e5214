"""The Pareto frontier of predicted time against memory per rank.

Why a frontier and not only the fastest: a user choosing a layout trades time for memory (a
fitting but fuller layout leaves no room for a larger batch of features, a longer run, or a
neighbour job); the configurations no other one beats on both are the ones worth a look.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def frontier(items: Sequence[T], time: Callable[[T], float], memory: Callable[[T], float]
             ) -> list[int]:
    """Indices of the items no other item beats on both time and memory (ties kept once:
    the first of equal pairs), fastest first."""
    order = sorted(range(len(items)), key=lambda i: (time(items[i]), memory(items[i]), i))
    out: list[int] = []
    best_mem = float("inf")
    for i in order:
        m = memory(items[i])
        if m < best_mem:
            out.append(i)
            best_mem = m
    return out


def chosen_and_frontier(best: Sequence[T], time: Callable[[T], float],
                        memory: Callable[[T], float], scale: Callable[[T], int]
                        ) -> tuple[T | None, list[T]]:
    """Of each scale's best configuration: the fastest (ties: fewer ranks; None when there is
    none) and the frontier, fastest first: what a search reports."""
    chosen = min(best, key=lambda c: (time(c), scale(c)), default=None)
    return chosen, [best[i] for i in frontier(best, time, memory)]
