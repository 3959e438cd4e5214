"""A real one-node Slurm (slurmctld + slurmd + munged) on loopback, for the job-script tests.

Everything lives in a temporary directory: configuration, state, spool, logs, the munge key and
socket; ports are picked free; at the end the jobs still running are cancelled and waited for,
then the daemons are stopped by pid. One such cluster runs on a host at a time (a lock file),
and its job ids start at a number of its own. ``cred_expire=10`` because a requeued job may not
start before that delay has passed (120 s by default). Skipped (with the reason) where the Slurm
and munge binaries are missing or not running as root; ``.ci/run`` installs Debian's slurm-wlm
and munge first.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "scontrol")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_conf(conf: Path, host: str) -> None:
    d = conf.parent
    conf.write_text(f"""\
ClusterName=plexgt-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d / "munge.sock"},cred_expire=10
CredType=cred/munge
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d / "spool"}
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d / "slurmd.pid"}
SlurmctldLogFile={d / "slurmctld.log"}
SlurmdLogFile={d / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmi2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
FirstJobId={1000 + os.getpid() % 100000}
MinJobAge=600
KillWait=5
GresTypes=gpu
NodeName={host} NodeAddr=127.0.0.1 CPUs=8 Gres=gpu:8 Feature=gpu State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    # eight stand-in GPUs (empty files where device nodes would be): what the GPU job scripts
    # ask of a node (-C gpu, --gpus-per-node, --gpus-per-task, --gpu-bind) can be granted
    for i in range(8):
        (d / f"gpu{i}").touch()
    (d / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={d}/gpu[0-7]\n")
    (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n")


def _stop(pidfile: Path) -> None:
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


def daemon_logs(env: dict, tail: int = 2000) -> str:
    """The last ``tail`` characters of slurmctld's and slurmd's logs of the cluster whose
    ``SLURM_CONF`` is in ``env``: what a cluster or job that failed to start left behind."""
    d = Path(env["SLURM_CONF"]).parent
    return "\n".join(f"--- {f}\n" + (d / f).read_text()[-tail:]
                     for f in ("slurmctld.log", "slurmd.log") if (d / f).exists())


def _end_jobs(env: dict, timeout_s: float = 30.0) -> None:
    """Cancel what a failed test left running and wait until it has ended: stopping the
    daemons leaves a job's slurmstepd and ranks running, and such a leftover once broke the
    MPI start-up of the next test run's job of the same id."""
    subprocess.run(["scancel", "--full", "--user=root"], env=env, check=False,
                   capture_output=True)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        r = subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=env)
        if r.returncode != 0 or not r.stdout.strip():
            return
        time.sleep(0.5)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"Slurm not installed (missing {', '.join(missing)}): "
                    "apt-get install slurm-wlm munge (.ci/run does)")
    if os.geteuid() != 0:
        pytest.skip("the local Slurm of the tests runs its daemons as root")
    # one local cluster per host at a time: a second one (another xdist worker, another test
    # run) would start a node of the same name and both clusters' jobs would fail obscurely
    lock = open(Path(tempfile.gettempdir()) / "plexgt-test-slurm.lock", "w")  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        pytest.fail("another local Slurm of the tests is running on this host (another xdist "
                    "worker or test run): the Slurm tests must run on one worker")
    d = tmp_path_factory.mktemp("slurm")
    conf = d / "slurm.conf"
    env = dict(os.environ, SLURM_CONF=str(conf))
    try:
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        host = socket.gethostname().split(".")[0]
        _write_conf(conf, host)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        subprocess.run(["munged", "--force", f"--socket={d / 'munge.sock'}", f"--key-file={key}",
                        f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                        f"--seed-file={d / 'munge.seed'}"], check=True, env=env)
        subprocess.run(["slurmctld", "-f", str(conf), "-i"], check=True, env=env)
        subprocess.run(["slurmd", "-f", str(conf), "-N", host], check=True, env=env)
        deadline = time.time() + 60
        while time.time() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                               env=env)
            if r.returncode == 0 and r.stdout.strip() in ("idle", "mixed"):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"local Slurm did not come up within 60 s:\n{daemon_logs(env)}")
        yield env
    finally:
        _end_jobs(env)
        for pidfile in ("slurmd.pid", "slurmctld.pid", "munged.pid"):
            _stop(d / pidfile)
        lock.close()
