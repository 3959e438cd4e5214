"""Every error type plexgt reports to a user as one line (``plexgt CMD: error: ...``, exit 2).

They sit at the bottom of the package so that any layer can raise them and the command line
can catch them all without importing the layers that raise them. Each message names the thing
(a key, a file, a grid) and the problem; the type says who is at fault.
"""

from __future__ import annotations


class PlexgtError(ValueError):
    """Base of the one-line errors: caught by :func:`plexgt.cli.main`."""

    agreed: bool = False
    """Every rank raises this error at a point all ranks reached together, so no rank is left
    waiting and the job needs no abort (set by :func:`mark_agreed`)."""
    origin: int | None = None
    """The rank whose copy of the message is printed (None: the rank that raised it)."""


def mark_agreed(err: BaseException, origin: int) -> None:
    """Record on a one-line error that every rank knows of it and which rank prints it (other
    exceptions are bugs: they end the job with a traceback whatever the ranks agreed)."""
    if isinstance(err, PlexgtError):
        err.agreed, err.origin = True, origin


class UsageError(PlexgtError):
    """Bad command-line input."""


class ConfigError(PlexgtError):
    """A configuration problem, reported as one line naming the key."""


class DataError(PlexgtError):
    """Bad input data. The message names the file (or dataset) and the problem in one line."""


class GridError(PlexgtError):
    """A grid that cannot be built for the requested world size or from the given text."""


class CheckpointError(DataError):
    """A checkpoint that is missing, incomplete, or written by an incompatible run."""


class DeviceError(PlexgtError):
    """Ranks and GPUs that do not match (more ranks than GPUs on a node, two ranks on one)."""


class PeerFailed(PlexgtError):
    """Another rank failed at a point all ranks agree on; that rank prints the message, this
    one exits with the same status and says nothing (one copy of the error, not P)."""


class TrainingError(PlexgtError):
    """A run that cannot go on (a non-finite loss): every rank sees it at once."""
