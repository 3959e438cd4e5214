"""``--format auto``: which reader a path needs, from the path alone (layout, extension, keys).

Why guess at all: a user with a file in hand should not have to learn plexgt's format names
first; a wrong guess is impossible to miss (the reader's own checks refuse the file), and a
path that matches nothing gets a message listing everything that was looked for. What each
format looks for is its spec's (``recognise``, ``looked_for``, ``order``): this module only
asks them in order, over one :class:`~plexgt.data.formats.spec.Probe` of the path.
"""

from __future__ import annotations

from pathlib import Path

from plexgt.data.formats.registry import default_registry
from plexgt.data.formats.spec import FormatRegistry, Probe
from plexgt.errors import DataError


def detect_format(path: Path, formats: FormatRegistry | None = None) -> str:
    """The ``--format`` of ``path`` among ``formats`` (default: the built-in ones); DataError
    listing what was looked for when none fits."""
    formats = default_registry() if formats is None else formats
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    probe = Probe(path)
    rules = sorted((s for s in formats if s.recognise is not None), key=lambda s: s.order)
    for spec in rules:
        if spec.recognise(probe):
            return spec.name
    seen = probe.seen()
    looked = "; ".join(f"{s.looked_for} ({s.name})" for s in rules)
    raise DataError(f"{path}: {seen + '; ' if seen else ''}--format auto cannot tell its "
                    f"format; it looked for {looked} (give --format)")
