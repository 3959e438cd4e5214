"""Table 1 of Lin, Madduri & Kandemir in closed form: per-rank elements of GP-AG and GP-A2A.

The strategies' own functions (beside each forward) are exact to the byte; these are the
paper's asymptotic forms, kept to print and test beside them (they agree when p divides
every size).
"""

from __future__ import annotations

from plexgt.parallel.attention.strategy import AttentionProblem


def table1(problem: AttentionProblem, p: int) -> dict[str, dict[str, float]]:
    """The paper's closed forms in elements (for printing next to the exact functions)."""
    n, e, d, h = problem.n, problem.e, problem.d, problem.heads
    return {
        "gp_ag": {"calls": 4, "comm_elems": 4 * n * d, "act_elems": 4 * n * d + e * h / p,
                  "graph": n / p + e / p},
        "gp_a2a": {"calls": 8, "comm_elems": 8 * n * d / p,
                   "act_elems": 4 * n * d / p + e * h / p, "graph": n + e},
    }
