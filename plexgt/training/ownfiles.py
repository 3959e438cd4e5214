"""plexgt's own files in a directory it shares with its user (the checkpoint directory).

plexgt deletes or overwrites only files it created and follows no symlink it did not make.
So a file it keeps there is recognised as its own by its content (a first-line marker, or the
exact format it writes) before it is replaced or removed; a symbolic link, a directory or a
file of another content in its place is refused in one line. A file is replaced by writing a
temporary one created with O_EXCL | O_NOFOLLOW (``tempfile.mkstemp``, or a fixed name opened
so) and renaming it over the old one, which replaces a name and never writes through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from plexgt.errors import CheckpointError

Ours = Callable[[str], object]
"""Whether (truthy) a file's text is one plexgt writes (its first line, or its format)."""

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def symlink_error(path: Path) -> CheckpointError:
    return CheckpointError(f"{path}: is a symbolic link; plexgt follows none in its checkpoint "
                           "directory (remove it or use another --checkpoint-dir)")


def foreign_error(path: Path, what: str = "file") -> CheckpointError:
    return CheckpointError(f"{path}: a {what} plexgt did not write; it is never overwritten "
                           "or removed (move it away or use another --checkpoint-dir)")


def os_error(path: Path, e: OSError, doing: str) -> CheckpointError:
    """A one-line CheckpointError naming ``path`` for ``e`` (ELOOP: the symlink message)."""
    if e.errno == errno.ELOOP or (e.errno == errno.EEXIST and os.path.islink(path)):
        return symlink_error(path)  # O_NOFOLLOW's error, or O_EXCL's on a link
    return CheckpointError(f"{path}: cannot {doing} ({e.strerror or e})")


def kind(path: Path) -> str | None:
    """'file', 'dir', 'link' or 'other' for what is at ``path`` (not followed), None if
    nothing is."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        raise os_error(path, e, "inspect it") from None
    if stat.S_ISLNK(mode):
        return "link"
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"


def read_text(path: Path) -> str:
    """A regular file's text, not through a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise os_error(path, e, "read it") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise foreign_error(path, "non-regular file")
        return f.read().decode("utf-8", errors="replace")


def check_own(path: Path, ours: Ours) -> bool:
    """Whether a file of plexgt's is at ``path`` (False: nothing is); CheckpointError if
    something else is (a symlink, a directory, a file ``ours`` does not recognise)."""
    k = kind(path)
    if k is None:
        return False
    if k == "link":
        raise symlink_error(path)
    if k != "file":
        raise foreign_error(path, "directory" if k == "dir" else "non-regular file")
    if not ours(read_text(path)):
        raise foreign_error(path)
    return True


def replace_own(path: Path, text: str, ours: Ours, tmp: str | None = None) -> None:
    """Write ``text`` to ``path``, which must be absent or plexgt's (``ours``): through a new
    temporary file (``tmp``, a fixed name in the same directory, or a random one) renamed
    over it."""
    check_own(path, ours)
    try:
        if tmp is None:
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        else:
            name = str(path.parent / tmp)
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644)
    except OSError as e:
        raise os_error(path.parent / tmp if tmp else path, e, "write it") from None
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide it from the user's group
            f.write(text)
        os.replace(name, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise os_error(path, e, "write it") from None


def remove_own(path: Path, ours: Ours) -> None:
    """Remove ``path`` if it is plexgt's file (nothing there: nothing to do)."""
    if check_own(path, ours):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise os_error(path, e, "remove it") from None
