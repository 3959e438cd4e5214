"""The generic job script under a real Slurm: srun --mpi=pmi2 training, USR1, requeue, resume."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.synthetic import sbm
from tests.slurm.conftest import daemon_logs

# one xdist worker runs them all (tests/conftest.py's scheduler), so the local Slurm starts once
pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "jobscripts" / "generic" / "train.sbatch"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("slurmdata") / "sbm"
    g = sbm(num_nodes=400, num_edges=4000, num_classes=4, num_features=8, seed=2)
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False))
    return out


def _sbatch(slurm, tmp: Path, data: Path, epochs: int, model: str = "gcn") -> tuple[int, Path]:
    run = tmp / "run"
    env = dict(slurm, DATA=str(data), EPOCHS=str(epochs), RUN_DIR=str(run),
               VENV=str(ROOT / ".venv"), MODEL=model,
               EXTRA="--model.hidden=16 --model.heads=2 --eval_every=1", OMP_NUM_THREADS="1")
    cmd = ["sbatch", "--parsable", "-n", "4", "-o", str(tmp / "job-%j.out"), "--open-mode=append",
           str(SCRIPT)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    job = int(re.match(r"\d+", r.stdout.strip()).group(0)) if r.stdout.strip() else -1
    assert job > 0, r.stderr
    return job, run


FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE")


def _wait_done(slurm, job: int, timeout_s: float) -> str:
    """The job's final state, polled twice a second (sbatch --wait's own polling backs off to
    tens of seconds; a requeued job passes through non-final states); at the deadline the job
    is cancelled (the next tests need the one node) and its state then returned."""
    deadline = time.time() + timeout_s
    state = ""
    while time.time() < deadline:
        state = _job_field(slurm, job, "JobState")
        if state in FINAL_STATES:
            return state
        time.sleep(0.5)
    subprocess.run(["scancel", str(job)], env=slurm, check=False)
    return state


def _epochs(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []


def _show_job(slurm, job: int) -> str:
    """slurmctld's record of the job (``scontrol show job``)."""
    return subprocess.run(["scontrol", "show", "job", str(job)], capture_output=True, text=True,
                          env=slurm).stdout


def _job_field(slurm, job: int, key: str) -> str:
    m = re.search(rf"\b{key}=(\S+)", _show_job(slurm, job))
    return m.group(1) if m else ""


def _diagnosis(slurm, job: int, out: Path) -> str:
    """What a job that did not train left behind: its record in slurmctld, its output, and the
    tails of the daemons' logs (a CI run only prints the assertion)."""
    text = out.read_text()[-3000:] if out.exists() else "(no output file)"
    return (f"the job did not start training\n{_show_job(slurm, job)}\n--- job output\n{text}\n"
            f"{daemon_logs(slurm, 1500)}")


def test_sbatch_srun_trains_then_usr1_checkpoints_requeues_and_resumes(slurm, data, tmp_path):
    """The generic job script trains on 4 ranks through srun --mpi=pmi2; its signal,
    checkpoint, requeue and resume, with a graph transformer (whose first checkpoint once
    killed every such job)."""
    epochs = 40  # enough that the signal lands mid-run; short enough for CI
    job, run = _sbatch(slurm, tmp_path, data, epochs, model="gt")
    deadline = time.time() + 240
    while time.time() < deadline and len(_epochs(run)) < 3:
        time.sleep(0.3)
    assert len(_epochs(run)) >= 3, _diagnosis(slurm, job, tmp_path / f"job-{job}.out")
    subprocess.run(["scancel", "--signal=USR1", str(job)], check=True, env=slurm)
    state = _wait_done(slurm, job, 400)
    out = (tmp_path / f"job-{job}.out").read_text()
    assert state == "COMPLETED", (state, out[-3000:])
    assert int(_job_field(slurm, job, "Restarts")) == 1
    assert "stopped by signal 10" in out and "resumed from" in out
    assert "4 ranks (gloo)" in out and f"plexgt train: finished after epoch {epochs}" in out
    rows = _epochs(run)
    assert sorted({r["epoch"] for r in rows}) == list(range(1, epochs + 1))
    assert all(r["ranks"] == 4 for r in rows)
    assert (run / "checkpoints" / f"epoch_{epochs:06d}" / "COMPLETE").exists()
    assert not (run / "checkpoints" / "STOPPED").exists()


def test_gpu_job_scripts_run_under_slurm(slurm, data, tmp_path):
    """The Perlmutter and Frontier scripts as submitted there (their #SBATCH lines: -A, -C gpu,
    -q, -c, --gpus-per-node; srun's --gpus-per-task / --gpu-bind; set -euo pipefail), on the
    local Slurm's one node with stand-in GPUs, both jobs at once: sized down on the command
    line (one node, two ranks), Lmod's ``module`` a no-op, and ``--backend gloo`` last in EXTRA
    (there is no GPU to run NCCL on). The run directory is each machine's default:
    $SCRATCH/plexgt/<job> on Perlmutter, $MEMBERWORK/<project>/plexgt/<job> on Frontier (home
    is read-only there)."""
    jobs = {}
    for machine in ("perlmutter", "frontier"):
        d = tmp_path / machine
        d.mkdir()
        env = dict(slurm, DATA=str(data), EPOCHS="2", VENV=str(ROOT / ".venv"), MODEL="gcn",
                   EXTRA="--model.hidden=16 --eval_every=1 --backend gloo",
                   OMP_NUM_THREADS="1", SCRATCH=str(d), MEMBERWORK=str(d), RCCL_PLUGIN=str(d),
                   **{"BASH_FUNC_module%%": "() {  :\n}"})
        r = subprocess.run(["sbatch", "--parsable", "-N", "1", "--ntasks-per-node=2", "-c", "1",
                            "--gpus-per-node=2", "-o", str(d / "job-%j.out"),
                            str(ROOT / "jobscripts" / machine / "train.sbatch")],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        assert r.returncode == 0, r.stderr
        jobs[machine] = int(re.match(r"\d+", r.stdout.strip()).group(0))
    deadline = time.time() + 240  # both jobs run at once: waited for one after the other
    states = {m: _wait_done(slurm, j, max(1.0, deadline - time.time())) for m, j in jobs.items()}
    for machine, job in jobs.items():
        d = tmp_path / machine
        out = (d / f"job-{job}.out").read_text()
        assert states[machine] == "COMPLETED", (machine, states[machine], out[-3000:])
        assert "plexgt train: finished after epoch 2" in out
        run = d / ("plexgt" if machine == "perlmutter" else "prj000/plexgt") / str(job)
        assert [row["ranks"] for row in _epochs(run)] == [2, 2], machine


def test_sweep_knows_gpus_per_node(tmp_path):
    """sweep.sh sizes jobs by the machine's GPUs per node: 4 on Perlmutter, 8 on Frontier."""
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "sbatch.log"
    (fake / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (fake / "sbatch").chmod(0o755)
    for machine in ("perlmutter", "frontier"):
        env = {"PATH": f"{fake}:/usr/bin:/bin", "SCALES": "4 8 16",
               "SCRIPT": f"jobscripts/{machine}/train.sbatch",
               "SWEEP_DIR": str(tmp_path / machine)}
        subprocess.run(["bash", str(ROOT / "jobscripts" / "sweep.sh")], check=True, env=env,
                       cwd=ROOT, capture_output=True)
    lines = log.read_text().splitlines()
    got = [re.search(r"--nodes=(\d+) --ntasks-per-node=(\d+)", x).groups() for x in lines]
    assert got == [("1", "4"), ("2", "4"), ("4", "4"), ("1", "4"), ("1", "8"), ("2", "8")]
