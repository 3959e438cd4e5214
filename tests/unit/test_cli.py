"""The plexgt command line in one process."""

import importlib
import json
import os
import re
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


#: prints what ``plexgt ARGS`` printed, then the plexgt.commands modules it imported
_LOADED_AFTER = """
import json, sys
from plexgt.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith("plexgt.commands.")
                        or m.split(".")[0] in ("torch", "h5py"))))
"""


def _help_and_imports(*args: str) -> tuple[str, list[str]]:
    env = {**os.environ, "COLUMNS": "250"}  # one line a command: argparse wraps at COLUMNS
    r = subprocess.run([sys.executable, "-c", _LOADED_AFTER, *args], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    text, _, loaded = r.stdout.rstrip().rpartition("\n")
    return text, json.loads(loaded)


def test_help_lists_the_commands_in_workflow_order_by_their_modules_help():
    """Each command's line in ``plexgt --help`` is its module's HELP (the one place it is
    written), the commands in the order a run uses them, and the quick start below."""
    text, _ = _help_and_imports("--help")
    listed = re.findall(r"^    (\w+) +(\S.*)$", text, re.M)
    assert [name for name, _ in listed] == list(cli.COMMANDS)
    assert _help_and_imports("--help", "train")[0] == text
    assert cli.COMMANDS == ("prep", "verify", "profile", "plan", "train", "predict",
                            "evaluate", "export", "report", "info")
    for name, shown in listed:
        assert shown == importlib.import_module(f"plexgt.commands.{name}").HELP, name
    assert text.endswith(cli.QUICK_START)


def test_help_imports_no_command_module():
    """``plexgt --help`` reads every command's HELP from source: it imports none of them
    (nor torch, nor h5py); ``plexgt report --help`` imports report alone."""
    assert _help_and_imports("--help")[1] == []
    text, loaded = _help_and_imports("report", "--help")
    assert loaded == ["plexgt.commands.report"]
    assert importlib.import_module("plexgt.commands.report").HELP in " ".join(text.split())


def test_a_command_run_reads_no_other_commands_source(monkeypatch, capsys):
    """Only the listing needs every command's help; running one parses no module's source."""
    def unread(name: str) -> str:
        raise AssertionError(f"read the help of {name}")

    monkeypatch.setattr(cli, "command_help", unread)
    assert main(["info", "--dry-run", "--world-size", "2", "--grid", "2x1x1"]) == 0
    assert capsys.readouterr().out.startswith("grid 2x1x1: 2 ranks")


def test_a_module_without_help_is_named():
    with pytest.raises(LookupError, match="plexgt.commands.__init__ defines no HELP"):
        cli.command_help("__init__")


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

    fake = types.SimpleNamespace(HELP="fails", add_arguments=lambda parser: None, run=run)
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


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """A small class-labelled graph and a multi-label one, prepared."""
    from plexgt.data.shard import PrepOptions, prepare
    from plexgt.data.source import MemorySource
    from plexgt.data.synthetic import sbm
    from tests.datagen import multilabel

    root = tmp_path_factory.mktemp("cli")
    g = sbm(num_nodes=300, num_edges=3000, num_classes=4, num_features=8, seed=1)
    prepare(MemorySource(g), PrepOptions(out=root / "sbm", progress=False))
    prepare(MemorySource(multilabel(g, tasks=3)), PrepOptions(out=root / "ml", progress=False))
    return root


def _train_one_process(cwd, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PLEXGT_NO_MPI": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "plexgt", "train", "--model.hidden=16",
                           "--epochs", "1", "--progress=false", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("data,argv,msg", [
    ("ml", ["--model", "gcn", "--metric=accuracy"],
     "config key 'metric': {path}: metric accuracy needs class labels; the graph has 3 "
     "multi-label tasks (use rocauc)"),
    ("sbm", ["--model", "gcn", "--model.node_embedding=100000000"],
     "config key 'model.node_embedding': 100000000 needs at least 480,000,000,000 bytes"),
    ("sbm", ["--model", "gt", "--model.super_nodes=1000000000"],
     "config key 'model.super_nodes': 1000000000 needs at least 2,656,000,000,000 bytes"),
])
def test_train_refuses_what_it_would_ignore_or_could_not_hold(graphs, tmp_path, data, argv,
                                                              msg):
    """--metric=accuracy was taken for an abbreviation of --metrics (a metrics file named
    'accuracy', ROC-AUC reported as ever); 10⁸-10⁹ table rows ended in a MemoryError
    traceback. Each is one line naming the key, exit 2, nothing written."""
    path = graphs / data
    r = _train_one_process(tmp_path, "--data", str(path), *argv)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert err[0].startswith("plexgt train: error: " + msg.format(path=path)), err[0]
    assert list(tmp_path.iterdir()) == []


# Runs ``python -m plexgt ARGS`` with a finder that notes, when mpi4py.MPI is first imported
# (MPI's start), which torch modules are already loaded; at exit one ORDER line says it.
IMPORT_ORDER = r"""
import atexit, json, runpy, sys
seen = {}
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "mpi4py.MPI" and "mpi" not in seen:
            seen["mpi"] = sorted(m for m in sys.modules if m.split(".")[0] == "torch")[:3]
        return None
sys.meta_path.insert(0, Watch())
atexit.register(lambda: print("ORDER " + json.dumps(
    {"torch_at_mpi_start": seen.get("mpi"), "torch": "torch" in sys.modules}), flush=True))
sys.argv = ["plexgt", *sys.argv[1:]]
runpy.run_module("plexgt", run_name="__main__")
"""


def _import_order(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PLEXGT_NO_MPI"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", IMPORT_ORDER, *args], capture_output=True,
                       text=True, timeout=120, env=env)
    line = [x for x in r.stdout.splitlines() if x.startswith("ORDER ")]
    assert line, r.stderr[-2000:]
    return json.loads(line[-1][6:])


@pytest.mark.parametrize("command", ["train", "profile", "prep", "info"])
def test_mpi_starts_before_torch_is_imported(tmp_path, command):
    """OLCF: Cray MPICH fails in MPI_Init_thread ("OFI invalid value for environment
    variable") when torch was imported before mpi4py.MPI. Every command that runs in MPI's
    world gets MPI started by the CLI before its module (which imports torch) is imported.
    (Before, train, profile and info imported torch first and started MPI later.)"""
    args = {
        "train": ["--data", str(tmp_path / "missing"), "--model", "gcn"],
        "profile": ["--out", str(tmp_path / "no" / "such" / "profile.json")],
        "prep": ["--format", "sbm", "--nodes", "200", "--edges", "800", "--quiet",
                 "--out", str(tmp_path / "g")],
        "info": ["--grid", "1x1x1", "--backend", "gloo"],
    }[command]
    order = _import_order(command, *args)
    assert order["torch_at_mpi_start"] == [], order  # MPI started, and before any torch
    assert order["torch"] == (command != "prep")  # prep never loads torch


@pytest.mark.parametrize("args", [("train", "--help"), ("info", "--dry-run", "--world-size",
                                                        "2", "--grid", "2x1x1")])
def test_help_and_dry_runs_start_no_mpi(args):
    assert _import_order(*args)["torch_at_mpi_start"] is None


def _leaves(cls, prefix=""):
    """(dotted key, default) of every leaf field of a config dataclass, walked here."""
    import dataclasses

    out = []
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            out += _leaves(type(f.default_factory()), f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, f.default))
    return out


def test_train_help_lists_every_config_key_with_its_default_and_docstring(capsys):
    """``plexgt train --help`` said "see plexgt/config.py"; it now lists every key of the
    dataclasses, its default as TOML writes it, and its docstring's first sentence on one
    line (every key has one: the project's rule for config fields)."""
    from plexgt.config import TrainConfig
    from plexgt.config.keys import describe_keys

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    listed = re.findall(r"^  (\S+) = (.*)\n      (.*)$", text, re.M)
    want = _leaves(TrainConfig)
    assert [k for k, _, _ in listed] == [k for k, _ in want] and len(want) > 35
    for (key, default, doc), (_, value), kd in zip(listed, want, describe_keys()):
        assert json.loads(default) == value, key
        assert doc and doc == kd.summary(94) and len(doc) <= 94, key
        assert doc.rstrip(" …") in " ".join(kd.doc.replace("``", "").split()), key
    assert "  optim.schedule = \"cosine\"\n      'cosine' (warm-up to lr" in text
    assert "  model.hidden = 128\n      Hidden width d.\n" in text


def test_field_docstrings_are_read_from_any_dataclass():
    """The list is generated: a new field appears with its docstring, with no list to edit."""
    import dataclasses

    from plexgt.config.keys import KeyDoc, field_docs

    @dataclasses.dataclass(frozen=True)
    class Toy:
        width: int = 3
        """How wide: a number of columns; 0 = the plan's choice, which it takes from the
        graph."""
        plain: str = "x"

    assert field_docs(Toy) == {"width": "How wide: a number of columns; 0 = the plan's "
                                        "choice, which it takes from the\ngraph."}
    doc = KeyDoc("width", 3, field_docs(Toy)["width"])
    assert doc.summary() == ("How wide: a number of columns; 0 = the plan's choice, which it "
                             "takes from the graph.")
    assert doc.summary(40) == "How wide: a number of columns …"
