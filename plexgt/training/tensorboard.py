"""TensorBoard scalars of a run (``tensorboard = DIR``): the metrics JSONL's numbers per epoch.

Why beside the JSONL rather than instead of it: the JSONL is the record a study's scripts read
(``plexgt report``); TensorBoard is what a user watching a long job has open. Rank 0 writes,
the same rows. A resumed run opens the writer with ``purge_step`` at its checkpoint, so the
epochs a killed run logged past it are dropped from the curves (as from the JSONL) rather than
drawn twice.

Tags group by kind: ``loss/train``, ``<metric>/<split>`` (``acc/valid``, ``rocauc/test``),
``time/<part>`` (max over ranks), ``bytes/comm`` and ``bytes/comm_max_rank``,
``memory/peak_bytes``, ``lr``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from plexgt.errors import ConfigError

try:  # the optional extra: plexgt[tensorboard]
    from torch.utils.tensorboard import SummaryWriter
except ImportError:  # pragma: no cover - exercised where the extra is absent
    SummaryWriter = None

SPLITS = ("train", "valid", "test")
METRIC_KEYS = ("acc", "rocauc")
TIME_KEYS = ("compute", "comm", "wait", "epoch")


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard tag -> value of one metrics row (only what the row holds)."""
    out: dict[str, float] = {"loss/train": row["loss"], "lr": row["lr"]}
    for split in SPLITS:
        for m in METRIC_KEYS:
            if f"{split}_{m}" in row:
                out[f"{m}/{split}"] = row[f"{split}_{m}"]
    for t in TIME_KEYS:
        if f"time_{t}" in row:
            out[f"time/{t}"] = row[f"time_{t}"]
    for k, tag in (("bytes_comm", "bytes/comm"), ("bytes_comm_max_rank", "bytes/comm_max_rank"),
                   ("peak_mem_bytes", "memory/peak_bytes"),
                   ("peak_device_mem_bytes", "memory/peak_device_bytes")):
        if k in row:
            out[tag] = float(row[k])
    return out


class TensorBoardLog:
    """Rank 0's TensorBoard writer of one run."""

    def __init__(self, logdir: str, start: int) -> None:
        if SummaryWriter is None:
            raise ConfigError("config key 'tensorboard': the tensorboard package is not "
                              "installed (pip install 'plexgt[tensorboard]')")
        path = Path(logdir)
        try:
            path.mkdir(parents=True, exist_ok=True)
            # a file of our own, created and removed: the writer's thread would meet a
            # directory it cannot write in with a traceback of its own, then raise in ours
            with tempfile.NamedTemporaryFile(dir=path, prefix=".plexgt-probe-"):
                pass
            self.writer = SummaryWriter(str(path), purge_step=start + 1 if start else None)
        except OSError as e:
            raise ConfigError(f"config key 'tensorboard': {path}: cannot write there "
                              f"({e.strerror or e})") from None

    def write(self, row: dict[str, Any]) -> None:
        for tag, value in scalars(row).items():
            self.writer.add_scalar(tag, value, global_step=row["epoch"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
