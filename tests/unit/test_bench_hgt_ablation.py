"""perf/bench_hgt_ablation.py's parts that decide what it reports: the tensor tracker counts
the live bytes of the measured region (not the resident set, not what was freed before),
the layouts are the planner's with the keys the benchmark fixes, and the summary's
ratios, frontier, first-stage excess and claims follow from the rows."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from perf import bench_hgt_ablation as bench
from tests.datagen import prepared_sbm

MB = 1_000_000


def test_the_tracker_counts_the_regions_live_tensor_bytes():
    kept = torch.empty(MB // 4)  # alive before the profile and throughout: not counted
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        state = torch.empty(2 * MB // 4)  # 2 MB live when the region starts
        with record_function(bench.MEASURED):
            a = torch.empty(4 * MB // 4)
            b = torch.empty(8 * MB // 4)  # peak: 2 + 4 + 8
            del a, b, kept  # a free of a block allocated before the profile: left out
            c = torch.empty(5 * MB // 4)
            del c
        after = torch.empty(20 * MB // 4)  # outside the region: not its peak
        del state, after
    events, lost, (lo, hi) = bench._allocations(prof)
    assert lo < hi and lost == 0
    inside = [total for t, total in events if lo <= t <= hi]
    before = [total for t, total in events if t < lo]
    assert before[-1] == 2 * MB and max(inside) == 14 * MB and events[-1][1] == 0


def test_a_block_freed_on_another_thread_is_counted_as_never_alive():
    # gloo's worker thread sometimes frees the gradient all-reduce's bucket: the profiler
    # never sees that free, and c10's running total keeps the block for good
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        held = [torch.empty(3 * MB // 4)]
        with record_function(bench.MEASURED):
            t = threading.Thread(target=held.clear)
            t.start()
            t.join()
            x = torch.empty(MB // 4)
            del x
    events, lost, _ = bench._allocations(prof)
    assert lost == 3 * MB and max(total for _, total in events) == MB


def _row(name: str, secs: float, ranks: list[list[int]], pp: int = 1, seqs: int = 8,
         pred_s: float = 1.0, pred: list[int] | None = None) -> dict:
    return {"name": name, "label": name, "pp": pp, "sequences": seqs, "step_s": [secs] * 3,
            "ranks": [[b, 0, 0, p, 0, 0] for b, p in ranks],
            "rss": [[b + 50, p, 0, 0] for b, p in ranks], "predicted_s": pred_s,
            "predicted_stage_bytes": pred or [max(b for b, _ in ranks)] * pp}


def test_the_summary_reads_megagraphs_claims_off_the_rows():
    rows = {"cp": _row("cp", 1.13, [(20, 0), (20, 0)]),
            "even_pp": _row("even_pp", 1.2, [(165, 0), (100, 1), (100, 2), (100, 3)], pp=4,
                            pred=[160, 100, 100, 100]),
            "hetero_pp": _row("hetero_pp", 1.0, [(100, 0), (98, 1), (98, 2), (98, 3)],
                              pp=4),
            "dp": _row("dp", 1.05, [(104, 0), (104, 0)]),
            "dp_weak": _row("dp_weak", 4.0, [(200, 0)], seqs=32)}
    rows["choice"] = dict(rows["hetero_pp"], name="choice")
    s = bench.summarize(rows)
    assert rows["even_pp"]["stage_bytes"] == [165, 100, 100, 100]
    assert rows["even_pp"]["rss_stage_bytes"] == [215, 150, 150, 150]
    assert s["first_stage_excess"]["even_pp"]["measured"] == pytest.approx(0.65)
    assert s["first_stage_excess"]["even_pp"]["predicted"] == pytest.approx(0.6)
    assert s["first_stage_excess"]["hetero_pp"]["measured"] == pytest.approx(100 / 98 - 1)
    c = s["claims"]
    assert c["cp_memory_cut_vs_dp"] == pytest.approx(5.2)
    assert c["cp_time_over_dp"] == pytest.approx(1.13 / 1.05)
    assert c["cp_memory_cut_vs_dp_weak"] == pytest.approx(10)
    assert c["even_pp_dominated_by_cp"] and c["dp_off_frontier"] and c["hetero_pp_fastest"]
    assert s["frontier_measured"] == ["hetero_pp", "cp"]
    assert rows["dp_weak"]["time_per_cp_step_vs_cp"] == pytest.approx(4.0 / 1.13 / 4)
    assert s["pairwise_measured"]["dp/cp"]["memory"] == pytest.approx(5.2)
    assert s["choice_vs_fastest"] == 1.0


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return prepared_sbm(tmp_path_factory.mktemp("abl") / "g", 300, 3000, num_classes=4,
                        num_features=16, seed=1)


@pytest.mark.parametrize("world", [2, 4])
def test_the_layouts_are_the_planners_with_the_fixed_keys(graph, world):
    model = {**bench.QUICK, "model.layers": 8}
    got = bench.layouts(graph, model, bench.PROFILE, world)
    assert set(got) == set(bench.LAYOUTS)
    mesh = {n: (r["dp"], r["pp"], r["cp"]) for n, r in got.items()}
    assert mesh["cp"] == (1, 1, world) and mesh["dp"] == (world, 1, 1)
    assert mesh["even_pp"] == mesh["hetero_pp"] == (1, world, 1)
    assert got["even_pp"]["stages"] == [8 // world] * world
    assert got["even_pp"]["K"] == got["hetero_pp"]["K"]
    # the memory-balanced partition needs no more than the even one
    assert max(got["hetero_pp"]["predicted_stage_bytes"]) <= max(
        got["even_pp"]["predicted_stage_bytes"])
    assert got["dp_weak"]["sequences"] == world * got["dp"]["sequences"]
    assert got["dp_weak"]["over"]["batch.sequences"] == str(world * 4)
    for r in got.values():
        assert r["over"]["parallel.stages"] == ",".join(map(str, r["stages"]))
        assert sum(r["stages"]) == 8 and r["predicted_s"] > 0
    assert got["choice"]["label"] in got["choice"]["frontier"]  # the fastest is on it
