"""The plexgt command line in one process."""

import subprocess
import sys
import types

import pytest
import torch.distributed as dist

from plexgt import cli
from plexgt.cli import main
from plexgt.errors import ConfigError, PeerFailed, mark_agreed


def test_info_dry_run_plans_without_mpi(capsys):
    assert main(["info", "--dry-run", "--world-size", "64", "--grid", "4x4x4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("grid 4x4x4: 64 ranks")
    assert len(out) == 65
    assert out[1].startswith("rank    0 (x=0, y=0, z=0)  X=[0, 4, 8, 12] Y=[0, 1, 2, 3]")
    assert "Z=[0, 16, 32, 48]" in out[1]


def test_bad_grid_is_one_line_error_exit_2(capsys):
    assert main(["info", "--dry-run", "--world-size", "8", "--grid", "2x2x1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "gx=2 * gy=2 * gz=1 = 4 ranks, but the world size is 8" in err[0]
    assert main(["info", "--dry-run", "--world-size", "8", "--grid", "2by4"]) == 2
    assert main(["info", "--dry-run", "--grid", "2x2x2"]) == 2


def test_python_dash_m_plexgt_is_the_same_cli():
    r = subprocess.run([sys.executable, "-m", "plexgt", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "info" in r.stdout


@pytest.mark.parametrize("failure", ["this rank's", "a peer's"])
def test_an_agreed_error_ends_the_rank_with_no_process_group_left(monkeypatch, capsys, failure):
    """Every rank of a job that agreed on an error destroys its group before exiting: left to
    the interpreter's exit, gloo's threads sometimes end the rank by std::terminate (a job
    status of 6 or 15 instead of 2)."""
    if dist.is_initialized():
        pytest.skip("this test process already holds a process group")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    def run(args: object) -> int:  # a command failing after its group exists
        if failure == "a peer's":
            raise PeerFailed("rank 1 failed")
        err = ConfigError("grid 2x2x1 does not fit")
        mark_agreed(err, 0)
        raise err

    fake = types.SimpleNamespace(add_arguments=lambda parser: None, run=run)
    monkeypatch.setattr(cli, "_module", lambda name: fake)
    try:
        assert main(["train"]) == 2
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert capsys.readouterr().err.count("error:") == (failure == "this rank's")


def test_prep_starts_without_torch():
    """``plexgt prep`` on 64 ranks must not pay for torch: its command, the format registry
    and every format's module import numpy, scipy, h5py and pyarrow only."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "plexgt", "prep", "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "--format" in r.stdout, r.stderr[-2000:]
    modules = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines()
               if line.startswith("import time:")}
    assert "plexgt.data.formats.registry" in modules
    assert not {m for m in modules if m.split(".")[0] == "torch"}
