"""``plexgt verify`` under mpiexec: rank 0 checks and prints the one summary, or the one error
line and exit 2; the other ranks end quietly."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import h5py
import pytest

from .conftest import mpiexec, prepared_sbm, run_job

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return prepared_sbm(tmp_path_factory.mktemp("verify"), seed=3)


def _verify(d: Path) -> tuple[int, list[str], str]:
    r = run_job([mpiexec(), "-n", "2", sys.executable, "-m", "plexgt", "verify", str(d)],
                timeout=60)
    out = r.stdout + r.stderr
    return r.returncode, [line for line in out.splitlines() if line.strip()], out


def test_verify_under_mpiexec_prints_one_summary(data):
    rc, lines, out = _verify(data)
    assert rc == 0, out
    assert len(lines) == 1 and re.fullmatch(rf"verify: {re.escape(str(data))}: ok \(7 files "
                                            r"checksummed, [0-9.]+s\)", lines[0]), out


@pytest.mark.parametrize("damage", ["edited_labels", "no_manifest"])
def test_a_failed_verify_under_mpiexec_is_one_line_and_exit_2(data, tmp_path, damage):
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    if damage == "edited_labels":  # found by verify's checks
        f = bad / "nodes.h5"
        with h5py.File(f, "r+") as h:
            h["labels_P"][0] = 99
        want = f"{f}: sha256 mismatch"
    else:  # raised while opening the directory
        (bad / "manifest.json").unlink()
        want = f"{bad}: no manifest.json"
    rc, lines, out = _verify(bad)
    assert rc == 2, out
    assert len(lines) == 1 and lines[0].startswith("plexgt verify: error: rank 0: ") \
        and want in lines[0], out
    assert "BAD TERMINATION" not in out and "Traceback" not in out
