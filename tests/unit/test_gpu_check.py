"""perf/gpu_check.sh, the script a lent GPU runs: its dry run lists every step and creates
nothing; a bad argument is a one-line error."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "perf" / "gpu_check.sh"
STEPS = ["env", "cuda_tests", "prep", "train_gcn", "train_gt", "train_gps", "train_gt_ring",
         "train_gt_extras",
         "dropout", "attention", "profile"]


def test_the_dry_run_lists_every_step_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out)],
                       capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    listed = [line.split()[0] for line in r.stdout.splitlines()[:-1]]
    assert listed == STEPS
    assert "--parallel.backend=nccl --resume" in r.stdout  # training resumes from a checkpoint
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_unknown_argument_is_a_one_line_error():
    r = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "gpu_check.sh: unknown argument '--bogus' (use --out DIR, --dry-run)"]
