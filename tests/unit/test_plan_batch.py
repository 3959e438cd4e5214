"""``plexgt plan --model hgt``: the node-sequence search through the one chooser, its view,
the config's fixed layout keys kept, and a memory limit nothing meets."""

from __future__ import annotations

import json

from plexgt.cli import main

COMPUTERS = ["--nodes", "13752", "--edges", "505474", "--features", "767", "--classes", "10"]
MODEL = ["--model", "hgt", "--layers", "16", "--hidden", "64", "--heads", "8",
         "--no-calibrate"]


def test_plan_prices_every_mesh_and_prints_the_frontier_and_the_train_line(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", *COMPUTERS, *MODEL, "--world-size", "4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    got = json.loads(out.read_text())
    c = got["choice"]
    assert c["dp"] * c["pp"] * c["cp"] == 4 and sum(c["stages"]) == 16
    assert len(c["stages"]) == c["pp"]
    assert got["search"]["frontier"] and all(
        r["dp"] * r["pp"] * r["cp"] == 4 for r in got["rows"])
    # the frontier is the rows no other row beats on both time and memory
    for f in got["search"]["frontier"]:
        assert not any(r["time_s"] < f["time_s"] and r["memory_bytes"] < f["memory_bytes"]
                       for r in got["rows"])
    assert f"--parallel.stages={','.join(map(str, c['stages']))}" in text
    assert "time-memory frontier" in text


def test_plan_keeps_what_the_config_fixes(tmp_path, capsys):
    cfg = tmp_path / "run.toml"
    cfg.write_text('[model]\nname = "hgt"\nlayers = 6\nhidden = 32\nheads = 4\n'
                   '[batch]\nsequences = 4\nsize = 64\ntargets = 16\n'
                   '[parallel]\npp = "2"\nstages = "1,5"\nmicro_batches = 2\n')
    out = tmp_path / "plan.json"
    assert main(["plan", *COMPUTERS, "--config", str(cfg), "--world-size", "4",
                 "--no-calibrate", "--json", str(out)]) == 0
    c = json.loads(out.read_text())["choice"]
    assert (c["pp"], c["stages"], c["micro_batches"]) == (2, [1, 5], 2)
    assert c["dp"] * c["cp"] == 2


def test_a_limit_nothing_meets_is_one_line_and_exit_1(capsys):
    assert main(["plan", *COMPUTERS, *MODEL, "--world-size", "2",
                 "--memory-per-rank", "0.000001"]) == 1
    line = [x for x in capsys.readouterr().out.splitlines() if "fits" in x]
    assert line and "GiB per rank" in line[0]
