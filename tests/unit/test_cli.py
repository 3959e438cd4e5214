"""The plexgt command line in one process."""

import subprocess
import sys

from plexgt.cli import main


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
