"""Checkpoint files on their own: DCP round trip, checksums, a corrupt marker, the directory
lock, the key a configuration mismatch names, the canonical state, and the metrics a resumed
run cuts back."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import pickle
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from plexgt.errors import CheckpointError, ConfigError
from plexgt.models.gt import GraphTransformer
from plexgt.parallel.rows1d import RowParallel
from plexgt.plan.knobs import load_config
from plexgt.training import checkpoint as ckpt
from plexgt.training import dcp_safe, ownfiles
from plexgt.training.loop import open_metrics
from plexgt.training.state import canonical_state, load_canonical_state

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _write(root: Path, epoch: int = 3, meta: dict | None = None) -> dict:
    sums = ckpt.write_state(root, epoch, {"w": torch.arange(10.0), "n": torch.tensor(7)})
    meta = {"world_size": 1, "grid": "1x1x1", "strategy": "plexus3d", "config_hash": "h",
            **(meta or {}), "sha256": sums}
    ckpt.mark_complete(root, epoch, meta)
    return ckpt.latest_complete(root)[1]


def _template() -> dict:
    return {"w": torch.zeros(10), "n": torch.tensor(0)}


def test_a_checkpoint_round_trips_through_dcp_with_checksums(tmp_path):
    meta = _write(tmp_path)
    assert meta["format"] == ckpt.FORMAT and meta["epoch"] == 3
    assert ".metadata" in meta["sha256"] and any(n.endswith(".distcp") for n in meta["sha256"])
    ckpt.verify_files(tmp_path, 3, meta)
    got = ckpt.read_state(tmp_path, 3, _template())
    assert torch.equal(got["w"], torch.arange(10.0)) and int(got["n"]) == 7


def test_a_damaged_or_missing_file_is_refused_not_trained_on(tmp_path):
    meta = _write(tmp_path)
    data_file = next(n for n in meta["sha256"] if n.endswith(".distcp"))
    path = ckpt.epoch_dir(tmp_path, 3) / data_file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{data_file}: checkpoint file is damaged"):
        ckpt.verify_files(tmp_path, 3, meta)
    path.unlink()
    with pytest.raises(CheckpointError, match=f"{data_file}: checkpoint file missing"):
        ckpt.verify_files(tmp_path, 3, meta)


def test_a_checkpoint_that_does_not_fit_this_run_is_a_one_line_error(tmp_path):
    _write(tmp_path)
    with pytest.raises(CheckpointError, match="cannot read the checkpoint into this run"):
        ckpt.read_state(tmp_path, 3, {"w": torch.zeros(10), "other": torch.zeros(2)})


def test_a_rewritten_epoch_starts_from_an_empty_directory(tmp_path):
    d = ckpt.epoch_dir(tmp_path, 3)
    d.mkdir(parents=True)
    (d / "__7_0.distcp").write_text("left by a killed 8-rank run")
    ckpt.clear_epoch(tmp_path, 3)
    meta = _write(tmp_path)
    assert "__7_0.distcp" not in meta["sha256"]


def test_a_corrupt_complete_marker_is_a_one_line_error(tmp_path):
    _write(tmp_path)
    (ckpt.epoch_dir(tmp_path, 3) / ckpt.COMPLETE).write_text("{not json")
    with pytest.raises(CheckpointError, match="COMPLETE: corrupt checkpoint marker"):
        ckpt.latest_complete(tmp_path)


def test_a_configuration_mismatch_names_the_key_and_another_layout_is_accepted(tmp_path):
    a = load_config(None, None, ["--model.hidden=16"])
    b = load_config(None, None, ["--model.hidden=32", "--epochs=500"])
    assert a.hash() != b.hash()
    assert a.hash() == load_config(None, None, ["--model.hidden=16", "--epochs=9"]).hash()
    # the layout is not part of the computation: a checkpoint resumes on any grid
    assert a.hash() == load_config(None, None, ["--model.hidden=16", "--parallel.grid=2x2x1",
                                                "--parallel.strategy=gp_a2a"]).hash()
    meta = _write(tmp_path, meta={"config_hash": a.hash(), "config": a.computation()})
    ckpt.check_meta(tmp_path, 3, meta, {"config_hash": a.hash(), "grid": "4x1x1",
                                        "world_size": 4})
    expect = {**meta, "config_hash": b.hash(), "config": b.computation()}
    with pytest.raises(CheckpointError, match="written with model.hidden=16, this run has "
                                              "model.hidden=32"):
        ckpt.check_meta(tmp_path, 3, meta, expect)


def test_a_checkpoint_of_the_old_per_rank_format_is_named(tmp_path):
    meta = {"epoch": 3, "world_size": 1, "config_hash": "h", "sha256": ["ab"]}
    with pytest.raises(CheckpointError, match="checkpoint format 1, this plexgt reads format 2"):
        ckpt.check_meta(tmp_path, 3, meta, {"config_hash": "h"})


def test_the_canonical_state_round_trips_model_optimizer_and_rng(tmp_path):
    torch.manual_seed(0)
    model = RowParallel(GraphTransformer(5, 8, 3, num_layers=1, heads=2), None, None)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    fresh = canonical_state(model, opt)
    assert float(fresh["optim/step"]) == 0
    assert all(torch.count_nonzero(v) == 0 for k, v in fresh.items() if k.startswith("optim/e"))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    state = canonical_state(model, opt)
    assert "model/blocks.0.attn.q.weight" in state and float(state["optim/step"]) == 1
    torch.manual_seed(5)
    other = RowParallel(GraphTransformer(5, 8, 3, num_layers=1, heads=2), None, None)
    opt2 = torch.optim.AdamW(other.parameters(), lr=0.01)
    load_canonical_state(other, opt2, state)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(s1[i][k], s2[i][k]) for i in s1 for k in s1[i])
    assert torch.equal(torch.get_rng_state(), state["rng/cpu"])


def test_two_jobs_cannot_share_a_checkpoint_directory(tmp_path):
    held = ckpt.lock(tmp_path)
    try:
        with pytest.raises(CheckpointError, match="in use by pid"):
            ckpt.lock(tmp_path)
    finally:
        held.close()
    ckpt.lock(tmp_path).close()  # free again once the first job has ended


def test_an_unwritable_checkpoint_directory_is_a_one_line_error(tmp_path):
    """A directory that cannot be written (here a file in its place, which fails for root as
    well as for a user; a read-only directory behaves alike) is a CheckpointError naming it."""
    (tmp_path / "taken").write_text("a file, not a directory")
    with pytest.raises(CheckpointError, match="taken.*cannot write the checkpoint"):
        ckpt.write_state(tmp_path / "taken", 1, {"w": torch.zeros(1)})
    with pytest.raises(CheckpointError, match="taken.*cannot use the checkpoint directory"):
        ckpt.lock(tmp_path / "taken")


def test_resumed_metrics_drop_the_epochs_past_the_checkpoint(tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_text("".join(json.dumps({"epoch": e, "loss": 1.0 / e}) + "\n" for e in range(1, 8))
                 + '{"epoch": 8, "lo')  # the killed run's last line, cut short
    cfg = load_config(None, None, [f"--metrics={m}", "--resume=true", "--checkpoint_dir=x"])
    with open_metrics(cfg, 5) as f:
        f.write(json.dumps({"epoch": 6, "loss": 0.5}) + "\n")
    assert [json.loads(l)["epoch"] for l in m.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(ConfigError, match="config key 'metrics'"):
        open_metrics(load_config(None, None, [f"--metrics={tmp_path}"]), 0)


class _Planted:
    """What a crafted checkpoint pickles: its ``__reduce__`` writes ``marker`` and then hands
    the unpickler ``value`` (the real metadata, or a tensor), so a plain load goes on as if
    nothing happened."""

    def __init__(self, marker: Path, value: object) -> None:
        self.marker, self.value = marker, pickle.dumps(value)

    def __reduce__(self):
        return (eval, (f"(open({str(self.marker)!r}, 'w').write('ran'), "
                       f"__import__('pickle').loads({self.value!r}))[1]",))


def _reseal(root: Path, epoch: int, name: str) -> dict:
    """Record a rewritten file's sha256 in COMPLETE, as whoever rewrote the file can."""
    d = ckpt.epoch_dir(root, epoch)
    meta = json.loads((d / ckpt.COMPLETE).read_text())
    meta["sha256"][name] = hashlib.sha256((d / name).read_bytes()).hexdigest()
    (d / ckpt.COMPLETE).write_text(json.dumps(meta))
    return meta


def test_a_crafted_metadata_file_runs_nothing_and_is_refused_naming_it(tmp_path):
    """The proof of concept: .metadata replaced by a pickle whose __reduce__ writes a marker
    and returns the real metadata, COMPLETE's checksum updated to match. A plain pickle.load
    (DCP's) ran it silently; the checkpoint is refused in one line and nothing ran."""
    _write(tmp_path)
    path = ckpt.epoch_dir(tmp_path, 3) / ".metadata"
    marker = tmp_path / "ran"
    with open(path, "rb") as f:
        real = pickle.load(f)  # our own file, just written
    path.write_bytes(pickle.dumps(_Planted(marker, real)))
    meta = _reseal(tmp_path, 3, ".metadata")
    ckpt.verify_files(tmp_path, 3, meta)  # the checksum matches: it is no defence
    with pytest.raises(CheckpointError) as e:
        ckpt.read_state(tmp_path, 3, _template())
    assert str(e.value).startswith(f"{path}: ") and "builtins.eval" in str(e.value)
    assert "\n" not in str(e.value)
    assert not marker.exists()


def test_a_non_tensor_entry_in_the_metadata_is_refused_before_its_bytes_are_read(tmp_path):
    """DCP loads a 'bytes' entry with torch.load(weights_only=False): a crafted .metadata
    that declares the state's tensor as bytes, pointing at a malicious pickle, ran it."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    _write(tmp_path)
    d = ckpt.epoch_dir(tmp_path, 3)
    marker = tmp_path / "ran"
    data = next(n for n in json.loads((d / ckpt.COMPLETE).read_text())["sha256"]
                if n.endswith(".distcp"))
    buf = io.BytesIO()
    torch.save(_Planted(marker, torch.arange(10.0)), buf)
    blob = buf.getvalue()
    end = (d / data).stat().st_size
    with open(d / data, "ab") as f:  # the real tensors stay where they were
        f.write(blob)
    with open(d / ".metadata", "rb") as f:
        md = pickle.load(f)
    md.state_dict_metadata["w"] = BytesStorageMetadata()
    index = next(i for i in md.storage_data if i.fqn == "w")
    info = md.storage_data.pop(index)
    info.offset, info.length = end, len(blob)
    md.storage_data[MetadataIndex("w")] = info  # where DCP looks a bytes entry up
    (d / ".metadata").write_bytes(pickle.dumps(md))
    _reseal(tmp_path, 3, data)
    _reseal(tmp_path, 3, ".metadata")
    with pytest.raises(CheckpointError, match=r"\.metadata: .*BytesStorageMetadata"):
        ckpt.read_state(tmp_path, 3, _template())
    assert not marker.exists()
    # and should such metadata get past that check, the planner does not load the bytes
    with pytest.raises(CheckpointException, match="entry 'w' is not a tensor"):
        dcp.load(_template(), storage_reader=dcp_safe._Reader(d, md),
                 planner=dcp_safe._TensorsOnly())
    assert not marker.exists()


def test_a_crafted_tensor_payload_runs_nothing(tmp_path):
    """DCP reads each tensor of a .distcp file with torch.load(weights_only=True): a payload
    replaced by a torch.save'd object whose __reduce__ writes a marker (the metadata pointed
    at it, every checksum updated) is a one-line error and nothing ran."""
    _write(tmp_path)
    d = ckpt.epoch_dir(tmp_path, 3)
    marker = tmp_path / "ran"
    data = next(n for n in json.loads((d / ckpt.COMPLETE).read_text())["sha256"]
                if n.endswith(".distcp"))
    buf = io.BytesIO()
    torch.save(_Planted(marker, torch.arange(10.0)), buf)
    (d / data).write_bytes(buf.getvalue())
    with open(d / ".metadata", "rb") as f:
        md = pickle.load(f)
    for info in md.storage_data.values():
        info.offset, info.length = 0, len(buf.getvalue())
    (d / ".metadata").write_bytes(pickle.dumps(md))
    _reseal(tmp_path, 3, data)
    _reseal(tmp_path, 3, ".metadata")
    with pytest.raises(CheckpointError, match=f"{d}: a tensor of its .distcp files holds "
                                              "other objects .refused, not run: .*eval"):
        ckpt.read_state(tmp_path, 3, _template())
    assert not marker.exists()


def test_metadata_naming_files_outside_the_checkpoint_is_refused(tmp_path):
    """The metadata says which file holds each tensor: only DCP's own files of the epoch's
    directory are read, never a path a crafted file names."""
    _write(tmp_path)
    d = ckpt.epoch_dir(tmp_path, 3)
    with open(d / ".metadata", "rb") as f:
        md = pickle.load(f)
    for info in md.storage_data.values():
        info.relative_path = "../../etc/passwd"
    (d / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(CheckpointError, match=r"\.metadata: .*'\.\./\.\./etc/passwd'"):
        ckpt.read_state(tmp_path, 3, _template())


def _complete(root: Path, epoch: int, run: str) -> None:
    sums = ckpt.write_state(root, epoch, {"w": torch.full((4,), float(epoch))})
    ckpt.mark_complete(root, epoch, {"config_hash": "h", "run": run, "sha256": sums})


def _epochs(root: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in root.glob("epoch_*"))


def test_pruning_keeps_this_runs_newest_and_never_touches_another_runs(tmp_path):
    """A directory holding another run's epochs 10 and 11: a new run's epochs 1-4 keep its
    own newest two (by name the other run's were newer, and each new checkpoint was removed
    as soon as it was written); the other run's checkpoints stay."""
    for e in (10, 11):
        _complete(tmp_path, e, "other")
    for e in range(1, 5):
        _complete(tmp_path, e, "mine")
        assert (ckpt.epoch_dir(tmp_path, e) / ckpt.COMPLETE).exists()
    assert _epochs(tmp_path) == [3, 4, 10, 11]
    for e in (12, 13, 14):  # and the other run, resumed, prunes only its own
        _complete(tmp_path, e, "other")
    assert _epochs(tmp_path) == [3, 4, 13, 14]


def test_a_fresh_run_refuses_a_directory_with_another_runs_checkpoints(tmp_path):
    ckpt.check_fresh(tmp_path)  # empty: fine
    ckpt.epoch_dir(tmp_path, 2).mkdir()  # a killed run's incomplete write: fine
    ckpt.check_fresh(tmp_path)
    _complete(tmp_path, 7, "other")
    with pytest.raises(CheckpointError, match=f"^{tmp_path}: holds another run's complete "
                       "checkpoints .the newest epoch_000007.; pass --resume to continue it "
                       "or use another --checkpoint-dir$"):
        ckpt.check_fresh(tmp_path)


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    v.write_text("the user's file\n")
    return v


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path):
    """A LOCK -> ~/victim symlink planted in the checkpoint directory: opening it to write
    the holder's line overwrote the victim."""
    root, victim = tmp_path / "ck", _victim(tmp_path)
    root.mkdir()
    (root / ckpt.LOCK).symlink_to(victim)
    with pytest.raises(CheckpointError, match=f"^{root}/LOCK: is a symbolic link"):
        ckpt.lock(root)
    assert victim.read_text() == "the user's file\n"


def test_a_lock_file_plexgt_did_not_write_is_not_truncated(tmp_path):
    (tmp_path / ckpt.LOCK).write_text("my notes\n")
    with pytest.raises(CheckpointError, match=f"^{tmp_path}/LOCK: a file plexgt did not "
                                              "write; it is never overwritten"):
        ckpt.lock(tmp_path)
    assert (tmp_path / ckpt.LOCK).read_text() == "my notes\n"
    (tmp_path / ckpt.LOCK).write_text("pid 12 on node7\n")  # an earlier plexgt's: taken
    ckpt.lock(tmp_path).close()
    assert (tmp_path / ckpt.LOCK).read_text().startswith("plexgt train: pid ")


def test_the_users_config_toml_survives_and_plexgts_own_is_replaced(tmp_path):
    """A config.toml of the user's in the checkpoint directory was overwritten by every run;
    plexgt's own (its mark, or the exact text an earlier plexgt wrote) is replaced."""
    from plexgt.config import to_toml
    from plexgt.training.loop import CONFIG_MARK, _prepare_dir

    cfg = load_config(None, None, [f"--checkpoint_dir={tmp_path}", "--model.hidden=16"])
    mine = "# my sweep settings\n[model]\nhidden = 16\n"
    (tmp_path / "config.toml").write_text(mine)
    with pytest.raises(CheckpointError, match=f"^{tmp_path}/config.toml: a file plexgt did "
                                              "not write"):
        _prepare_dir(tmp_path, cfg)
    assert (tmp_path / "config.toml").read_text() == mine
    for old in (to_toml(load_config(None, None, ["--model.hidden=8"])),
                CONFIG_MARK + "anything plexgt wrote\n"):
        (tmp_path / "config.toml").write_text(old)
        _prepare_dir(tmp_path, cfg)
        assert (tmp_path / "config.toml").read_text() == CONFIG_MARK + to_toml(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]  # no temporaries


@pytest.mark.parametrize("name", ["config.toml", "STOPPED"])
def test_a_symlink_where_plexgt_writes_a_file_is_refused(tmp_path, name):
    from plexgt.training.loop import _mark_stopped, _prepare_dir

    root, victim = tmp_path / "ck", _victim(tmp_path)
    root.mkdir()
    (root / name).symlink_to(victim)
    cfg = load_config(None, None, [f"--checkpoint_dir={root}"])
    acts = [lambda: _prepare_dir(root, cfg)]  # a run starting
    if name == "STOPPED":
        acts.append(lambda: _mark_stopped(root, 3))  # a run stopping
    for act in acts:
        with pytest.raises(CheckpointError, match=f"^{root}/{name}: is a symbolic link"):
            act()
    assert victim.read_text() == "the user's file\n" and (root / name).is_symlink()


def test_a_stopped_mark_plexgt_did_not_write_is_kept(tmp_path):
    from plexgt.training.loop import _mark_stopped, _prepare_dir

    cfg = load_config(None, None, [f"--checkpoint_dir={tmp_path}"])
    (tmp_path / ckpt.STOPPED).write_text("do not requeue: broken node\n")
    for act in (lambda: _prepare_dir(tmp_path, cfg), lambda: _mark_stopped(tmp_path, 3)):
        with pytest.raises(CheckpointError, match="STOPPED: a file plexgt did not write"):
            act()
    assert (tmp_path / ckpt.STOPPED).read_text() == "do not requeue: broken node\n"
    (tmp_path / ckpt.STOPPED).write_text("7\n")  # its own: removed, then written
    _prepare_dir(tmp_path, cfg)
    assert not (tmp_path / ckpt.STOPPED).exists()
    _mark_stopped(tmp_path, 9)
    assert (tmp_path / ckpt.STOPPED).read_text() == "9\n"


def test_a_symlinked_epoch_directory_is_refused_and_its_target_untouched(tmp_path):
    """epoch_000003 -> a directory of the user's: clear_epoch's rmtree, or DCP's write,
    went through it."""
    root, elsewhere = tmp_path / "ck", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (elsewhere / "__0_0.distcp").write_text("the user's data")
    ckpt.epoch_dir(root, 3).symlink_to(elsewhere)
    with pytest.raises(CheckpointError, match="epoch_000003: is a symbolic link"):
        ckpt.clear_epoch(root, 3)
    with pytest.raises(CheckpointError, match="epoch_000003: is a symbolic link"):
        ckpt.write_state(root, 3, {"w": torch.zeros(2)})
    assert [p.name for p in elsewhere.iterdir()] == ["__0_0.distcp"]
    with pytest.raises(CheckpointError, match="epoch_000003: is a symbolic link"):
        ckpt.latest_complete(root)  # nor is one resumed from


def test_a_symlinked_dcp_file_is_refused_and_its_target_untouched(tmp_path):
    """A __0_0.distcp -> victim symlink in an epoch's directory: refused by the clearing
    before a write, and (planted after it) by the write itself, which creates every file
    anew; nor is a checkpoint file read through one."""
    victim = _victim(tmp_path)
    root = tmp_path / "ck"
    d = ckpt.epoch_dir(root, 3)
    d.mkdir(parents=True)
    (d / "__0_0.distcp").symlink_to(victim)
    with pytest.raises(CheckpointError, match=f"^{d}/__0_0.distcp: is a symbolic link"):
        ckpt.clear_epoch(root, 3)
    with pytest.raises(CheckpointError, match=f"^{d}/__0_0.distcp: is a symbolic link"):
        ckpt.write_state(root, 3, {"w": torch.zeros(2)})
    assert victim.read_text() == "the user's file\n"
    (d / "__0_0.distcp").unlink()
    meta = _write(root)
    (d / ".metadata").rename(tmp_path / "md")
    (d / ".metadata").symlink_to(tmp_path / "md")
    with pytest.raises(CheckpointError, match=f"^{d}/.metadata: is a symbolic link"):
        ckpt.verify_files(root, 3, meta)
    with pytest.raises(CheckpointError, match=f"^{d}/.metadata: is a symbolic link"):
        ckpt.read_state(root, 3, _template())


def test_clearing_an_epoch_removes_only_dcps_and_plexgts_files(tmp_path):
    d = ckpt.epoch_dir(tmp_path, 3)
    d.mkdir()
    for n in (".metadata", ".metadata.tmp", "__0_0.distcp", "__11_2.distcp", "COMPLETE.tmp"):
        (d / n).write_text("left by a killed run")
    (d / "notes.txt").write_text("the user's")
    with pytest.raises(CheckpointError, match=f"^{d}/notes.txt: a file plexgt did not write"):
        ckpt.clear_epoch(tmp_path, 3)
    assert len(list(d.iterdir())) == 6
    (d / "notes.txt").unlink()
    ckpt.clear_epoch(tmp_path, 3)
    assert not d.exists()


def test_clearing_an_epoch_never_removes_another_runs_complete_checkpoint(tmp_path):
    _complete(tmp_path, 3, "other")
    with pytest.raises(CheckpointError, match="epoch_000003: holds a complete checkpoint of "
                                              "another run"):
        ckpt.clear_epoch(tmp_path, 3, "mine")
    assert (ckpt.epoch_dir(tmp_path, 3) / ckpt.COMPLETE).exists()
    ckpt.clear_epoch(tmp_path, 3, "other")  # its own run may rewrite it
    assert not ckpt.epoch_dir(tmp_path, 3).exists()


def test_the_dataset_identity_ignores_the_node_order_and_tells_graphs_apart(tmp_path):
    """Another permutation of the same input keeps the identity (its node order changes);
    another graph of the same F and C does not."""
    from plexgt.data.loader import PreparedGraph
    from plexgt.data.shard import PrepOptions, prepare
    from plexgt.data.source import MemorySource
    from plexgt.data.synthetic import sbm
    from plexgt.tasks.task import dataset_identity, node_order

    def prep(name: str, graph_seed: int, **opts) -> PreparedGraph:
        g = sbm(num_nodes=200, num_edges=1500, num_classes=4, num_features=8, seed=graph_seed)
        prepare(MemorySource(g), PrepOptions(out=tmp_path / name, tiles=2, progress=False,
                                             **opts))
        return PreparedGraph(tmp_path / name)

    a, again, other = prep("a", 1), prep("b", 1, seed=7, permutation="degree"), prep("c", 2)
    assert node_order(a) != node_order(again)
    assert dataset_identity(a) == dataset_identity(again) != dataset_identity(other)
    assert (a.F, a.C) == (other.F, other.C)


def test_a_checkpoint_of_another_dataset_is_refused_naming_both(tmp_path):
    meta = _write(tmp_path, meta={"dataset": "aa", "dataset_name": "/p/computers (computers)"})
    expect = {"config_hash": "h", "dataset": "bb", "dataset_name": "/p/photo (photo)"}
    with pytest.raises(CheckpointError, match=r"epoch_000003: trained on /p/computers "
                       r"\(computers\), this run's data is /p/photo \(photo\); resume on the "
                       "dataset it was trained on$"):
        ckpt.check_meta(tmp_path, 3, meta, expect)
    ckpt.check_meta(tmp_path, 3, {**meta, "dataset": "bb"}, expect)
    older = {k: v for k, v in meta.items() if not k.startswith("dataset")}
    ckpt.check_meta(tmp_path, 3, older, expect)  # recorded none: still resumes


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (the tests run as root here); skipped where mounting is not
    permitted. Unmounted afterwards."""
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip() or r.returncode}): "
                    "the disk-full test needs root (the monkeypatched one runs anywhere)")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=True)


BIG = {"w": torch.zeros(200_000), "b": torch.zeros(10)}  # 800 KB: does not fit 256 KiB


def test_a_full_disk_is_named_and_leaves_no_half_written_checkpoint(small_disk):
    """Read "unexpected pos 704 vs 598" (torch's zip writer) and left the epoch's partial
    files behind."""
    with pytest.raises(CheckpointError) as e:
        ckpt.write_state(small_disk, 4, BIG)
    assert str(e.value) == (f"{small_disk}/epoch_000004: cannot write the checkpoint: no "
                            "space left on the device; the checkpoint needs about 0.767 MiB")
    assert list(small_disk.iterdir()) == []
    ckpt.write_state(small_disk, 5, {"w": torch.zeros(10)})  # the space is back


def test_a_write_that_runs_out_of_space_is_named_and_cleaned_up(tmp_path, monkeypatch):
    """The same without a small device: DCP's file writes fail with ENOSPC part-way, and
    COMPLETE's write (when the payload just fitted) fails the same way."""
    real = dcp_safe._NoFollow.create_stream

    class Full:
        """A file whose device fills up after 1000 bytes."""

        def __init__(self, f):
            self.f, self.left = f, 1000

        def __getattr__(self, name):
            return getattr(self.f, name)

        def write(self, b):
            if len(b) > self.left:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.left -= len(b)
            return self.f.write(b)

    @contextlib.contextmanager
    def full(self, path, mode):
        with real(self, path, mode) as f:
            yield Full(f) if "w" in mode else f

    monkeypatch.setattr(dcp_safe._NoFollow, "create_stream", full)
    with pytest.raises(CheckpointError, match=r"epoch_000004: cannot write the checkpoint: "
                       "no space left on the device; the checkpoint needs about 0.767 MiB$"):
        ckpt.write_state(tmp_path, 4, BIG)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    sums = ckpt.write_state(tmp_path, 4, BIG)

    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ownfiles.os, "replace", no_space)
    with pytest.raises(CheckpointError, match="epoch_000004: cannot complete the checkpoint "
                                              ".*No space left on device"):
        ckpt.mark_complete(tmp_path, 4, {"config_hash": "h", "sha256": sums})
    assert list(tmp_path.iterdir()) == []


def _resumable(tmp_path, state: dict, epoch: int = 4):
    """A complete checkpoint of ``state`` as ``plexgt train`` writes one, with the run (cfg,
    ctx, task) that resumes it."""
    from types import SimpleNamespace

    from plexgt.distributed.bootstrap import DistContext
    from plexgt.training.resumable import run_meta

    cfg = load_config(None, {"data": "x", "checkpoint_dir": str(tmp_path), "resume": True,
                             "seed": 7})
    ctx = DistContext(0, 1, 0, 1, "gloo", torch.device("cpu"), "single")
    torch.manual_seed(5)
    model = RowParallel(GraphTransformer(5, 8, 3, num_layers=1, heads=2), None, None)
    task = SimpleNamespace(model=model, grid="rows1", strategy="s", dataset="d",
                           dataset_name="d", node_order="")
    sums = ckpt.write_state(tmp_path, epoch, state)
    ckpt.mark_complete(tmp_path, epoch, {**run_meta(ctx, task, cfg), "step": 0, "run": "r",
                                         "best": {"epoch": 1, "valid": 0.5, "test": 0.5},
                                         "sha256": sums})
    return cfg, ctx, task, torch.optim.AdamW(model.parameters(), lr=0.01)


def _fake_gpu(monkeypatch) -> list:
    """torch.cuda as a GPU run sees it (its RNG initialised); set and seed calls recorded."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state",
                        lambda device="cuda": torch.full((16,), 3, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state",
                        lambda s, device="cuda": calls.append(("set", s.clone())))
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda s: calls.append(("seed", s)))
    return calls


def test_a_checkpoint_written_on_a_cpu_resumes_on_a_gpu(tmp_path, monkeypatch):
    """A CPU run's checkpoint has no rng/cuda, which a GPU run's load template asked for
    (DCP: missing key, 'cannot read the checkpoint into this run'): now the state loads and
    the CUDA RNG is seeded from the run's seed and epoch, and the run says so."""
    from plexgt.training.resumable import resume

    torch.manual_seed(0)
    src = RowParallel(GraphTransformer(5, 8, 3, num_layers=1, heads=2), None, None)
    state = canonical_state(src, torch.optim.AdamW(src.parameters(), lr=0.01))
    assert "rng/cuda" not in state
    cfg, ctx, task, opt = _resumable(tmp_path, state)
    calls = _fake_gpu(monkeypatch)
    assert "rng/cuda" in canonical_state(task.model, opt)  # what the GPU run's template asks
    logs: list[str] = []
    got = resume(cfg, ctx, task, opt, logs.append)
    from plexgt.training.state import cuda_seed

    assert got.start == 4
    assert all(torch.equal(a, b) for a, b in zip(src.parameters(), task.model.parameters()))
    assert calls == [("seed", cuda_seed(7, 4))]
    assert any("no CUDA RNG state" in m and "seed 7 and epoch 4" in m for m in logs), logs


def test_a_checkpoint_written_on_a_gpu_resumes_on_a_cpu(tmp_path, monkeypatch):
    """The other way: the GPU checkpoint's rng/cuda is not read by a CPU run (no CUDA RNG to
    set), the rest loads; and a GPU run reading it sets its CUDA RNG from it, seeding
    nothing."""
    from plexgt.training.resumable import resume

    torch.manual_seed(0)
    src = RowParallel(GraphTransformer(5, 8, 3, num_layers=1, heads=2), None, None)
    state = canonical_state(src, torch.optim.AdamW(src.parameters(), lr=0.01))
    state["rng/cuda"] = torch.full((16,), 9, dtype=torch.uint8)  # as a GPU run writes it
    cfg, ctx, task, opt = _resumable(tmp_path, state)
    assert "rng/cuda" not in canonical_state(task.model, opt)
    assert resume(cfg, ctx, task, opt, lambda m: None).start == 4
    assert all(torch.equal(a, b) for a, b in zip(src.parameters(), task.model.parameters()))
    cfg, ctx, task, opt = _resumable(tmp_path / "gpu", state)  # written before faking
    calls = _fake_gpu(monkeypatch)
    resume(cfg, ctx, task, opt, lambda m: None)
    assert [c[0] for c in calls] == ["set"] and torch.equal(calls[0][1], state["rng/cuda"])


def _write_at(root: Path, epoch: int, step: int, run: str = "r") -> None:
    """A complete checkpoint at (epoch, step) of run ``run``, as plexgt train writes one."""
    sums = ckpt.write_state(root, epoch, {"w": torch.full((3,), float(epoch * 100 + step))},
                            step)
    extra = {"epoch_step": step, "epoch_loss_sum": 1.5} if step else {}
    ckpt.mark_complete(root, epoch, {"config_hash": "h", "run": run, "sha256": sums,
                                     **extra})


def test_mid_epoch_checkpoints_order_by_epoch_then_step_and_an_epoch_end_supersedes(
        tmp_path):
    """epoch_000004_step_000003 (4 epochs and 3 steps) is newer than epoch_000004 and
    epoch_000003_step_000009, older than epoch_000005 (the end of the epoch it was taken
    in); its own directory name, and pruning keeps the two newest by (epoch, step)."""
    _write_at(tmp_path, 3, 9)
    assert ckpt.epoch_dir(tmp_path, 3, 9).name == "epoch_000003_step_000009"
    _write_at(tmp_path, 4, 0)
    _write_at(tmp_path, 4, 3)
    epoch, meta = ckpt.latest_complete(tmp_path)
    assert ckpt.position(meta) == (4, 3) and epoch == 4 and meta["epoch_loss_sum"] == 1.5
    assert sorted(p.name for p in tmp_path.glob("epoch_*")) == [
        "epoch_000004", "epoch_000004_step_000003"]  # (3, 9) pruned: two kept
    _write_at(tmp_path, 5, 0)
    epoch, meta = ckpt.latest_complete(tmp_path)
    assert (epoch, ckpt.step_of(meta)) == (5, 0) and "epoch_step" not in meta
    assert sorted(p.name for p in tmp_path.glob("epoch_*")) == [
        "epoch_000004_step_000003", "epoch_000005"]
    got = ckpt.read_state(tmp_path, 4, {"w": torch.zeros(3)}, 3)
    assert torch.equal(got["w"], torch.full((3,), 403.0))


def test_a_complete_that_names_another_position_than_its_directory_is_refused(tmp_path):
    """A mid-epoch COMPLETE copied under an epoch's name would resume another position (and
    read another directory's files): refused, naming both."""
    _write_at(tmp_path, 2, 4)
    src = ckpt.epoch_dir(tmp_path, 2, 4)
    src.rename(tmp_path / "epoch_000002")
    with pytest.raises(CheckpointError, match=r"epoch_000002/COMPLETE: records epoch 2 step "
                                              r"4, not its directory's; remove "):
        ckpt.latest_complete(tmp_path)


def test_another_runs_mid_epoch_checkpoints_are_never_pruned(tmp_path):
    _write_at(tmp_path, 1, 2, run="other")
    for e in (2, 3, 4):
        _write_at(tmp_path, e, 1)
    assert sorted(p.name for p in tmp_path.glob("epoch_*")) == [
        "epoch_000001_step_000002", "epoch_000003_step_000001", "epoch_000004_step_000001"]


def test_predict_finds_a_mid_epoch_checkpoint_by_its_directory_or_as_the_newest(tmp_path):
    """plexgt predict/evaluate's lookup: the newest by (epoch, step) is the mid-epoch one,
    read from its own directory (before: epoch_000002, which does not exist), and naming
    that directory finds it."""
    from plexgt.training.inference import find_checkpoint

    _write_at(tmp_path, 1, 0)
    _write_at(tmp_path, 2, 4)
    d = tmp_path / "epoch_000002_step_000004"
    for path in (tmp_path, d):
        cp = find_checkpoint(path)
        assert (cp.epoch, cp.dir) == (2, d)
