"""Reading a DCP checkpoint without running anything it holds, and writing one without
following a symlink or overwriting a file.

DCP's ``FileSystemReader`` unpickles ``.metadata`` with plain :mod:`pickle`, so a crafted
file runs code on ``--resume``; COMPLETE's sha256 is no defence, since whoever can write the
checkpoint directory can rewrite COMPLETE too. Here the metadata is unpickled by an
unpickler that admits only the globals DCP's own ``Metadata`` is built of (listed from a real
``.metadata`` with pickletools: DCP's metadata dataclasses, ``_StorageInfo``, ``torch.Size``,
dtypes, the layout and memory-format codes, the checkpoint's path), then checked to describe
tensors only, stored in DCP's own files of this directory, untransformed.

The payload: DCP reads each tensor of a ``.distcp`` file with ``torch.load(weights_only=True)``
(torch 2.13's ``FileSystemReader.read_data``), which unpickles nothing but tensors and plain
containers. A *bytes* entry it would ``torch.load`` with ``weights_only=False`` (the default
planner's ``load_bytes``); the state plexgt writes has none, so the metadata check refuses
one, and the planner here refuses to load one should it get that far.

Files: DCP's own file system opens with plain ``open``, which follows a symlink planted in
the checkpoint directory and truncates what is there. :class:`_NoFollow` creates each file
DCP writes with O_EXCL | O_NOFOLLOW (the epoch's directory is emptied of plexgt's files
before a write, so every one is new) and reads none through a symlink.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import (
    FileSystem,
    FileSystemReader,
    FileSystemWriter,
    _StorageInfo,
)
from torch.distributed.checkpoint.planner import ReadItem

from plexgt.errors import CheckpointError
from plexgt.training.ownfiles import NOFOLLOW, os_error

METADATA = ".metadata"
DATA_FILE = re.compile(r"__\d+_\d+\.distcp")
"""The name DCP gives a rank's payload file (``__<rank>_<n>.distcp``)."""

ADMITTED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset({
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
        "TensorStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"}),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch": frozenset({"Size"}),  # and every torch.<dtype>: :func:`_admitted`
    "torch.serialization": frozenset({"_get_layout"}),  # a name -> torch.layout lookup
    "pathlib": frozenset({"PosixPath", "PurePosixPath"}),  # StorageMeta.checkpoint_id
}
"""The globals a metadata file may name: what ``pickle.dumps(Metadata)`` of a state of plain
tensors refers to. Built-in containers and numbers need none."""


def _admitted(module: str, name: str) -> bool:
    if name in ADMITTED.get(module, ()):
        return True
    return module == "torch" and name.isidentifier() and isinstance(
        getattr(torch, name, None), torch.dtype)


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ADMITTED` globals (and has no persistent ids)."""

    def find_class(self, module: str, name: str) -> Any:
        if not _admitted(module, name):
            raise _Refused(f"it names {module}.{name}, which no plexgt checkpoint's "
                           "metadata holds (refused, not run)")
        return super().find_class(module, name)


class _Refused(Exception):
    """Why a metadata file is not a checkpoint's (the caller names the file)."""


def read_metadata(d: Path) -> dcp_metadata.Metadata:
    """The checkpoint's DCP metadata, unpickled with :class:`_MetadataUnpickler` and checked
    (module docstring); CheckpointError naming the file otherwise."""
    path = d / METADATA
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | NOFOLLOW), "rb") as f:
            md = _MetadataUnpickler(io.BytesIO(f.read())).load()
        _check(md)
    except _Refused as e:
        raise CheckpointError(f"{path}: not a checkpoint's metadata: {e}") from None
    except OSError as e:
        raise os_error(path, e, "read the checkpoint file") from None
    except Exception as e:  # noqa: BLE001 - a truncated or garbled pickle, any error
        raise CheckpointError(f"{path}: corrupt checkpoint metadata "
                              f"({type(e).__name__}: {e})") from None
    return md


def _check(md: Any) -> None:
    """Refuse metadata that is not a state of tensors in this directory's DCP files."""
    if type(md) is not dcp_metadata.Metadata:
        raise _Refused(f"it holds a {type(md).__name__}, not DCP's Metadata")
    entries = md.state_dict_metadata
    if not isinstance(entries, dict):
        raise _Refused("its state_dict_metadata is not a table")
    for key, entry in entries.items():
        if not isinstance(entry, dcp_metadata.TensorStorageMetadata):
            raise _Refused(f"entry {key!r} is a {type(entry).__name__}, not a tensor (DCP "
                           "would unpickle it without restriction)")
    if not isinstance(md.storage_data, dict):
        raise _Refused("its storage_data is not a table")
    for key, info in md.storage_data.items():
        if not isinstance(info, _StorageInfo):
            raise _Refused(f"storage of {key!r} is a {type(info).__name__}")
        name = info.relative_path
        if not isinstance(name, str) or not DATA_FILE.fullmatch(name):
            raise _Refused(f"it stores {getattr(key, 'fqn', key)!r} in {name!r}, not in one "
                           "of DCP's __<rank>_<n>.distcp files of its directory")
        if type(info.offset) is not int or type(info.length) is not int or min(
                info.offset, info.length) < 0:
            raise _Refused(f"storage of {getattr(key, 'fqn', key)!r} has no valid range")
        if getattr(info, "transform_descriptors", None):
            raise _Refused(f"storage of {getattr(key, 'fqn', key)!r} is transformed "
                           f"({info.transform_descriptors!r}); plexgt writes none")


class _NoFollow(FileSystem):
    """DCP's local file system, creating every file it writes anew and following no symlink
    (module docstring)."""

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str
                      ) -> Generator[io.IOBase, None, None]:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL if "w" in mode else os.O_RDONLY
        try:
            fd = os.open(path, flags | NOFOLLOW, 0o644)
        except OSError as e:
            raise os_error(Path(path), e, "open the checkpoint file") from None
        with os.fdopen(fd, mode) as stream:
            yield stream


class Writer(FileSystemWriter):
    """DCP's file-system writer on :class:`_NoFollow`."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.fs = _NoFollow()


class _Reader(FileSystemReader):
    """DCP's file-system reader, handed the metadata :func:`read_metadata` checked instead of
    unpickling ``.metadata`` itself. ``read_metadata`` takes no ``rank``, so DCP does not
    fall back to a per-rank metadata file either."""

    def __init__(self, path: Path, md: dcp_metadata.Metadata) -> None:
        super().__init__(path)
        self.fs = _NoFollow()
        self._md = md

    def read_metadata(self) -> dcp_metadata.Metadata:  # type: ignore[override]
        storage = getattr(self._md, "storage_meta", None)
        if storage is not None and hasattr(self, "load_id"):
            storage.load_id = self.load_id
        return self._md


class _TensorsOnly(DefaultLoadPlanner):
    """DCP's planner, minus loading a bytes entry (``torch.load(weights_only=False)``)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise CheckpointError(f"entry {read_item.dest_index.fqn!r} is not a tensor; plexgt "
                              "checkpoints hold tensors only")


def load(d: Path, template: dict[str, Any]) -> None:
    """Read the checkpoint in ``d`` into ``template`` (collective, like ``dcp.load``)."""
    md = read_metadata(d)
    dcp.load(template, storage_reader=_Reader(d, md), planner=_TensorsOnly())
