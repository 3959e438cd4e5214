"""``plexgt plan`` and ``plexgt profile`` from the command line (one process)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from plexgt.cli import main
from plexgt.data.loader import PreparedGraph
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.synthetic import sbm
from plexgt.plan.agp import SystemModel
from plexgt.plan.plexus_cost import Coefficients


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "sbm"
    g = sbm(num_nodes=300, num_edges=3000, num_classes=4, num_features=16, seed=2)
    prepare(MemorySource(g), PrepOptions(out=path, symmetrize=True, progress=False))
    return path


@pytest.fixture(scope="module")
def profile_json(tmp_path_factory):
    """A real (quick, one-rank) profile made by the command."""
    out = tmp_path_factory.mktemp("prof") / "system.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PLEXGT_NO_MPI": "1"}
    r = subprocess.run([sys.executable, "-m", "plexgt", "profile", "--quick", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("model", ["gt", "gps", "gcn"])
def test_plan_prints_the_choice_train_runs(prepared, tmp_path, capsys, model):
    """One chooser: plan's choice on P ranks is run_plan's (what train --grid auto --strategy
    auto runs), its table is the same search's best of each scale, and it prints the train
    command of its choice, which train's own parser accepts."""
    from plexgt.commands import train as train_cmd
    from plexgt.plan.knobs import load_config
    from plexgt.tasks.task import run_plan

    js = tmp_path / "plan.json"
    rc = main(["plan", "--data", str(prepared), "--model", model, "--world-size", "8",
               "--hidden", "16", "--heads", "4", "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 0
    table = json.loads(js.read_text())
    cfg = load_config(None, None, [f"--data={prepared}", f"--model.name={model}",
                                   "--model.hidden=16", "--model.heads=4"])
    rp = run_plan(cfg, PreparedGraph(prepared), 8)
    assert table["choice"]["label"] == rp.label and table["choice"]["scale"] == 8
    assert f"choice on 8 ranks (what train --grid auto --strategy auto runs): {rp.label}" in out
    assert [r["scale"] for r in table["rows"]] == list(range(1, 9))
    assert sum(r["chosen"] for r in table["rows"]) <= 1 and any(r["frontier"]
                                                                for r in table["rows"])
    nxt = next(ln for ln in out.splitlines() if ln.startswith("next: "))[len("next: "):]
    words = nxt.split()
    assert words[:4] == ["mpiexec", "-n", "8", "plexgt"] and words[4] == "train"
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    args, extra = parser.parse_known_args(words[5:])
    over = [e for e in extra if e.startswith("--") and "=" in e]
    assert len(over) == len(extra)
    ran = load_config(None, {"model.name": args.model, "parallel.grid": args.grid,
                             "parallel.strategy": args.strategy, "data": args.data}, over)
    assert run_plan(ran, PreparedGraph(prepared), 8).label == rp.label


def test_plan_takes_trains_defaults_and_config(prepared, tmp_path, capsys):
    """Plan's model is train's: the config's defaults (hidden 128, not a default of its own),
    a --config TOML and --key=value overrides, refused in train's words."""
    js = tmp_path / "plan.json"
    assert main(["plan", "--data", str(prepared), "--model", "gt", "--world-size", "2",
                 "--json", str(js)]) == 0
    assert json.loads(js.read_text())["config"]["hidden"] == 128
    toml = tmp_path / "run.toml"
    toml.write_text('[model]\nname = "gt"\nhidden = 32\nheads = 2\n')
    assert main(["plan", "--data", str(prepared), "--config", str(toml), "--world-size", "2",
                 "--model.layers=3", "--json", str(js)]) == 0
    got = json.loads(js.read_text())["config"]
    assert (got["name"], got["hidden"], got["heads"], got["layers"]) == ("gt", 32, 2, 3)
    capsys.readouterr()
    assert main(["plan", "--data", str(prepared), "--world-size", "2",
                 "--model.hiden=3"]) == 2
    assert "unknown config key 'model.hiden'" in capsys.readouterr().err


def test_plan_memory_limit_excludes_and_can_leave_nothing(prepared, capsys):
    """Nothing fits: one line with the least memory any configuration needs and the
    smallest world size that fits; exit 1, the search's verdict."""
    rc = main(["plan", "--data", str(prepared), "--model", "gt", "--world-size", "4",
               "--memory-per-rank", "0.000001"])
    out = capsys.readouterr().out
    assert rc == 1
    line = next(ln for ln in out.splitlines() if ln.startswith("no configuration fits"))
    assert "the least any needs is" in line and "GiB per rank" in line
    assert "the smallest world size that fits" in line or "no world size up to" in line


def test_the_smallest_world_size_that_fits_is_the_least_one():
    from plexgt.plan.choose import (
        GraphSizes,
        ModelShape,
        NothingFits,
        choose,
        smallest_fitting_world,
    )

    sizes, shape, coef = GraphSizes(2_000_000, 40_000_000, 128, 40), ModelShape("gcn", 128, 2), \
        Coefficients()
    limit = int(1.2 * 2**30)  # 4 ranks need 2.7 GiB each, 16 ranks 1.22, 64 ranks 0.71
    with pytest.raises(NothingFits) as e:
        choose(sizes, shape, 4, SystemModel(), coef, limit)
    assert e.value.least_memory[0] > limit
    got = smallest_fitting_world(sizes, shape, 4, 256, SystemModel(), coef, limit)
    assert got is not None and got.memory_bytes <= limit and 16 < got.scale < 64
    with pytest.raises(NothingFits):
        choose(sizes, shape, got.scale - 1, SystemModel(), coef, limit)


def test_plan_gcn_ranks_grids(prepared, capsys):
    assert main(["plan", "--data", str(prepared), "--model", "gcn", "--world-size", "8",
                 "--hidden", "32", "--layers", "3"]) == 0
    out = capsys.readouterr().out
    assert "layer widths [16, 32, 32, 4]" in out
    assert out.count("<- fastest") == 1 and out.count("choice on 8 ranks") == 1


def test_profile_file_is_complete_and_feeds_both_planners(prepared, profile_json, capsys):
    prof = json.loads(profile_json.read_text())
    assert prof["format"] == "plexgt-system-profile"
    assert prof["hardware"]["cpu"] and prof["hardware"]["cores"] >= 1
    assert prof["software"]["torch"] and "mpi" in prof["software"]
    assert set(prof["kernels"]) == {"spmm", "sddmm", "gemm", "attention", "recompute",
                                   "elementwise", "copy", "dense_block", "gt_step", "gcn_step"}
    # the ring's block kernel beside the fused one on every square pattern and (h, d')
    square = [r[:3] + r[4:] for r in prof["kernels"]["attention"] if r[4] == r[5]]
    assert [r[:3] + r[4:] for r in prof["kernels"]["recompute"]] == square
    assert all(k in prof["kernel_fits"] for k in (
        "recompute_s_per_edge_head_dim", "recompute_s_per_edge_head",
        "recompute_s_per_row_head_dim"))
    for kind in ("gt_step", "gcn_step"):
        steps = prof["kernels"][kind]
        assert len(steps) == 2 and all(r[-1] > 0 for r in steps)
    assert SystemModel.from_profile(prof).compute_scale != 1.0  # calibrated on the steps
    coef = Coefficients.from_profile(prof)  # the 3D planner's coefficients, calibrated too
    assert coef.compute_scale != 1.0 and coef.host.cores == prof["hardware"]["cores"]
    assert sorted(g for op, g, _, _ in coef.collectives if op == "all_gather") == sorted(
        int(g) for g in prof["collective_fits"]["all_gather"])
    if prof["hardware"]["cores"] > prof["software"]["threads_per_rank"]:
        assert all(v > 0 for v in prof["thread_speedup"].values())
    for model in ("gt", "gcn"):
        assert main(["plan", "--data", str(prepared), "--model", model, "--world-size", "2",
                     "--profile", str(profile_json)]) == 0
    out = capsys.readouterr().out
    assert f"profile {profile_json}" in out
    assert f"node: {prof['hardware']['cores']} CPU cores shared by the ranks" in out


def test_training_config_plans_with_the_profile(prepared, profile_json, tmp_path):
    """parallel.profile feeds --grid auto and --strategy auto; a bad one is a one-line error."""
    from plexgt.errors import ConfigError
    from plexgt.plan.knobs import load_config
    from plexgt.tasks.task import machine_profile, plexus_coefficients_for, run_plan

    pg = PreparedGraph(prepared)
    cfg = load_config(None, None, [f"--data={prepared}", f"--parallel.profile={profile_json}",
                                   "--model.name=gt"])
    prof = json.loads(profile_json.read_text())
    assert plexus_coefficients_for(machine_profile(cfg)) == Coefficients.from_profile(prof)
    assert run_plan(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name="gcn")),
                    pg, 4).grid.size == 4
    assert run_plan(cfg, pg, 2).strategy in ("gp_ag", "gp_a2a", "gp_ring", "gp_2d")
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(ConfigError, match=f"parallel.profile': {bad}: not a plexgt system"):
        load_config(None, None, [f"--parallel.profile={bad}"])
    with pytest.raises(ConfigError, match="parallel.profile': .*missing.json"):
        load_config(None, None, [f"--parallel.profile={tmp_path / 'missing.json'}"])


@pytest.mark.parametrize("argv,msg", [
    (["--world-size", "0"], "--world-size must be positive"),
    (["--heads", "3"], "16 is not divisible by model.heads=3"),
    (["--memory-per-rank", "-1"], "--memory-per-rank must be positive"),
    (["--strategies", "gp_ag,ring"], "unknown 'ring'"),
])
def test_plan_bad_input_is_one_line_exit_2(prepared, capsys, argv, msg):
    base = ["plan", "--data", str(prepared), "--model", "gt", "--world-size", "4",
            "--hidden", "16"]
    if argv[0] in base:
        i = base.index(argv[0])
        base[i + 1] = argv[1]
        argv = []
    assert main(base + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


def test_plan_bad_files_exit_2(prepared, tmp_path, capsys):
    assert main(["plan", "--data", str(tmp_path), "--model", "gt", "--world-size", "2"]) == 2
    assert "no manifest.json" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["plan", "--data", str(prepared), "--model", "gt", "--world-size", "2",
                 "--profile", str(bad)]) == 2
    assert "not JSON" in capsys.readouterr().err
    bad.write_text(json.dumps({"format": "something"}))
    assert main(["plan", "--data", str(prepared), "--model", "gt", "--world-size", "2",
                 "--profile", str(bad)]) == 2
    assert "not a plexgt system profile" in capsys.readouterr().err
    assert main(["profile", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_plan_gps_shows_the_gcn_path_of_its_rows(prepared, tmp_path, capsys):
    js = tmp_path / "plan.json"
    assert main(["plan", "--data", str(prepared), "--model", "gps", "--world-size", "4",
                 "--hidden", "16", "--heads", "4", "--json", str(js)]) == 0
    table = json.loads(js.read_text())
    assert all("gcn_grid" in r for r in table["rows"])
    assert all(r["gcn_grid"] is None for r in table["rows"] if r["scale"] == 1)
    assert table["search"]["at_world_size"]["scale"] == 4 and table["search"]["frontier"]
    assert table["choice"]["grid"] == table["search"]["at_world_size"]["grid"]


@pytest.mark.parametrize("strategy", ["gp_ag", "gp_a2a", "auto"])
def test_gps_grid_auto_takes_the_faster_gcn_path(prepared, strategy):
    """parallel.grid 'auto': the 3D planner's grid, then AGP prices the step with the GCN path
    1D and 3D on it; the faster is taken (an explicit grid is kept as given)."""
    from dataclasses import replace

    from plexgt.distributed.grid import Grid3D
    from plexgt.parallel.attention.registry import default_registry
    from plexgt.plan.agp import Workload, estimate, gcn_grid_for
    from plexgt.plan.knobs import load_config
    from plexgt.tasks.task import run_plan

    pg = PreparedGraph(prepared)
    cfg = load_config(None, None, [f"--data={prepared}", "--model.name=gps",
                                   "--model.hidden=16", f"--parallel.strategy={strategy}"])
    assert run_plan(cfg, pg, 1).layout[1] is None
    sname, grid, _ = run_plan(cfg, pg, 4).layout
    if strategy != "auto":
        assert sname == strategy
    g = gcn_grid_for(4, pg.N, pg.E + (0 if pg.manifest.get("self_loops") else pg.N), 16, 4)
    assert grid in (None, g)
    reg = default_registry()
    names = reg.names() if strategy == "auto" else [strategy]
    w = Workload("gps", pg.N, pg.E, pg.F, pg.C, 16, cfg.model.heads, cfg.model.layers, 2, 4)
    times = {(c, path): estimate(reg.get(c), replace(w, gcn_grid=path), 4,
                                 SystemModel()).time_s
             for c in names for path in (None, g)}
    assert times[sname, grid] == min(times.values())
    cfg = load_config(None, None, [f"--data={prepared}", "--model.name=gps",
                                   "--model.hidden=16", "--parallel.grid=1x2x2",
                                   f"--parallel.strategy={strategy}"])
    assert run_plan(cfg, pg, 4).layout[1] == Grid3D(1, 2, 2)


def test_plan_json_that_cannot_be_written_is_one_line_exit_2(prepared, tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    rc = main(["plan", "--data", str(prepared), "--model", "gt", "--world-size", "2",
               "--hidden", "16", "--json", str(tmp_path / "file" / "plan.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("plexgt plan: error: --json ")


PAPERS = ["--model", "gt", "--nodes", "111059956", "--edges", "1726745828", "--features", "128",
          "--classes", "172", "--hidden", "128", "--heads", "8", "--layers", "3"]


def test_plan_from_sizes_alone_papers100m(tmp_path, capsys):
    """Without a prepared directory: at papers100M's size GP-AG and GP-A2A fit no 80 GB rank
    at 64 ranks (all-gathered K, V; the whole graph), the rings do, and one of them is chosen."""
    js = tmp_path / "plan.json"
    assert main(["plan", *PAPERS, "--world-size", "64", "--memory-per-rank", "80",
                 "--json", str(js)]) == 0
    table = json.loads(js.read_text())
    assert table["choice"]["strategy"] in ("gp_ring", "gp_2d") and table["choice"]["scale"] == 64
    assert "N=111059956" in capsys.readouterr().out
    assert main(["plan", *PAPERS, "--world-size", "64", "--memory-per-rank", "80",
                 "--strategies", "gp_ag,gp_a2a"]) == 1


def test_plan_sizes_and_data_are_exclusive_and_complete(prepared, capsys):
    assert main(["plan", "--data", str(prepared), *PAPERS, "--world-size", "4"]) == 2
    assert "--data and --nodes both give sizes" in capsys.readouterr().err
    assert main(["plan", "--model", "gt", "--nodes", "100", "--edges", "500",
                 "--world-size", "4"]) == 2
    assert "missing --features --classes" in capsys.readouterr().err
    assert main(["plan", *PAPERS, "--world-size", "4", "--head-parallel", "-1"]) == 2
    assert "--attention-block-rows and --super-nodes must be >= 0" in capsys.readouterr().err
    assert main(["plan", *PAPERS, "--world-size", "4", "--super-nodes", "-2"]) == 2
    assert "(got 0, 0, 0, -2)" in capsys.readouterr().err


def test_head_axis_must_tile_the_ranks_and_is_chosen_otherwise():
    from plexgt.errors import ConfigError
    from plexgt.plan.choose import GraphSizes, ModelShape, choose

    sizes, shape = GraphSizes(5000, 80_000, 16, 4), ModelShape("gt", 32, 2, 4)
    coef = Coefficients()
    with pytest.raises(ConfigError, match="head_parallel: 2 does not divide the 3 ranks"):
        choose(sizes, shape, 3, SystemModel(), coef, strategy="gp_2d", head_parallel=2)
    fixed = choose(sizes, shape, 4, SystemModel(), coef, strategy="gp_2d", head_parallel=2)
    assert fixed.plan.layout == ("gp_2d", None, 2) and fixed.plan.scale == 4
    chosen = choose(sizes, shape, 8, SystemModel(), coef, strategy="gp_2d").plan
    assert chosen.strategy == "gp_2d" and 8 % chosen.head_parallel == 0


def test_plan_prices_a_node_embedding_and_a_sparse_input(tmp_path, capsys):
    """--node-embedding D widens the input (a featureless graph plans with --features 0 only
    with it) and prices layer 0's input gradient on the 3D grid; a sparse input's layer-0
    GEMM is priced by its density and drops the input all-gather."""
    from plexgt.distributed.grid import parse_grid
    from plexgt.plan.plexus_cost import Coefficients, estimate

    base = ["plan", "--model", "gcn", "--nodes", "20000", "--edges", "400000", "--classes",
            "8", "--world-size", "4"]
    assert main([*base, "--features", "0"]) == 2
    assert "--features 0 needs --node-embedding" in capsys.readouterr().err
    js = tmp_path / "p.json"
    assert main([*base, "--features", "0", "--node-embedding", "64", "--json", str(js)]) == 0
    assert "layer widths [64, 128, 8]" in capsys.readouterr().out  # train's hidden 128
    grid, dims, coef = parse_grid("1x2x2"), [500, 64, 8], Coefficients()
    plain = estimate(grid, 20000, 400000, dims, 4, coef)
    trained = estimate(grid, 20000, 400000, dims, 4, coef, input_grad=True)
    sparse = estimate(grid, 20000, 400000, dims, 4, coef, input_density=0.01)
    assert trained.bytes_per_rank > plain.bytes_per_rank
    assert sparse.bytes_per_rank < plain.bytes_per_rank and sparse.compute_s < plain.compute_s


@pytest.mark.parametrize("grid", ["2x3x1", "1x2x4", "3x1x3", "5x1x1"])
def test_every_rank_of_a_grid_prices_the_same_so_one_stands_for_all(grid):
    """The 3D estimate prices one rank: blocks are padded to equal shapes, so every rank's
    bytes, calls, compute and memory are the same (N, widths and nnz chosen uneven)."""
    from plexgt.distributed.grid import parse_grid
    from plexgt.plan.plexus_cost import Coefficients, rank_cost

    g = parse_grid(grid)
    for kw in ({}, {"block_rows": 7, "order": "gemm_first"},
               {"input_grad": True}, {"input_density": 0.03}):
        costs = {rank_cost(g, r, 1003, 17011, [37, 19, 5], 4, Coefficients(), **kw)
                 for r in range(g.size)}
        assert len(costs) == 1, (grid, kw)


@pytest.mark.parametrize("n,nnz,dims", [(50_000, 2_000_000, [500, 64, 8]),
                                        (2_000_000, 40_000_000, [128, 128, 128, 40])])
def test_gcn_search_covers_every_scale_and_matches_full_enumeration(n, nnz, dims):
    """Every factorisation of every scale 1..P is priced (non powers of two included); the
    two-stage search finds the configuration full enumeration finds, and its frontier holds
    the chosen one; a memory limit drops the scales whose ranks cannot hold their share."""
    from plexgt.distributed.grid import factorizations
    from plexgt.plan.search import search_gcn

    coef = Coefficients()
    fast = search_gcn(n, nnz, dims, 4, coef, 24)
    full = search_gcn(n, nnz, dims, 4, coef, 24, refine=None)
    assert fast.grids == full.grids == sum(len(factorizations(s)) for s in range(1, 25))
    assert fast.priced < full.priced
    assert [c.scale for c in fast.best_per_scale] == list(range(1, 25))
    assert fast.chosen.label == full.chosen.label and fast.chosen.scale == full.chosen.scale
    assert fast.chosen in fast.frontier
    limit = int(sorted(c.est.memory_bytes for c in full.best_per_scale)[12])
    capped = search_gcn(n, nnz, dims, 4, coef, 24, memory_limit=limit)
    assert all(c.est.memory_bytes <= limit for c in capped.best_per_scale)
    assert 1 not in {c.scale for c in capped.best_per_scale}


SMALL = ["plan", "--model", "gcn", "--nodes", "1000", "--edges", "20000", "--features", "16",
         "--classes", "4", "--world-size", "4"]


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("plexgt plan: error: "), err
    return err[0]


@pytest.mark.parametrize("flag,value,msg", [
    ("--world-size", "1000000", "plan searches at most 8192 ranks"),
    ("--world-size", "10000", "plan searches at most 8192 ranks"),
    ("--layers", "100000", "--world-size 4 x --layers 100000 = 400000"),
    ("--ring-chunks", "1000", "--ring-chunks 1000: plan prices at most 16 pieces"),
    ("--memory-per-rank", "inf", "--memory-per-rank must be positive and finite"),
    ("--memory-per-rank", "nan", "--memory-per-rank must be positive and finite"),
    ("--edges", "0", "a graph with no edges"),
    ("--edges", "1000001", "E > N² = 1000000"),
    ("--nodes", "0", "a graph needs nodes"),
    ("--classes", "0", "the task has no class"),
    ("--features", "-3", "--features must be >= 0"),
    ("--nodes", str(2**63), "must fit int64 indices"),
    ("--head-parallel", "2", "'parallel.head_parallel': 2 would be ignored: gcn has no "
                             "attention"),
])
def test_plan_refuses_what_it_cannot_price_in_one_line(capsys, flag, value, msg):
    """Sizes the search cannot price in seconds (10⁶ ranks ran past two minutes), numbers no
    run has and graphs none can be are one line, exit 2, before any pricing."""
    argv = list(SMALL)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    assert msg in _one_line_error(capsys, argv)


def test_plan_at_the_largest_world_size_still_plans(capsys):
    """The bound is a bound, not a ban: 8192 ranks (all of Perlmutter's GPUs and more) plan;
    one strategy of one layer keeps the test quick (about a second of search)."""
    from plexgt.commands.plan import MAX_WORLD_SIZE

    assert main(["plan", "--model", "gt", "--nodes", "111059956", "--edges", "1615685872",
                 "--features", "128", "--classes", "172", "--hidden", "128", "--heads", "8",
                 "--layers", "1", "--strategies", "gp_ring", "--machine", "perlmutter",
                 "--world-size", str(MAX_WORLD_SIZE)]) == 0
    out = capsys.readouterr().out
    assert f"search over every scale 1..{MAX_WORLD_SIZE}" in out
    assert f"on {MAX_WORLD_SIZE} ranks (what train" in out


def test_a_prepared_graph_with_no_edges_is_refused(prepared, tmp_path, capsys):
    import shutil

    copy = tmp_path / "sbm"
    shutil.copytree(prepared, copy)
    man = json.loads((copy / "manifest.json").read_text())
    man["E"] = 0
    (copy / "manifest.json").write_text(json.dumps(man))
    err = _one_line_error(capsys, ["plan", "--data", str(copy), "--model", "gcn",
                                   "--world-size", "2"])
    assert str(copy) in err and "a graph with no edges" in err


@pytest.mark.parametrize("value", ["1e400", "inf", "nan"])
def test_a_machine_description_with_an_infinite_number_is_refused(tmp_path, capsys, value):
    from plexgt.plan.machine import MACHINES_DIR

    text = (MACHINES_DIR / "perlmutter.toml").read_text()
    bad = tmp_path / "m.toml"
    bad.write_text(text.replace("latency_us = ", f"latency_us = {value} # ", 1))
    err = _one_line_error(capsys, [*SMALL, "--machine", str(bad)])
    assert str(bad) in err and "latency_us" in err and ("must be finite" in err or
                                                         "must be a positive number" in err)


def _machine_profile() -> dict:
    from plexgt.plan.machine import load_machine
    from plexgt.plan.profile import FORMAT, VERSION

    return {"format": FORMAT, "version": VERSION, **load_machine("perlmutter").profile(4)}


@pytest.mark.parametrize("where,text", [
    ("collective_fits.all_gather.2.latency_s", "1e400"),
    ("kernel_fits.spmm_s_per_nnz_col", "NaN"),
    ("kernel_fits.gemm_s_per_fma", "-1e-12"),
    ("plexus.latency_s", "Infinity"),
])
def test_a_profile_with_an_impossible_number_is_refused(tmp_path, capsys, where, text):
    prof = _machine_profile()
    node = prof
    *path, last = where.split(".")
    for k in path:
        node = node[k]
    node[last] = "@@"
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps(prof).replace('"@@"', text))
    assert main([*SMALL, "--profile", str(bad)]) == 2  # the same profile unchanged plans:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and where.split(".")[-1] in err[0]
    node[last] = 1e-6
    bad.write_text(json.dumps(prof))
    assert main([*SMALL, "--profile", str(bad)]) == 0


def test_a_binary_profile_is_one_line_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "system.json"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary")
    err = _one_line_error(capsys, [*SMALL, "--profile", str(bad)])
    assert str(bad) in err and "not a text file" in err


def test_plan_head_axis_without_gp_2d_is_refused(capsys):
    err = _one_line_error(capsys, ["plan", *PAPERS, "--world-size", "4", "--head-parallel",
                                   "2", "--strategies", "gp_ring,gp_ag"])
    assert "--strategies gp_ring,gp_ag has no head axis" in err


def test_the_axis_order_is_a_config_key_the_plan_carries(prepared):
    """parallel.axis_order sets the grid's rank order (the plan's where 'auto': on a CPU node
    without a placement model, Y innermost); a bad one is train's one line."""
    from plexgt.errors import ConfigError
    from plexgt.plan.knobs import load_config
    from plexgt.tasks.task import run_plan

    pg = PreparedGraph(prepared)
    base = [f"--data={prepared}", "--model.name=gcn"]
    assert run_plan(load_config(None, None, base), pg, 4).grid.order == "yxz"
    got = run_plan(load_config(None, None, [*base, "--parallel.axis_order=zxy"]), pg, 4).grid
    assert got.order == "zxy"
    fixed = load_config(None, None, [*base, "--parallel.grid=2x2x1",
                                     "--parallel.axis_order=xyz"])
    assert str(run_plan(fixed, pg, 4).grid) == "2x2x1:xyz"
    assert str(run_plan(load_config(None, None, [*base, "--parallel.grid=2x1x2:zyx"]),
                        pg, 4).grid) == "2x1x2:zyx"
    with pytest.raises(ConfigError, match="'parallel.axis_order': 'xxy' must be 'auto'"):
        load_config(None, None, [*base, "--parallel.axis_order=xxy"])


def test_a_machine_plan_searches_the_axis_order_and_prints_the_split(tmp_path, capsys):
    """On a machine description the search prices every rank order: its choice is at least
    as fast as the default order's, and plan prints where the time goes, axis by axis."""
    from plexgt.plan.choose import GraphSizes, ModelShape, choose
    from plexgt.plan.machine import load_machine

    prof = load_machine("perlmutter").profile(256)
    coef, sysm = Coefficients.from_profile(prof), SystemModel.from_profile(prof)
    sizes = GraphSizes(111_059_956, 1_837_805_784, 128, 172)
    free = choose(sizes, ModelShape("gcn", 128, 3, esize=2), 256, sysm, coef).plan
    yxz = choose(sizes, ModelShape("gcn", 128, 3, esize=2, axis_order="yxz"), 256, sysm,
                 coef).plan
    assert free.time_s <= yxz.time_s and yxz.grid.order == "yxz"
    assert free.split[0][0].startswith("compute") and sum(t for _, t in free.split) == \
        pytest.approx(free.time_s)
    js = tmp_path / "p.json"
    assert main(["plan", "--model", "gcn", "--nodes", "111059956", "--edges", "1837805784",
                 "--features", "128", "--classes", "172", "--layers", "3", "--dtype",
                 "bfloat16", "--world-size", "256", "--machine", "perlmutter", "--json",
                 str(js)]) == 0
    out = capsys.readouterr().out
    assert "where the step's predicted time goes:" in out and "stride" in out
    assert json.loads(js.read_text())["choice"]["label"] == free.label


def test_plan_prices_the_model_options_and_train_runs_them(prepared, capsys):
    """gcn's options reach the 3D cost model (a norm's statistics, a residual's path, the
    input and output Linears, jumping knowledge's hops: more bytes and memory than the plain
    model at the same width and depth), gt's reach AGP's (BatchNorm's statistics, the
    parameters of the final norm and the wider classifier), and plan's next: command passes
    them on to train."""
    from plexgt.distributed.grid import parse_grid
    from plexgt.models.gcn import GCNArch, gcn_ops, op_widths
    from plexgt.parallel.attention.registry import default_registry
    from plexgt.parallel.norms import batch_norm_comm
    from plexgt.plan.agp import Workload, memory_of, step_ops
    from plexgt.plan.plexus_cost import rank_cost

    grid, n, e, coef = parse_grid("2x2x2"), 20_000, 400_000, Coefficients()
    plain = gcn_ops(100, 64, 8, 4)
    base = rank_cost(grid, 0, n, e, op_widths(plain), 4, coef, ops=plain)
    for arch in (GCNArch(norm="layer"), GCNArch(norm="batch"), GCNArch(residual="linear"),
                 GCNArch(residual="identity", pre_norm=True, norm="layer"),
                 GCNArch(input_proj=True, head=True, jk="cat")):
        ops = gcn_ops(100, 64, 8, 4, arch)
        rc = rank_cost(grid, 0, n, e, op_widths(ops), 4, coef, ops=ops, norm=arch.norm)
        assert rc.nbytes > base.nbytes and rc.mem > base.mem and rc.calls > base.calls, arch
    gt = Workload("gt", n, e, 100, 8, 64, 4, layers=3)
    bn = dataclasses.replace(gt, norm="batch", pre_norm=True, jk="cat")
    strat = default_registry().get("gp_ag")
    extra = [o for _, o in step_ops(strat, bn, 4)]
    assert len(extra) - len(step_ops(strat, gt, 4)) == 7 * len(batch_norm_comm(64, 4, 4))
    assert bn.num_params - gt.num_params == 2 * 64 * 8 + 2 * 3 * 64  # classifier, final norm
    assert memory_of(strat, bn, 4)["dense_activations"] > memory_of(strat, gt, 4)[
        "dense_activations"]
    rc = main(["plan", "--data", str(prepared), "--model", "gcn", "--world-size", "4",
               "--hidden", "16", "--model.norm=batch", "--model.head=true",
               "--model.jk=max", "--model.pre_norm=true"])
    out = capsys.readouterr().out
    assert rc == 0
    nxt = next(ln for ln in out.splitlines() if ln.startswith("next: "))
    for flag in ("--model.norm=batch", "--model.head=true", "--model.jk=max",
                 "--model.pre_norm=true"):
        assert flag in nxt.split()
