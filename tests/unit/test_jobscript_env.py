"""What the Frontier and Perlmutter job scripts hand the training ranks: each script is run by
bash as sbatch would run it, with a stand-in ``srun`` that records the environment it was
given and a stand-in ``module`` that records what was loaded (tests/slurm runs the same
scripts under a real Slurm). The settings are OLCF's (PyTorch on Frontier: RCCL network
plugin) and NERSC's lists; they matter only on those machines, so only their presence can
be checked here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "jobscripts"

FRONTIER = {  # OLCF: "strongly recommended by HPE and AMD ... for correctness and performance"
    "HSA_FORCE_FINE_GRAIN_PCIE": "1",
    "FI_CXI_DISABLE_HOST_REGISTER": "1",
    "FI_CXI_DEFAULT_CQ_SIZE": "131072",
    "FI_CXI_RDZV_PROTO": "alt_read",
    "FI_CXI_RDZV_EAGER_SIZE": "0",
    "FI_CXI_RDZV_THRESHOLD": "0",
    "FI_CXI_RDZV_GET_MIN": "0",
    "FI_MR_CACHE_MONITOR": "kdreg2",
    "NCCL_CROSS_NIC": "1",
    "NCCL_NET_GDR_LEVEL": "PHB",
}
PERLMUTTER = {"FI_CXI_DEFAULT_CQ_SIZE": "131072", "FI_CXI_DISABLE_HOST_REGISTER": "1"}


def _run(machine: str, tmp: Path, nodes: int, **extra: str) -> tuple[dict[str, str], list[str]]:
    """(the environment srun was started with, the module commands) of one job script."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    srun = bin_dir / "srun"
    srun.write_text('#!/bin/sh\nenv -0 > "$ENV_DUMP"\necho "$@" > "$ENV_DUMP.args"\n')
    srun.chmod(0o755)
    dump, modules = tmp / f"{machine}-{nodes}.env", tmp / f"{machine}-{nodes}.modules"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp / "home"), "USER": "someone",
        "DATA": str(tmp / "data"), "SCRATCH": str(tmp), "MEMBERWORK": str(tmp),
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_CPUS_PER_TASK": "7",
        "SLURM_JOB_ACCOUNT": "PRJ000", "ENV_DUMP": str(dump),
        "BASH_FUNC_module%%": f'() {{ echo "$*" >> {modules}; }}', **extra,
    }
    r = subprocess.run(["bash", str(JOBS / machine / "train.sbatch")], capture_output=True,
                       text=True, timeout=60, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    got = dict(kv.split("=", 1) for kv in dump.read_text().split("\0") if "=" in kv)
    assert " train " in f" {(tmp / (dump.name + '.args')).read_text()} "
    return got, modules.read_text().splitlines()


def _sbatch_lines(machine: str) -> list[str]:
    return [line.split(None, 1)[1].strip() for line in
            (JOBS / machine / "train.sbatch").read_text().splitlines()
            if line.startswith("#SBATCH")]


@pytest.mark.parametrize("nodes", [1, 4])
def test_frontier_follows_olcf(tmp_path, nodes):
    env, modules = _run("frontier", tmp_path, nodes)
    assert {k: env.get(k) for k in FRONTIER} == FRONTIER
    # the alternative rendezvous protocol needs the allocation's network flag too
    assert "--network=disable_rdzv_get" in _sbatch_lines("frontier")
    # one node: sockets (the plugin does not initialise there, and forcing it stops RCCL);
    # several: the plugin's network, so a job without it stops instead of crawling on TCP
    assert env["NCCL_NET"] == ("Socket" if nodes == 1 else "OFI")
    assert "load rccl-net-plugin" in modules  # OLCF's module, after rocm
    assert modules.index("load rccl-net-plugin") > next(
        i for i, m in enumerate(modules) if "rocm" in m.split())


def test_frontier_takes_an_own_plugin_build_without_the_module(tmp_path):
    plugin = tmp_path / "plugin"
    env, modules = _run("frontier", tmp_path, 2, RCCL_PLUGIN=str(plugin))
    assert env["NCCL_NET_PLUGIN"] == f"{plugin}/librccl-net.so"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(plugin)
    assert "load rccl-net-plugin" not in modules


def test_perlmutter_follows_nersc(tmp_path):
    env, _ = _run("perlmutter", tmp_path, 2)
    assert {k: env.get(k) for k in PERLMUTTER} == PERLMUTTER


@pytest.mark.parametrize("machine", ["frontier", "perlmutter"])
def test_triton_compiles_into_the_nodes_own_storage(tmp_path, machine):
    """Not ~/.triton/cache: Frontier's home is read-only on the compute nodes (gt and gps
    died at their first fused kernel), Perlmutter's is shared by every node."""
    env, _ = _run(machine, tmp_path, 1)
    assert env["TRITON_CACHE_DIR"] == "/tmp/triton-4242"


@pytest.mark.parametrize("machine", ["frontier", "perlmutter"])
def test_consecutive_ranks_share_a_node(tmp_path, machine):
    """The grid's innermost axis is consecutive ranks (its axis order): srun must place them
    on one node, block by block, for that axis to be the node's NVLink / xGMI island."""
    _run(machine, tmp_path, 2)
    args = (tmp_path / f"{machine}-2.env.args").read_text().split()
    assert "--distribution=block:block" in args
