"""prep deletes only what it made: ``--overwrite`` removes a plexgt prepared directory's own
files and nothing else, never a directory holding its input, never through a symlink; a
failed run removes only its own output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from plexgt.cli import main
from plexgt.data import prep_finish, prep_stages, shard
from plexgt.data.prep_run import PrepRun
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.verify import verify
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import DataError
from tests.datagen import small_graph, write_snap

pytestmark = pytest.mark.timeout(120)


def _one_line_error(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("plexgt prep: error: "), err
    return err


def _user_dir(tmp_path):
    u = tmp_path / "u"
    u.mkdir()
    (u / "graph.csv").write_text("0,1\n1,2\n2,0\n")
    (u / "README").write_text("my notes")
    (u / "manifest.json").write_text('{"x": 1}')
    return u


def _contents(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_the_input_inside_out_is_never_deleted(capsys, tmp_path, monkeypatch):
    """The battery's case: ``--input u/graph.csv --out u --overwrite`` deleted u/ before
    reading the input. Refused, in one line naming both, and u/ is as it was."""
    u = _user_dir(tmp_path)
    before = _contents(u)
    monkeypatch.chdir(tmp_path)
    err = _one_line_error(capsys, ["prep", "--input", "u/graph.csv", "--out", "u",
                                   "--overwrite", "--quiet"])
    assert "graph.csv" in err and "inside" in err, err
    assert _contents(u) == before


def test_out_inside_the_input_is_refused(capsys, tmp_path):
    g = small_graph(30, 80)
    root = tmp_path / "data"
    root.mkdir()
    snap = write_snap(root / "g.txt", g)
    argv = ["prep", "--format", "snap", "--input", str(snap), "--overwrite", "--quiet"]
    err = _one_line_error(capsys, [*argv, "--out", str(root)])
    assert str(snap) in err and "inside" in err, err
    err = _one_line_error(capsys, [*argv, "--out", str(snap)])  # the input itself
    assert "exists and is not a directory" in err and snap.exists()
    # a directory as the input (an OGB root): the output may not lie inside it
    with pytest.raises(DataError, match=f"lies inside the input {root}"):
        prepare(MemorySource(g), PrepOptions(out=root / "p", overwrite=True, progress=False,
                                             source_desc={"input": str(root)}))
    assert not (root / "p").exists()
    # beside the input file is fine
    assert main([*argv, "--out", str(root / "prepared")]) == 0
    assert snap.exists() and verify(root / "prepared")["ok"]


def test_a_manifest_that_is_not_plexgts_is_refused(capsys, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    for text in ('{"format": "something-else"}', "not json at all", "[1, 2]"):
        (out / "manifest.json").write_text(text)
        err = _one_line_error(capsys, ["prep", "--format", "sbm", "--nodes", "100", "--edges",
                                       "400", "--out", str(out), "--overwrite", "--quiet"])
        assert "refusing to overwrite" in err, err
        assert (out / "manifest.json").read_text() == text
    assert sorted(os.listdir(out)) == ["manifest.json"]


def test_a_staging_dir_that_is_not_plexgts_is_refused(capsys, tmp_path):
    out = tmp_path / "o"
    (out / ".staging").mkdir(parents=True)
    (out / ".staging" / "params.json").write_text('{"mine": true}')
    (out / "data.bin").write_text("precious")
    err = _one_line_error(capsys, ["prep", "--format", "sbm", "--nodes", "100", "--edges", "400",
                                   "--out", str(out), "--overwrite", "--quiet"])
    assert "refusing to overwrite" in err, err
    assert (out / "data.bin").read_text() == "precious"
    assert (out / ".staging" / "params.json").read_text() == '{"mine": true}'


def test_overwrite_removes_only_the_prepared_files(tmp_path):
    """A prepared directory plus a user's files: --overwrite replaces the prepared files and
    keeps the others (in the directory and inside its A1/, features/, .staging/)."""
    g = small_graph(40, 200, f=3)
    out = tmp_path / "o"
    prepare(MemorySource(g), PrepOptions(out=out, tiles=3, progress=False))
    (out / "notes.txt").write_text("keep me")
    (out / "A1" / "my_plot.png").write_text("keep me too")
    (out / ".staging").mkdir()
    (out / ".staging" / "scratch").write_text("and me")
    m = prepare(MemorySource(g), PrepOptions(out=out, tiles=2, overwrite=True, progress=False))
    assert m["T"] == 2
    assert (out / "notes.txt").read_text() == "keep me"
    assert (out / "A1" / "my_plot.png").read_text() == "keep me too"
    assert (out / ".staging" / "scratch").read_text() == "and me"
    assert not (out / "A1" / "rows_00002.h5").exists()  # the old T=3 tile is gone
    assert verify(out)["ok"]


def test_overwrite_an_interrupted_run(tmp_path):
    g = small_graph(40, 200, f=3)
    out = tmp_path / "o"
    with pytest.raises(RuntimeError, match="simulated"):
        prepare(MemorySource(g), PrepOptions(out=out, tiles=3, progress=False), fail_after=1)
    assert (out / ".staging" / "params.json").exists() and not (out / "manifest.json").exists()
    (out / "keep.txt").write_text("mine")
    prepare(MemorySource(g), PrepOptions(out=out, tiles=3, overwrite=True, progress=False))
    assert verify(out)["ok"] and (out / "keep.txt").read_text() == "mine"


def test_symlinks_in_the_output_are_not_followed(tmp_path):
    """A symlinked A1 (and a symlinked tile) are unlinked as links: what they point at stays."""
    g = small_graph(40, 200, f=3)
    out = tmp_path / "o"
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "rows_00000.h5").write_text("user data named like a tile")
    (elsewhere / "rows_00001.h5").write_text("user data named like a tile")
    (tmp_path / "lone.h5").write_text("user data")
    for p in (out / "A1").iterdir():
        p.unlink()
    (out / "A1").rmdir()
    (out / "A1").symlink_to(elsewhere, target_is_directory=True)
    (out / "A2" / "rows_00000.h5").unlink()
    (out / "A2" / "rows_00000.h5").symlink_to(tmp_path / "lone.h5")
    before = _contents(elsewhere)
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, overwrite=True, progress=False))
    assert _contents(elsewhere) == before
    assert (tmp_path / "lone.h5").read_text() == "user data"
    assert not (out / "A1").is_symlink() and not (out / "A2" / "rows_00000.h5").is_symlink()
    assert verify(out)["ok"]


def test_resume_refuses_a_symlinked_output_part(tmp_path):
    g = small_graph(40, 200, f=3)
    out = tmp_path / "o"
    with pytest.raises(RuntimeError, match="simulated"):
        prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False), fail_after=1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "A2").rmdir()
    (out / "A2").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(DataError, match="symbolic link"):
        prepare(MemorySource(g), PrepOptions(out=out, tiles=2, resume=True, progress=False))
    assert list(elsewhere.iterdir()) == []
    # a temporary file that is a symlink is replaced, not written through
    (out / "A2").unlink()
    (out / "A2").mkdir()
    (out / "A2" / "rows_00000.h5.tmp").symlink_to(tmp_path / "lone.h5")
    (tmp_path / "lone.h5").write_text("user data")
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, resume=True, progress=False))
    assert (tmp_path / "lone.h5").read_text() == "user data" and verify(out)["ok"]


def test_a_failed_overwrite_keeps_the_users_files(tmp_path):
    """The failure path removed the whole output with rmtree: now only this run's files."""
    g = small_graph(40, 200)
    out = tmp_path / "o"
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False))
    (out / "notes.txt").write_text("keep me")
    bad = small_graph(40, 200)
    bad.splits = {"train": np.array([0, 1]), "valid": np.array([1]),  # found last (nodes.h5)
                  "test": np.array([2])}
    with pytest.raises(DataError, match="node 1 is in both"):
        prepare(MemorySource(bad), PrepOptions(out=out, tiles=2, overwrite=True,
                                               progress=False))
    assert sorted(os.listdir(out)) == ["notes.txt"]


def test_a_failed_run_removes_the_directory_only_if_it_made_it(tmp_path):
    bad = small_graph(40, 200)
    bad.splits = {"train": np.array([0, 1]), "valid": np.array([1]), "test": np.array([2])}
    for out, made in ((tmp_path / "new", True), (tmp_path / "empty", False)):
        if not made:
            out.mkdir()
        with pytest.raises(DataError, match="node 1 is in both"):
            prepare(MemorySource(bad), PrepOptions(out=out, tiles=2, overwrite=True,
                                                   progress=False))
        assert out.exists() != made
    assert os.listdir(tmp_path / "empty") == []


def test_the_manifest_marks_the_directory(tmp_path):
    """What --overwrite takes for prepared: the manifest's format, not its name."""
    g = small_graph(40, 200)
    out = tmp_path / "o"
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False))
    m = json.loads((out / "manifest.json").read_text())
    assert m["format"] == "plexgt-prepared"
    m["format"] = "other"
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="refusing to overwrite"):
        prepare(MemorySource(g), PrepOptions(out=out, tiles=2, overwrite=True, progress=False))
    assert (out / "nodes.h5").exists()


# -- a full disk ------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs (root only: elsewhere the tests skip), unmounted afterwards."""
    d = tmp_path / "disk"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip() or 'not root'})")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)  # lazy: never left mounted


def _fill(disk, leave):
    """Take all but ``leave`` bytes of the disk's free space with a file of the test's own."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    with open(disk / "filler", "ab") as f:
        if free > leave:
            os.posix_fallocate(f.fileno(), os.fstat(f.fileno()).st_size, free - leave)


def _filling_first(monkeypatch, module, name, disk, leave):
    """Make ``module.name`` fill the disk before it runs: the stage it starts fails."""
    real = getattr(module, name)

    def wrapped(*a, **kw):
        _fill(disk, leave)
        return real(*a, **kw)

    monkeypatch.setattr(module, name, wrapped)


DISK_GRAPH = dict(n=3000, e=30000, f=64)  # tiles ~100 KB a row block, features ~770 KB


@pytest.mark.parametrize("leave", [0, 20 << 10, 150 << 10])
@pytest.mark.parametrize("stage", ["setup", "bucket", "tiles", "features", "finish"])
def test_a_full_disk_at_every_stage_is_one_error_and_leaves_nothing(small_disk, monkeypatch,
                                                                    stage, leave):
    """The size check passes (patched), then the disk fills at the start of a stage or part way
    through its writes (numpy's bucket appends, h5py's tile, feature and node files, the JSON
    records): a DataError naming the path and the need, and the disk holds only the filler.
    h5py used to print tracebacks and the process to segfault closing the failed file."""
    monkeypatch.setattr(shard, "check_disk", lambda out, run: None)
    if stage == "setup":
        _fill(small_disk, leave)
    elif stage == "bucket":
        _filling_first(monkeypatch, shard, "bucket_stage", small_disk, leave)
    elif stage == "tiles":
        _filling_first(monkeypatch, shard, "build_stage", small_disk, leave)
    elif stage == "features":
        _filling_first(monkeypatch, prep_stages, "build_features", small_disk, leave)
    else:
        _filling_first(monkeypatch, shard, "finish_stage", small_disk, leave)
    out = small_disk / "o"
    g = small_graph(DISK_GRAPH["n"], DISK_GRAPH["e"], f=DISK_GRAPH["f"])
    try:
        prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False))
    except DataError as e:
        msg = str(e)
    else:
        pytest.fail("prep succeeded on a full disk")  # the filler left more than it needed
    assert "the disk is full; prep needs about" in msg and str(small_disk) in msg, msg
    assert len(msg.splitlines()) == 1
    assert os.listdir(small_disk) == ["filler"]


def test_a_full_disk_while_overwriting_keeps_the_users_files(small_disk, monkeypatch):
    g = small_graph(DISK_GRAPH["n"], DISK_GRAPH["e"], f=DISK_GRAPH["f"])
    out = small_disk / "o"
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False))
    (out / "notes.txt").write_text("keep me")
    monkeypatch.setattr(shard, "check_disk", lambda out, run: None)
    _filling_first(monkeypatch, shard, "build_stage", small_disk, 20 << 10)
    with pytest.raises(DataError, match="the disk is full"):
        prepare(MemorySource(g), PrepOptions(out=out, tiles=2, overwrite=True, progress=False))
    assert os.listdir(out) == ["notes.txt"]


def test_a_full_disk_while_resuming_keeps_the_finished_work(small_disk, monkeypatch):
    """A resumed directory is kept for the next --resume, less this run's temporary files."""
    g = small_graph(DISK_GRAPH["n"], DISK_GRAPH["e"], f=DISK_GRAPH["f"])
    out = small_disk / "o"
    with pytest.raises(RuntimeError, match="simulated"):
        prepare(MemorySource(g), PrepOptions(out=out, tiles=2, progress=False), fail_after=1)
    monkeypatch.setattr(shard, "check_disk", lambda out, run: None)
    _filling_first(monkeypatch, shard, "build_stage", small_disk, 20 << 10)
    with pytest.raises(DataError, match="the disk is full"):
        prepare(MemorySource(g), PrepOptions(out=out, tiles=2, resume=True, progress=False))
    assert not list(out.rglob("*.tmp"))
    (small_disk / "filler").unlink()
    monkeypatch.undo()
    prepare(MemorySource(g), PrepOptions(out=out, tiles=2, resume=True, progress=False))
    assert verify(out)["ok"]


CLI_ON_A_FULL_DISK = """
import sys
import plexgt.data.shard as shard
shard.check_disk = lambda out, run: None  # the estimate passes, the disk does not
from plexgt.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("size", ["1m", "1500k"])
def test_the_command_on_a_full_disk_exits_2_in_one_line(tmp_path, size):
    """The battery's case: ``plexgt prep`` on a disk that fills in an h5py write printed h5py
    tracebacks after its message and died of a segfault (exit 139, 3 of 3 runs)."""
    d = tmp_path / "disk"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip() or 'not root'})")
    try:
        r = subprocess.run([sys.executable, "-c", CLI_ON_A_FULL_DISK, "prep", "--format", "sbm",
                            "--nodes", "3000", "--edges", "30000", "--features", "64",
                            "--out", str(d / "o"), "--quiet"],
                           capture_output=True, text=True, timeout=100)
        err = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(err) == 1, (r.returncode, r.stderr[-3000:])
        assert "the disk is full; prep needs about" in err[0], err
        assert os.listdir(d) == []
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _allocated(d):
    return sum(p.lstat().st_blocks * 512 for p in d.rglob("*") if p.is_file())


@pytest.mark.parametrize("f,sparse,streamed", [(512, "no", True), (512, "no", False),
                                               (300, "yes", True), (0, "no", False)])
def test_the_estimate_covers_what_prep_holds_at_its_peak(tmp_path, monkeypatch, f, sparse,
                                                         streamed):
    """prep_bytes left out the feature buckets: with wide features the disk check passed and
    the disk filled. The peak is just before the staging area goes (all the buckets, every
    tile, feature block and nodes.h5 at once): measured there, it is within the estimate."""
    peak = []
    real = prep_finish.remove_prepared

    def measure(out, rel=""):
        peak.append(_allocated(out))
        return real(out, rel)

    monkeypatch.setattr(prep_finish, "remove_prepared", measure)
    g = small_graph(4000, 20000, f=f)
    src = MemorySource(g)
    src.random_access_features = not streamed  # streamed: feature rows go through buckets
    opts = PrepOptions(out=tmp_path / "o", tiles=3, progress=False, sparse_features=sparse)
    need = shard.prep_bytes(PrepRun.create(src, opts, HostComm(None)))
    prepare(src, opts)
    assert peak and need >= peak[0], (need, peak)
    assert need < 3 * peak[0] + (1 << 20)  # an estimate, not a blanket refusal
