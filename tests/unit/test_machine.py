"""Machine descriptions: the shipped TOMLs, their sources, and what the planners make of them."""

from __future__ import annotations

import json
import re

import pytest

from plexgt.cli import main
from plexgt.plan.agp import SystemModel
from plexgt.plan.machine import (
    MACHINES_DIR,
    MachineError,
    load_machine,
    machine_names,
    merge_profile,
)
from plexgt.plan.pareto import frontier
from plexgt.plan.plexus_cost import Coefficients


def test_shipped_descriptions_load_and_say_where_every_number_comes_from():
    assert {"perlmutter", "frontier", "dgx-a100"} <= set(machine_names())
    for name in machine_names():
        m = load_machine(name)
        assert m.gpus_per_node >= 1 and m.intra.bytes_per_s > m.inter.bytes_per_s
        for line in (MACHINES_DIR / f"{name}.toml").read_text().splitlines():
            if re.match(r"^\s*\w+\s*=\s*[0-9.e+-]+\s*(#|$)", line):
                comment = line.split("#", 1)[1].strip() if "#" in line else ""
                assert len(comment) > 8, f"{name}: no source beside {line!r}"


def test_a_description_prices_groups_by_the_link_they_cross():
    m = load_machine("perlmutter")
    sysm = SystemModel.from_profile(m.profile(64))
    inside = sysm.collective_time("all_gather", 4, 64 << 20)
    across = sysm.collective_time("all_gather", 8, 64 << 20)
    assert across > 3 * inside  # 25 GB/s across nodes, 100 GB/s inside one
    assert inside == pytest.approx(3 * 10e-6 + (64 << 20) / 100e9, rel=1e-6)
    k = sysm.kernels
    assert k["attention_s_per_edge_head_dim"] == pytest.approx(2 * 3.46e-12 + 4 * 5.81e-12)
    coef = Coefficients.from_profile(m.profile(4))
    assert coef.s_per_byte == pytest.approx(1 / 100e9)  # a run inside a node
    assert Coefficients.from_profile(m.profile(64)).s_per_byte == pytest.approx(1 / 25e9)


def test_bad_descriptions_name_the_file_and_the_field(tmp_path):
    good = (MACHINES_DIR / "perlmutter.toml").read_text()
    cases = {
        "missing.toml": (good.replace("gpus = 4", ""), "missing node.gpus"),
        "negative.toml": (good.replace("gb_per_s = 25 ", "gb_per_s = -25 "),
                          "links.inter.gb_per_s = -25 must be a positive number"),
        "broken.toml": ("name = [", "not valid TOML"),
        "float.toml": (good.replace("gpus = 4", "gpus = 4.5"),
                       "node.gpus = 4.5 must be a positive integer"),
    }
    for fname, (text, msg) in cases.items():
        p = tmp_path / fname
        p.write_text(text)
        with pytest.raises(MachineError, match=re.escape(msg)) as e:
            load_machine(p)
        assert fname in str(e.value)
    with pytest.raises(MachineError, match="no such description"):
        load_machine("summit")


PAPERS = ["--nodes", "111059956", "--edges", "1726745828", "--features", "128", "--classes",
          "172", "--hidden", "128", "--heads", "8", "--layers", "3"]


def test_plan_with_a_machine(capsys):
    assert main(["plan", "--model", "gt", *PAPERS, "--world-size", "128",
                 "--machine", "perlmutter"]) == 0
    out = capsys.readouterr().out
    assert "machine description perlmutter" in out and "a model projection" in out
    assert "> 34.50 GiB per rank" in out  # 0.9 of its GPUs' 40 GiB less 1.5: the limit
    assert main(["plan", "--model", "gcn", *PAPERS, "--world-size", "64",
                 "--machine", "frontier"]) == 0
    assert main(["plan", "--model", "gt", *PAPERS, "--world-size", "8", "--machine",
                 "perlmutter", "--profile", "nosuch.json"]) == 2
    assert "--profile" in capsys.readouterr().err
    assert main(["plan", "--model", "gt", *PAPERS, "--world-size", "8", "--machine",
                 "summit"]) == 2
    assert "--machine machine 'summit': no such description" in capsys.readouterr().err


def test_a_measured_profile_overrides_any_field_of_a_description():
    base = load_machine("frontier").profile(16)
    measured = {"kernel_fits": {"gemm_s_per_fma": 1e-14},
                "collective_fits": {"all_gather": {"4": {"latency_s": 1e-3, "s_per_byte": 0.0}}}}
    prof = merge_profile(base, measured)
    sysm = SystemModel.from_profile(prof)
    assert sysm.kernels["gemm_s_per_fma"] == 1e-14
    assert sysm.kernels["spmm_s_per_nnz_col"] == base["kernel_fits"]["spmm_s_per_nnz_col"]
    assert sysm.collective_time("all_gather", 4, 1 << 20) == pytest.approx(1e-3)
    assert sysm.collective_time("all_gather", 16, 1 << 20) == pytest.approx(
        15 * 25e-6 + (1 << 20) / 12.5e9)  # untouched: the description's network link
    assert merge_profile(base, None) is base


def test_plan_marks_the_pareto_frontier(tmp_path, capsys):
    js = tmp_path / "p.json"
    assert main(["plan", "--model", "gt", *PAPERS, "--world-size", "512",
                 "--machine", "perlmutter", "--json", str(js)]) == 0
    rows = json.loads(js.read_text())["rows"]
    front = [r for r in rows if r["frontier"]]
    assert front and all(r["fits"] for r in front)
    assert any(r["chosen"] for r in front)  # the fastest fitting one is on it
    for r in front:  # nothing that fits beats a frontier row on both
        assert not any(o["fits"] and o["time_s"] < r["time_s"]
                       and o["memory"]["total"] < r["memory"]["total"] for o in rows)
    assert "Pareto frontier" in capsys.readouterr().out


def test_pareto_frontier_keeps_what_nothing_beats_on_both():
    pts = [(3.0, 1.0), (1.0, 5.0), (2.0, 2.0), (2.5, 3.0), (1.0, 6.0), (4.0, 0.5), (2.0, 2.0)]
    got = frontier(pts, lambda p: p[0], lambda p: p[1])
    assert [pts[i] for i in got] == [(1.0, 5.0), (2.0, 2.0), (3.0, 1.0), (4.0, 0.5)]
    assert got[1] == 2 and frontier([], lambda p: p, lambda p: p) == []
