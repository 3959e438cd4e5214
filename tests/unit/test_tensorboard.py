"""TensorBoard scalars: the metrics rows' numbers under grouped tags, purged past a resume."""

from __future__ import annotations

import pytest

from plexgt.training.tensorboard import TensorBoardLog, scalars

accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                  reason="the tensorboard extra is not installed")


def _row(epoch: int, loss: float) -> dict:
    return {"epoch": epoch, "loss": loss, "lr": 0.01, "valid_acc": 0.5, "test_rocauc": 0.75,
            "time_compute": 0.2, "time_comm": 0.1, "time_wait": 0.0, "time_epoch": 0.3,
            "bytes_comm": 1024, "peak_mem_bytes": 2048, "grid": "2x1x1"}


def test_scalars_hold_every_number_of_a_row_under_its_tag():
    s = scalars(_row(3, 1.5))
    assert s == {"loss/train": 1.5, "lr": 0.01, "acc/valid": 0.5, "rocauc/test": 0.75,
                 "time/compute": 0.2, "time/comm": 0.1, "time/wait": 0.0, "time/epoch": 0.3,
                 "bytes/comm": 1024.0, "memory/peak_bytes": 2048.0}


def test_a_resumed_run_replaces_the_epochs_past_its_checkpoint(tmp_path):
    log = TensorBoardLog(str(tmp_path / "tb"), start=0)
    for e in range(1, 8):  # a run killed after epoch 7, its checkpoint at 4
        log.write(_row(e, float(e)))
    log.close()
    log = TensorBoardLog(str(tmp_path / "tb"), start=4)
    for e in range(5, 10):
        log.write(_row(e, 100.0 + e))
    log.close()
    ea = accumulator.EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    got = [(s.step, s.value) for s in ea.Scalars("loss/train")]
    assert got == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)] + [(e, 100.0 + e) for e in
                                                              range(5, 10)]
    assert {"acc/valid", "rocauc/test", "time/comm", "bytes/comm"} <= set(ea.Tags()["scalars"])


def test_an_unwritable_directory_is_a_one_line_config_error(tmp_path):
    from plexgt.errors import ConfigError

    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="config key 'tensorboard'.*file/tb"):
        TensorBoardLog(str(tmp_path / "file" / "tb"), start=0)


def test_a_directory_it_cannot_write_in_is_a_one_line_config_error():
    """A read-only directory (tests run as root, which chmod does not stop: sysfs refuses
    every new file, as a read-only directory does a user): one line, no writer thread's
    traceback (the writer's first flush raised FileNotFoundError / PermissionError)."""
    import tempfile

    from plexgt.errors import ConfigError

    try:
        with tempfile.NamedTemporaryFile(dir="/sys"):
            pytest.skip("/sys takes new files here")
    except OSError:
        pass
    with pytest.raises(ConfigError, match=r"config key 'tensorboard': /sys: cannot write "
                                          r"there \(Permission denied\)"):
        TensorBoardLog("/sys", start=0)
