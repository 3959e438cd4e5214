"""perf/plan_score.py, the planner's one score, and validate_plan's use of it (bench_agp's is
in test_bench_agp.py)."""

from __future__ import annotations

import pytest

from perf import plan_score, validate_plan


def test_the_score_is_the_mean_error_and_the_share_of_choices_within_ten_percent():
    s = plan_score.score([0.1, 0.3, 0.2], [0.0, 0.1, 0.25, None])
    assert s["mape"] == pytest.approx(0.2)
    assert s["within_10pct"] == pytest.approx(2 / 3) and s["scored"] == 3
    assert plan_score.score([0.5], [None])["within_10pct"] is None
    assert plan_score.ape(1.5, 1.0) == pytest.approx(0.5)
    assert plan_score.ape(0.5, 1.0) == pytest.approx(0.5)


def test_a_decision_names_the_fastest_and_how_much_slower_the_pick_measured():
    measured = {"a": 1.2, "b": 1.0, "c": 1.05}
    assert plan_score.decision("b", measured) == {"fastest": "b", "slower": 0.0,
                                                  "within": True}
    c = plan_score.decision("c", measured)
    assert c["fastest"] == "b" and c["slower"] == pytest.approx(0.05) and c["within"]
    a = plan_score.decision("a", measured)
    assert a["slower"] == pytest.approx(0.2) and not a["within"]


def _row(case: str, p: int, label: str, predicted: float, median: float,
         chosen: bool) -> dict:
    return {"case": case, "model": case.split("-")[1], "p": p, "label": label,
            "predicted_s": predicted, "median_s": median, "chosen": chosen,
            "predicted_bytes": 10 << 20, "measured_bytes": [20 << 20]}


def test_validate_plan_scores_its_measurements_with_it():
    rows = [_row("x-gt", 1, "gp_ag", 1.1, 1.0, True),
            _row("x-gt", 2, "gp_ag", 0.7, 0.8, False),
            _row("x-gt", 2, "gp_a2a", 0.6, 0.6, True),
            _row("a-gt", 2, "gp_ag", 0.5, 0.5, True),
            _row("a-gt", 2, "gp_a2a", 0.5, 0.4, False)]
    s = validate_plan.score(rows, {"x-gt": "gp_a2a on 2", "a-gt": "gp_ag on 2"})
    errors = [plan_score.ape(r["predicted_s"], r["median_s"]) for r in rows]
    assert s["mape"] == plan_score.mape(errors)
    assert s["mape_by_p"] == {"1": pytest.approx(0.1), "2": pytest.approx(
        plan_score.mape(errors[1:]))}
    # per (case, p) and over every p of a case, in the order of the cases' names
    assert [(d["case"], d["p"]) for d in s["decisions"]] == [
        ("a-gt", 2), ("a-gt", "any<=4"), ("x-gt", 2), ("x-gt", "any<=4")]
    a2, _, x2, x_any = s["decisions"]
    assert a2["pick"] == "gp_ag" and a2["best"] == "gp_a2a"
    assert a2["slower"] == pytest.approx(0.25) and not a2["within"]
    assert x2["slower"] == 0.0 and x_any["best"] == "gp_a2a on 2"
    assert s["choice_within_10pct"] == pytest.approx(0.5) and s["decisions_scored"] == 4
    # a choice nobody measured (after repricing) is listed and not scored
    rows[4]["chosen"] = rows[3]["chosen"] = False
    s = validate_plan.score(rows, {"x-gt": "gp_a2a on 2", "a-gt": "gp_ag on 2"})
    assert s["decisions"][0]["pick"] == "(not measured)" and s["decisions_scored"] == 3
