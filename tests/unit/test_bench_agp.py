"""perf/bench_agp.py's scoring and its offline re-evaluation of a stored run (no MPI; the
stored run is a synthetic one written here, no result file under perf/results is read)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from perf import bench_agp

PROFILE = {
    "format": "plexgt-system-profile", "version": 1,
    "hardware": {"cpu": "synthetic", "cores": 2, "host": "test", "device": "cpu", "gpu": None},
    "software": {"backend": "gloo", "threads_per_rank": 1},
    "world_size": 4, "ranks_per_node": 4,
    # linear fits only (no size curves, no raw kernel samples): the model prices from these
    "collective_fits": {
        op: {"2": {"latency_s": lat2, "s_per_byte": spb2},
             "4": {"latency_s": lat4, "s_per_byte": spb4}}
        for op, (lat2, spb2, lat4, spb4) in {
            "all_gather": (3.1e-4, 1.2e-9, 1.5e-3, 2.0e-9),
            "reduce_scatter": (4.4e-4, 1.7e-9, 3.5e-3, 2.8e-9),
            "all_to_all": (2.4e-4, 0.9e-9, 7.5e-4, 1.3e-9),
            "all_reduce": (4.4e-4, 1.0e-9, 3.7e-3, 1.2e-9),
        }.items()},
    "kernel_fits": {"spmm_s_per_nnz_col": 1.3e-10, "sddmm_s_per_nnz_col": 1.3e-10,
                    "gemm_s_per_fma": 2.4e-11, "elementwise_s_per_elem": 4.0e-10,
                    "copy_s_per_elem": 3.3e-10, "dense_s_per_block": 2.8e-4,
                    "dense_s_per_row_d2": 5.3e-10, "dense_s_per_row_d": 1.2e-8,
                    "attention_s_per_row_head_dim": 3.7e-9,
                    "attention_s_per_col_head_dim": 3.2e-9, "attention_s_per_head": 0.0,
                    "attention_s_per_edge_head_dim": 1.2e-10,
                    "attention_s_per_edge_head": 1.3e-8},
    "contention": {"1": 1.0, "2": 1.0, "4": 2.06},
    "loaded": {"2": {"contention": 1.0, "sync_s": 3.3e-4},
               "4": {"contention": 2.06, "sync_s": 2.5e-3}},
}
"""A system profile as ``plexgt profile`` writes it, cut to what the AGP model reads (the
shape of a 2-core CPU machine's)."""

LOAD = [1.0, 1.4, 0.9, 1.6, 1.1, 1.3, 0.95, 1.5, 1.2, 1.05, 1.35, 1.02]
NOISE = [1.011, 0.991, 1.021, 0.981, 1.003, 1.013, 0.993, 1.017, 0.984, 1.006, 1.009, 0.996]
# every value distinct: tied step differences would send scipy's signed-rank test to its
# permutation method (seconds a call) instead of the exact distribution
# graph: n, e, f, c, one rank's step (s), {p: (p's step over one rank's, GP-AG's over GP-A2A's)}
GRAPHS = {
    "syn5": (8000, 47906, 64, 8, 0.07, {2: (1.05, 1.04), 4: (1.7, 1.08)}),
    "syn50": (4000, 197040, 64, 8, 0.055, {2: (0.75, 0.97), 4: (1.6, 1.0)}),
    "cs": (18333, 182121, 128, 15, 0.21, {2: (0.6, 0.96), 4: (1.1, 1.02)}),
}
"""Three graphs measured as bench_agp measures them: one rank once, both strategies at p = 2
and 4 with their steps alternated (a load drifting over the run moves both, GP-AG's steps also
carry a little noise of their own): decided and undecided pairs, hits and misses."""


def _measured() -> list[dict]:
    out = []
    for p in (1, 2, 4):
        for k, (g, (n, e, f, c, t1, by_p)) in enumerate(GRAPHS.items()):
            load = [LOAD[(i + k + p) % len(LOAD)] for i in range(len(LOAD))]
            if p == 1:
                runs = {"gp_ag": [t1 * x for x in load]}
            else:
                share, ag_over_a2a = by_p[p]
                a2a = [t1 * share * x for x in load]
                runs = {"gp_ag": [ag_over_a2a * y * NOISE[(i + k) % len(NOISE)]
                                  for i, y in enumerate(a2a)], "gp_a2a": a2a}
            for s, steps in runs.items():
                out.append({"graph": g, "strategy": s, "p": p, "n": n, "e": e, "f": f, "c": c,
                            "step_s": steps, "t_iter": min(steps),
                            "t_iter_median": statistics.median(steps),
                            "peak_activation_bytes": [n * 4096 // p] * p,
                            "graph_rss_bytes": [e * 48 // p] * p,
                            "sent_bytes_per_step": [0 if p == 1 else n * 256] * p})
    return out


@pytest.fixture(scope="module")
def bench():
    return bench_agp


@pytest.fixture
def stored_run(bench, tmp_path) -> Path:
    """A run stored as bench_agp.py's main() stores one (its strategies alternated step by
    step): the measurements, the analysis and summary of them, and the path of its profile,
    written beside it."""
    prof_path = tmp_path / "bench_agp_system.json"
    prof_path.write_text(json.dumps(PROFILE, indent=2) + "\n")
    measured = _measured()
    an = bench.analyse(measured, json.loads(prof_path.read_text()), paired=True)
    payload = {
        "date": "2026-11-30T00:00:00Z", "hardware": {"cpu": "synthetic", "usable_cores": 2},
        "profile": str(prof_path), "profile_hardware": PROFILE["hardware"],
        "profile_software": PROFILE["software"], "model": bench.MODEL, "steps": len(LOAD),
        "paired_steps": True, "graphs": {g: f"/tmp/plexgt-bench-agp/{g}" for g in GRAPHS},
        "measured": measured, "analysis": an, "summary": bench.summarise(an),
    }
    path = tmp_path / "bench_agp.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def test_choice_is_scored_strictly_and_within_the_noise(bench):
    steps = {("a", 2): [1.0, 1.1, 1.2, 1.0, 1.3, 1.1, 1.2, 1.0, 1.1],
             ("b", 2): [0.98, 1.2, 1.1, 1.3, 1.0, 1.2, 1.1, 1.25, 1.15],
             ("c", 2): [2.0, 2.1, 2.2, 2.0, 2.3, 2.1, 2.2, 2.0, 2.1]}
    cands = {k: min(v) for k, v in steps.items()}
    hit = bench._choice("g", "x", ("b", 2), cands, steps)
    assert hit["hit"] and hit["noise_hit"] and hit["slowdown"] == 0.0
    assert hit["tied_with_fastest"] == [["a", 2]]
    assert hit["runner_up_gap"] == pytest.approx(1.0 / 0.98 - 1)
    tie = bench._choice("g", "x", ("a", 2), cands, steps)
    assert not tie["hit"] and tie["noise_hit"] and tie["p_slower"] >= bench.NOISE_ALPHA
    miss = bench._choice("g", "x", ("c", 2), cands, steps)
    assert not miss["noise_hit"] and miss["slowdown"] == pytest.approx(2.0 / 0.98 - 1)


def test_a_lucky_fastest_step_does_not_decide_the_median_scoring(bench):
    steps = {("one", 1): [1.0, 1.01, 1.02, 0.99, 1.0, 1.01, 1.0],
             ("two", 2): [0.6, 1.1, 1.2, 1.05, 1.15, 1.1, 1.2]}  # noisy, one lucky step
    cands = {k: min(v) for k, v in steps.items()}
    c = bench._choice("g", "x", ("one", 1), cands, steps)
    assert not c["hit"] and c["slowdown"] == pytest.approx(0.99 / 0.6 - 1)
    assert c["hit_by_median"] and c["fastest_by_median"] == ["one", 1]
    assert c["slowdown_by_median"] == 0.0
    c = bench._choice("g", "x", ("two", 2), cands, steps)
    assert c["hit"] and not c["hit_by_median"]
    assert c["slowdown_by_median"] == pytest.approx(1.1 / 1.0 - 1)


def test_alternated_steps_are_compared_pair_by_pair(bench):
    # a load that drifts over the run moves both strategies' steps together; "a" is 3% slower
    # at every step, which the pairs show and pooled samples hide
    load = [1.0, 1.4, 0.9, 1.6, 1.1, 1.3, 0.95, 1.5, 1.2, 1.05, 1.35, 1.0]
    steps = {("a", 2): [1.03 * x for x in load], ("b", 2): list(load), ("c", 1): [5.0] * 12}
    cands = {k: min(v) for k, v in steps.items()}
    pooled = bench._choice("g", "x", ("a", 2), cands, steps)
    assert pooled["noise_hit"] and pooled["tied_with_fastest"] == [["a", 2]]
    paired = bench._choice("g", "x", ("a", 2), cands, steps, paired=True)
    assert not paired["noise_hit"] and paired["p_slower"] < bench.NOISE_ALPHA
    assert paired["tied_with_fastest"] == []
    # across p the launches differ: never paired
    across = bench._choice("g", "x", ("c", 1), cands, steps, paired=True)["p_slower"]
    assert across == pytest.approx(bench._slower_p(steps[("c", 1)], steps[("b", 2)]))
    assert across != pytest.approx(bench._slower_p(steps[("c", 1)], steps[("b", 2)], True))
    # steps that were meant to alternate but do not pair up are an error, not a silent switch
    with pytest.raises(ValueError, match="not alternated"):
        bench._slower_p([1.0, 1.1, 1.2], [1.0, 1.1], paired=True)


def test_strategy_pairs_give_the_paired_ratio_and_whether_it_is_decided(bench):
    load = [1.0, 1.4, 0.9, 1.6, 1.1, 1.3, 0.95, 1.5, 1.2, 1.05, 1.35, 1.0]
    noise = [1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99]

    def m(g: str, s: str, p: int, xs: list) -> dict:
        return {"graph": g, "strategy": s, "p": p, "step_s": xs}

    measured = [m("slow", "gp_ag", 2, [1.1 * x for x in load]), m("slow", "gp_a2a", 2, load),
                m("tie", "gp_ag", 2, [x * y for x, y in zip(load, noise)]),
                m("tie", "gp_a2a", 2, load), m("tie", "gp_ag", 1, load)]
    out = {(r["graph"], r["p"]): r for r in bench.strategy_pairs(measured)}
    assert set(out) == {("slow", 2), ("tie", 2)}
    slow, tie = out[("slow", 2)], out[("tie", 2)]
    assert slow["ag_over_a2a"] == pytest.approx(1.1) and slow["ci95"][0] > 1.0
    assert slow["p_value"] < 0.01 and slow["pairs"] == 12 and slow["decided"]
    assert tie["ci95"][0] < 1.0 < tie["ci95"][1] and tie["p_value"] > 0.05
    assert not tie["decided"]


def test_hit_rate_where_the_measurement_names_the_fastest(bench):
    def choice(hit: bool, tied: list) -> dict:
        return {"decision": "scale_and_strategy", "hit": hit, "noise_hit": True,
                "slowdown": 0.0 if hit else 0.01, "runner_up_gap": 0.2,
                "tied_with_fastest": tied, "hit_by_median": not hit,
                "slowdown_by_median": 0.03 if hit else 0.0}

    rows = [{"p": 1, "strategy": "gp_ag", "ape": 0.1, "ape_median": 0.1}]
    ch = [choice(True, []), choice(False, [["gp_ag", 2]]), choice(True, [["gp_ag", 2]]),
          choice(True, [])]
    for p in (2, 4):
        ch += [{**choice(True, []), "decision": f"strategy_at_p{p}"},
               {**choice(True, []), "decision": "at_p4"}]
    s = bench.summarise({"rows": rows + [{**rows[0], "p": 2}, {**rows[0], "p": 4}],
                         "choices": ch})
    assert s["agp_hit_rate"] == 0.75 and s["ties_noise"] == 2
    assert s["resolved"] == 2 and s["agp_hit_rate_resolved"] == 1.0
    assert s["agp_hit_rate_by_median"] == 0.25 and s["agp_max_slowdown_by_median"] == 0.03


def test_reevaluate_scores_the_stored_run_offline(bench, stored_run, capsys):
    out = bench.reevaluate(stored_run, None)
    s = out["summary"]
    stored = json.loads(stored_run.read_text())
    assert s["decisions"] == len({m["graph"] for m in stored["measured"]})
    assert 0.0 <= s["agp_hit_rate"] <= s["agp_noise_hit_rate"] <= 1.0
    assert s["agp_within_10pct"] >= s["agp_hit_rate"]
    assert 0.0 <= s["agp_hit_rate_by_median"] <= 1.0 and s["agp_max_slowdown_by_median"] >= 0
    # p = 1 is one measurement and one option, whatever strategy name the plan gives it
    distinct = [r for r in out["analysis"]["rows"] if r["p"] > 1 or r["strategy"] == "gp_ag"]
    assert len(distinct) == len(stored["measured"])
    # alternated steps: GP-AG against GP-A2A pair by pair, at every p > 1 of every graph
    pairs = out["analysis"]["strategy_pairs"]
    assert len(pairs) == 2 * s["decisions"]
    assert all(p["ci95"][0] <= p["ag_over_a2a"] <= p["ci95"][1] for p in pairs)
    assert pairs == stored["analysis"]["strategy_pairs"]
    assert "MAPE" in capsys.readouterr().out
