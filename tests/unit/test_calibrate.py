"""The planner's quick host calibration (plexgt.plan.calibrate): a valid profile, its cache
(reused, invalidated on a key change, never through a symlink), and what plan says it used."""

from __future__ import annotations

import copy
import json

import pytest

from plexgt.cli import main
from plexgt.data.loader import PreparedGraph
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.synthetic import sbm
from plexgt.plan import calibrate
from plexgt.plan.agp import SystemModel
from plexgt.plan.plexus_cost import Coefficients
from plexgt.plan.profile import KERNEL_KINDS, read_profile

REAL_BUSY = calibrate.busy  # the fixtures below stub it; the busy-host test puts it back


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One real quick calibration (kernels in process, collectives on two workers), cached
    in a scratch XDG_CACHE_HOME."""
    env = {"XDG_CACHE_HOME": str(tmp_path_factory.mktemp("xdg"))}
    with pytest.MonkeyPatch.context() as mp:  # the suite's own load must not stop the cache
        mp.setattr(calibrate, "busy", lambda cores: None)
        return calibrate.calibration(env), env


@pytest.fixture
def fake(measured, monkeypatch):
    """calibrate.measure replaced by a copy of the real result, counting its calls."""
    calls = []

    def measure(key, workers=True):
        calls.append(key)
        prof = copy.deepcopy(measured[0].profile)
        prof["calibration_key"] = key
        return prof, ""

    monkeypatch.setattr(calibrate, "measure", measure)
    monkeypatch.setattr(calibrate, "busy", lambda cores: None)
    return calls


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "sbm"
    g = sbm(num_nodes=300, num_edges=3000, num_classes=4, num_features=16, seed=2)
    prepare(MemorySource(g), PrepOptions(out=path, symmetrize=True, progress=False))
    return path


def test_calibration_is_a_profile_the_reader_takes(measured):
    """The measurement is a system profile the profile reader validates, with every kernel
    kind the planners refit, collectives of two workers (or a note saying they were not
    measured), and both planners build from it."""
    cal, env = measured
    assert not cal.cached and cal.path is not None and cal.path.parent == calibrate.cache_dir(
        env)
    prof = read_profile(cal.path)  # schema-checked as a --profile file is
    assert prof == cal.profile and prof["kind"] == "quick-calibration"
    assert prof["calibration_key"] == calibrate.host_key()
    assert all(prof["kernels"][k] for k in KERNEL_KINDS) and prof["kernels"]["gcn_step"]
    assert prof["hardware"]["device"] == "cpu" and prof["software"]["threads_per_rank"] == 1
    if prof["world_size"] == 2:
        assert prof["collective_fits"]["all_gather"]["2"]["s_per_byte"] > 0
        assert prof["contention"]["2"] >= 1.0
    else:
        assert "not measured" in cal.note
    sysm, coef = SystemModel.from_profile(prof), Coefficients.from_profile(prof)
    assert sysm.host.device == "cpu" and coef.host.cores == prof["hardware"]["cores"]
    assert coef.spmm_s_per_nnz_col == prof["plexus"]["spmm_s_per_nnz_col"]


def test_cache_is_reused_and_invalidated_on_a_key_change(tmp_path, fake, monkeypatch):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    first = calibrate.calibration(env)
    again = calibrate.calibration(env)
    assert len(fake) == 1 and not first.cached and again.cached
    assert again.path == first.path and again.profile == first.profile
    assert "cached at " + str(first.path) in again.describe()
    # another torch (or CPU, cores, threads): another file, measured again
    key = {**calibrate.host_key(), "torch": "0.0-other"}
    monkeypatch.setattr(calibrate, "host_key", lambda: key)
    other = calibrate.calibration(env)
    assert len(fake) == 2 and not other.cached and other.path != first.path
    # a file at the key's path written for another key (or cut short) is measured over
    other.path.write_text(json.dumps({**other.profile, "calibration_key": {"cpu": "x"}}))
    assert not calibrate.calibration(env).cached and len(fake) == 3
    other.path.write_text('{"format": "plexgt-sys')
    assert not calibrate.calibration(env).cached and len(fake) == 4
    assert calibrate.calibration(env).cached and len(fake) == 4


def test_a_busy_hosts_calibration_serves_one_plan_and_is_not_cached(tmp_path, fake,
                                                                     monkeypatch):
    """Timings taken while other work held the cores are not kept for later plans: the
    calibration is used, its note says why it was not cached, and a quiet host's next plan
    measures again and caches. Fails without the load check (the busy result was cached)."""
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    monkeypatch.setattr(calibrate.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(calibrate, "busy", REAL_BUSY)
    cal = calibrate.calibration(env)
    assert not cal.cached and cal.path is None and len(fake) == 1
    assert "not cached: the host was busy (1-minute load 9.0" in cal.note
    assert not calibrate.cache_path(calibrate.host_key(), env).exists()
    monkeypatch.setattr(calibrate.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    cal = calibrate.calibration(env)
    assert cal.path is not None and cal.path.is_file() and len(fake) == 2
    assert calibrate.calibration(env).cached and len(fake) == 2


def test_symlinked_cache_is_refused(tmp_path, fake):
    """A cache file or directory that is a symlink is neither read nor written through: the
    calibration is measured and left uncached, the note says why, the target is untouched."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    path = calibrate.cache_path(calibrate.host_key(), env)
    path.parent.mkdir(parents=True)
    target = tmp_path / "victim.json"
    target.write_text(json.dumps(calibrate.measure(calibrate.host_key())[0]))
    before = target.read_text()
    path.symlink_to(target)
    cal = calibrate.calibration(env)
    assert not cal.cached and cal.path is None and "symlink" in cal.note
    assert path.is_symlink() and target.read_text() == before
    with pytest.raises(calibrate.CalibrationError, match="symlink"):
        calibrate.read_cache(path, calibrate.host_key())
    with pytest.raises(calibrate.CalibrationError, match="symlink"):
        calibrate.write_cache(path, cal.profile)
    # the plexgt directory itself a symlink
    env2 = {"XDG_CACHE_HOME": str(tmp_path / "xdg2")}
    (tmp_path / "xdg2").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "xdg2" / "plexgt").symlink_to(tmp_path / "elsewhere")
    cal = calibrate.calibration(env2)
    assert cal.path is None and "symlink" in cal.note
    assert not list((tmp_path / "elsewhere").iterdir())


def test_off_switches():
    assert calibrate.disabled({calibrate.OFF_ENV: "1"})
    assert not calibrate.disabled({calibrate.OFF_ENV: "0"}) and not calibrate.disabled({})
    assert not calibrate.applies(env={calibrate.OFF_ENV: "1"})


def test_plan_prints_which_coefficients_it_used(prepared, tmp_path, fake, monkeypatch,
                                                capsys):
    """plan names its coefficients: the calibration (measured, then cached, at its path),
    the defaults when turned off (and its next: command keeps train off it too), a profile;
    train's planning reads the same cache."""
    from plexgt.plan.knobs import load_config
    from plexgt.tasks.task import planning_profile, run_plan

    monkeypatch.delenv(calibrate.OFF_ENV, raising=False)
    monkeypatch.setenv(calibrate.CACHE_ENV, str(tmp_path / "plexgt"))
    monkeypatch.setattr(calibrate, "applies", lambda device=None, env=None: True)
    monkeypatch.setattr("plexgt.commands.plan.applies", lambda: True)
    base = ["plan", "--data", str(prepared), "--model", "gcn", "--world-size", "2",
            "--hidden", "16"]
    js = tmp_path / "plan.json"
    assert main(base + ["--json", str(js)]) == 0
    out = capsys.readouterr()
    assert "\ncoefficients: quick calibration of this host (measured in" in out.out
    assert "calibrating this host" in out.err and len(fake) == 1
    path = calibrate.cache_path(calibrate.host_key())
    assert path.is_file() and json.loads(js.read_text())["coefficients"].startswith(
        "quick calibration")
    assert main(base) == 0
    out = capsys.readouterr()
    assert f"coefficients: quick calibration of this host (cached at {path}" in out.out
    assert "calibrating" not in out.err and len(fake) == 1
    cfg = load_config(None, None, [f"--data={prepared}", "--model.name=gcn",
                                   "--model.hidden=16"])
    prof, src = planning_profile(cfg)
    assert prof == read_profile(path) and src.startswith("quick calibration")
    assert run_plan(cfg, PreparedGraph(prepared), 2).coefficients == src

    assert main(base + ["--no-calibrate"]) == 0
    out = capsys.readouterr().out
    assert "coefficients: default coefficients (no --profile; --no-calibrate)" in out
    nxt = next(ln for ln in out.splitlines() if ln.startswith("next: "))
    assert nxt.endswith("--parallel.calibrate=false")
    monkeypatch.setenv(calibrate.OFF_ENV, "1")
    assert main(base) == 0
    assert f"no --profile; {calibrate.OFF_ENV} is set" in capsys.readouterr().out
    assert main(base + ["--profile", str(path)]) == 0
    assert f"coefficients: profile {path}" in capsys.readouterr().out
