"""perf/ is a package of modules (``python -m perf.bench_x``): each imports, none edits
sys.path, and every script answers --help without running its benchmark."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PERF = ROOT / "perf"
MODULES = sorted(p.stem for p in PERF.glob("*.py") if p.stem != "__init__")
SCRIPTS = [m for m in MODULES if 'if __name__ == "__main__":' in (PERF / f"{m}.py").read_text()]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return {**env, **extra}


def test_the_package_holds_the_benchmarks():
    assert (PERF / "__init__.py").is_file()
    assert {"harness", "bench_agp", "validate_plan", "gcn1d_baseline"} <= set(MODULES)
    assert "harness" not in SCRIPTS and len(SCRIPTS) >= 20


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports(name):
    mod = importlib.import_module(f"perf.{name}")
    assert Path(mod.__file__).resolve() == PERF / f"{name}.py"


@pytest.mark.parametrize("name", MODULES)
def test_no_module_edits_sys_path_or_imports_after_code(name):
    src = (PERF / f"{name}.py").read_text()
    uses = [n.lineno for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Attribute)
            and n.attr == "path" and isinstance(n.value, ast.Name) and n.value.id == "sys"]
    assert uses == [], f"perf/{name}.py uses sys.path at lines {uses}"
    assert "noqa: E402" not in src


def test_every_script_answers_help_without_running(tmp_path):
    # one interpreter runs every script as __main__ with --help (the imports are paid once);
    # a script whose main does its work before parsing would write under perf/results
    before = {p: p.stat().st_mtime_ns for p in (PERF / "results").iterdir()}
    code = ("import runpy, sys, warnings\nwarnings.simplefilter('ignore')\n"
            f"for name in {SCRIPTS!r}:\n"
            "    sys.argv = [name, '--help']\n"
            "    try:\n"
            "        runpy.run_module('perf.' + name, run_name='__main__')\n"
            "    except SystemExit as e:\n"
            "        print(f'EXIT {name} {e.code}', flush=True)\n"
            "    else:\n"
            "        print(f'RAN {name}', flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=240, cwd=tmp_path, env=_env(OMP_WAIT_POLICY="PASSIVE"))
    assert r.returncode == 0, r.stderr[-3000:]
    exits = [line.split() for line in r.stdout.splitlines() if line.startswith(("EXIT", "RAN"))]
    assert exits == [["EXIT", name, "0"] for name in SCRIPTS], r.stderr[-3000:]
    assert r.stdout.count("usage:") == len(SCRIPTS)
    after = {p: p.stat().st_mtime_ns for p in (PERF / "results").iterdir()}
    assert after == before


@pytest.mark.parametrize("name", ["bench_agp", "bench_attention", "bench_ring",
                                  "validate_plan"])
def test_help_runs_as_a_module(name, tmp_path):
    # bench_attention runs itself again with OMP_WAIT_POLICY set (unset here); started from
    # elsewhere than the checkout, with only PYTHONPATH pointing at it
    r = subprocess.run([sys.executable, "-m", f"perf.{name}", "--help"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("usage:")
