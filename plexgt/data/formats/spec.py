"""What a source format is to ``plexgt prep``: one :class:`FormatSpec`, declared by its module.

A format is one module of this package: its reader, and at its end one ``SPEC`` saying its
name, a line for ``--help``, what ``--input`` names for it, how ``--format auto`` recognises
its paths (a test of a :class:`Probe`, and where tests of several formats could both pass, an
``order``), which prep options it reads, and how it opens a
:class:`~plexgt.data.source.GraphSource` from them. An option a format does not read is refused
(:mod:`plexgt.data.formats.options`), never dropped: a run given ``--split-index 3`` must not
quietly prepare split 0. :mod:`plexgt.data.formats.registry` lists the specs, one line each; a
:class:`FormatRegistry` is an object the caller builds (``default_registry()``) and may extend
(``reg.register(...)``), so there is no module-level mutable state, and a format's name
appears nowhere but in its own module: adding one is one new module and one registry line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from plexgt.data.npzio import npz_keys
from plexgt.data.source import GraphSource
from plexgt.data.textio import read_head
from plexgt.distributed.hostcomm import HostComm

AUTO = "auto"
"""The ``--format`` that asks the registry's recognisers; no format may take the name."""

EDGE_LIST_SUFFIXES = (".txt", ".csv", ".tsv", ".edges", ".el", ".edgelist")
"""The names text edge lists go by (each also ``.gz``): the formats that read such lines
share them, whichever of them recognises a file first."""

HEAD_BYTES = 4096
"""Of a file's (decompressed) start, what a recogniser may look at."""


class Probe:
    """A path as ``--format auto`` sees it. Each look (an npz's keys, a file's first bytes) is
    taken once, when a recogniser first asks, so the tests of every format cost one read."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.is_dir = self.path.is_dir()
        self.name = self.path.name.lower()
        """The name, lower case."""
        self.stem = self.name.removesuffix(".gz")
        """The name without a ``.gz`` (what a compressed text file is underneath)."""

    def holds(self, *relative: str) -> bool:
        """Whether the path is a directory holding any of the paths ``relative``."""
        return self.is_dir and any((self.path / r).exists() for r in relative)

    def holds_match(self, pattern: str) -> bool:
        """Whether the path is a directory with an entry matching the glob ``pattern``."""
        return self.is_dir and next(self.path.glob(pattern), None) is not None

    @cached_property
    def npz_keys(self) -> frozenset[str]:
        """The arrays of a file named ``.npz`` (empty for any other path; unread until asked)."""
        if self.is_dir or not self.name.endswith(".npz"):
            return frozenset()
        return frozenset(npz_keys(self.path))

    @cached_property
    def head(self) -> bytes:
        """A file's first :data:`HEAD_BYTES` (decompressed); b"" for a directory."""
        return b"" if self.is_dir else read_head(self.path, HEAD_BYTES)

    def seen(self) -> str:
        """What the looks found that a message can show ('' when they found nothing to say)."""
        keys = self.__dict__.get("npz_keys")
        return f"an npz with keys {', '.join(sorted(keys))}" if keys else ""


@dataclass(frozen=True, eq=False)
class FormatOption:
    """A prep option that only some formats read (or, in :data:`COMMON`, every one).

    Its owner declares it once (a format's module, or this one for the sizes several formats
    share); each spec that reads it lists it. Compared by identity: two declarations of one
    ``dest`` are a registry error, not a merge.
    """

    dest: str
    label: str
    """How messages name it: ``--split``, ``--header/--no-header``."""
    arguments: tuple[tuple[str, Mapping[str, Any]], ...]
    """(flag, :meth:`argparse.ArgumentParser.add_argument` keywords) of each of its flags;
    several flags are mutually exclusive."""
    refused: str = "{label} goes with --format {accepted}, not {fmt}"
    """The one-line error when it is given to a format that does not read it (``{label}``;
    ``{fmt}``: that format; ``{accepted}``: those that read it), or without ``requires``."""
    default: Any = None
    requires: str | None = None
    """The ``dest`` of an option without which this one means nothing."""
    positive: bool = False
    """A size: a value below 1 is refused, whatever the format."""
    group: str | None = None
    """The ``--help`` group it is listed in; None: that of the first format reading it."""

    def value(self, args: argparse.Namespace) -> Any:
        return getattr(args, self.dest, self.default)

    def given(self, args: argparse.Namespace) -> bool:
        """Whether the command line set it (its value is not the default)."""
        return self.value(args) != self.default


def option(flag: str, help: str, *, refused: str | None = None, requires: str | None = None,
           positive: bool = False, group: str | None = None, **argparse_kw: Any
           ) -> FormatOption:
    """A one-flag :class:`FormatOption`, named by ``flag``; ``argparse_kw`` go to argparse."""
    dest = flag.lstrip("-").replace("-", "_")
    default = argparse_kw.get("default", False if argparse_kw.get("action") == "store_true"
                              else None)
    extra = {} if refused is None else {"refused": refused}
    return FormatOption(dest, flag, ((flag, {"help": help, **argparse_kw}),), default=default,
                        requires=requires, positive=positive, group=group, **extra)


SIZES = "sizes (the generators; --features/--classes also generate random features/labels " \
    "for featureless inputs)"
NODES = option("--nodes", "number of nodes", type=int, positive=True, group=SIZES,
               refused="--nodes/--edges do not apply to --format {fmt}")
EDGES = option("--edges", "number of edges", type=int, positive=True, group=SIZES,
               refused="--nodes/--edges do not apply to --format {fmt}")
CLASSES = option("--classes", "number of classes", type=int, positive=True, group=SIZES)
FEATURES = option("--features", "feature dimension", type=int, positive=True, group=SIZES)
EDGE_FEATURES = option(
    "--edge-features", "edge feature dimension, kept with the tiles", type=int, positive=True,
    group=SIZES, refused="--edge-features generates edge features for the generators, not "
    "--format {fmt} (a source's own edge features are kept as they are)")
SIZE_OPTIONS = (NODES, EDGES, CLASSES, FEATURES, EDGE_FEATURES)
"""The sizes, listed first in ``--help`` whichever formats read them."""
COMMON = (CLASSES, FEATURES)
"""Read by every format: a generator draws them, any other source has them generated
(:class:`~plexgt.data.source.GeneratedFeatures`) when it has none of its own."""


@dataclass(frozen=True, eq=False)
class FormatSpec:
    """One source format: what ``plexgt prep`` needs to know of it (module docstring)."""

    name: str
    description: str
    """One line for ``--help``."""
    open: Callable[[argparse.Namespace, HostComm | None], GraphSource]
    """The source, from prep's parsed arguments (only the options it reads are set) and the
    ranks (a :class:`~plexgt.distributed.hostcomm.HostComm` that a counting pass may split;
    or None)."""
    input: str | None = None
    """What ``--input`` names for it, for ``--help``; None: it takes no input (a generator)."""
    recognise: Callable[[Probe], bool] | None = None
    """Whether ``--format auto`` takes a path for this format; None: only ever named."""
    looked_for: str = ""
    """What ``recognise`` looks for, as the message listing them all says it."""
    order: int = 50
    """Recognisers are asked in ascending order (ties: registry order); the first yes wins."""
    options: tuple[FormatOption, ...] = ()
    """The prep options it reads besides :data:`COMMON`."""
    draws_node_data: bool = False
    """``--features``/``--classes`` are its own parameters, not generated over its source."""
    export: Callable[[Path, Path, bool], str] | None = None
    """``plexgt export --format NAME``: writes a ``plexgt predict`` file (its path) in this
    format (the output path; whether an existing one may be replaced) and returns what it
    wrote, one line; None: prep reads the format, export does not write it."""


class FormatRegistry:
    """Source formats by name. Build with ``default_registry()``; add with :meth:`register`."""

    def __init__(self) -> None:
        self._items: dict[str, FormatSpec] = {}
        self._options: dict[str, FormatOption] = {o.dest: o for o in SIZE_OPTIONS}

    def register(self, spec: FormatSpec, replace: bool = False) -> FormatSpec:
        if spec.name == AUTO:
            raise ValueError(f"source format {AUTO!r} is --format's own")
        if spec.name in self._items and not replace:
            raise ValueError(f"source format {spec.name!r} is already registered")
        for opt in spec.options:
            known = self._options.get(opt.dest)
            if known is not None and known is not opt:
                raise ValueError(f"source format {spec.name!r}: option {opt.label} is "
                                 f"declared twice (dest {opt.dest!r})")
        self._items[spec.name] = spec
        self._options.update((o.dest, o) for o in spec.options)
        return spec

    def get(self, name: str) -> FormatSpec:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown source format {name!r}; known: "
                           f"{', '.join(self._items)}") from None

    def names(self) -> list[str]:
        return list(self._items)

    def options(self) -> list[FormatOption]:
        """Every option of the registered formats: the sizes, then each format's, in order."""
        return list(self._options.values())

    def reads(self, spec: FormatSpec, opt: FormatOption) -> bool:
        return opt in COMMON or any(o is opt for o in spec.options)

    def readers(self, opt: FormatOption) -> list[FormatSpec]:
        """The formats that read ``opt``."""
        return [s for s in self if self.reads(s, opt)]

    def __iter__(self) -> Iterator[FormatSpec]:
        return iter(self._items.values())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)
