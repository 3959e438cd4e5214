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
    assert across > 3 * inside  # measured: 225 GB/s for a node's 4 GPUs, 66.6 across nodes
    assert inside == pytest.approx(3 * 10e-6 + (64 << 20) / 225e9, rel=1e-6)
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
    assert "at most 34.50 GiB" in out  # 0.9 of its GPUs' 40 GiB less 1.5: the limit
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
        15 * 25e-6 + (1 << 20) / 40e9)  # untouched: the description's 16 contiguous GCDs
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
                       and o["memory_bytes"] < r["memory_bytes"] for o in rows)
    assert "* Pareto" in capsys.readouterr().out


def test_pareto_frontier_keeps_what_nothing_beats_on_both():
    pts = [(3.0, 1.0), (1.0, 5.0), (2.0, 2.0), (2.5, 3.0), (1.0, 6.0), (4.0, 0.5), (2.0, 2.0)]
    got = frontier(pts, lambda p: p[0], lambda p: p[1])
    assert [pts[i] for i in got] == [(1.0, 5.0), (2.0, 2.0), (3.0, 1.0), (4.0, 0.5)]
    assert got[1] == 2 and frontier([], lambda p: p, lambda p: p) == []


@pytest.mark.parametrize("machine,gpus", [("perlmutter", 4), ("frontier", 8)])
@pytest.mark.parametrize("p", [8, 64, 512, 2048])
def test_placement_of_every_axis_of_a_grid(machine, gpus, p):
    """Which groups cross nodes, their stride and how many share a node's NICs, for several
    grids and axis orders: the innermost axis's groups are consecutive ranks (inside a node
    while they fit), an outer axis's are strided by the inner extents, and a group whose
    stride reaches a node's GPUs has one member a node."""
    from plexgt.distributed.grid import ORDERS, factorizations

    topo = load_machine(machine).topology
    for grid in factorizations(p)[:: max(1, len(factorizations(p)) // 12)]:
        for order in ORDERS:
            g = grid.with_order(order)
            for axis in "xyz":
                size, stride = g.dim(axis), g.stride(axis)
                members = g.axis_members(0, axis)
                assert [b - a for a, b in zip(members, members[1:])] == [stride] * (size - 1)
                gp = topo.group(size, stride)
                nodes = {m // gpus for m in members}
                assert gp.nodes == len(nodes), (g, axis)
                assert gp.crosses_nodes == (len(nodes) > 1)
                if size > 1 and stride >= gpus:
                    assert gp.per_node == 1
                if axis == order[0] and size <= gpus and gpus % size == 0:
                    assert not gp.crosses_nodes


def test_strided_groups_cost_more_than_contiguous_ones_and_the_order_is_priced():
    """Perlmutter: a group of 4 one node's NVLink island (225 GB/s measured) against 4 GPUs
    on 4 nodes sharing each node's NICs with 3 more groups (16.6 GB/s); the 3D model prices a
    grid's step by its axis order, and Y innermost (Plexus's) beats X innermost for a grid
    whose Y all-reduces dominate."""
    from plexgt.distributed.grid import Grid3D
    from plexgt.plan.plexus_cost import estimate, reorder

    topo = load_machine("perlmutter").topology
    assert topo.group(4, 1).bytes_per_s == pytest.approx(225e9)
    assert topo.group(4, 4).bytes_per_s == pytest.approx(16.65e9)
    lat_ring, lat_small = topo.latency("all_gather", 64, 4), topo.latency("all_reduce", 64, 4)
    assert lat_small < lat_ring * 2  # the all-reduce across nodes takes NCCL's tree
    coef = Coefficients.from_profile(load_machine("perlmutter").profile(64))
    assert coef.topology is not None
    est = estimate(Grid3D(4, 4, 4), 10_000_000, 200_000_000, [128, 128, 128, 40], 4, coef)
    times = {o: reorder(est, o, coef).comm_s for o in ("yxz", "xyz", "zyx")}
    assert len(set(times.values())) > 1  # placement is priced
    again = estimate(Grid3D(4, 4, 4, "zyx"), 10_000_000, 200_000_000, [128, 128, 128, 40], 4,
                     coef)
    assert again.comm_s == pytest.approx(times["zyx"])  # repricing = pricing that order
    assert again.compute_s == est.compute_s and again.memory_bytes == est.memory_bytes


def test_a_placement_rule_needs_its_source(tmp_path):
    good = (MACHINES_DIR / "perlmutter.toml").read_text()
    p = tmp_path / "m.toml"
    p.write_text(good.replace('source = "Plexus', 'sauce = "Plexus', 1))
    with pytest.raises(MachineError, match=r"placement.rules\[0\] needs a source"):
        load_machine(p)
    p.write_text(good.replace("gb_per_s = 76", "gb_per_s = -76", 1))
    with pytest.raises(MachineError, match=r"placement.rules\[0\]\.gb_per_s = -76"):
        load_machine(p)
