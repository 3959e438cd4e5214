"""Files plexgt writes whole or not at all, and reads with a one-line error.

A JSON record is written to a temporary file created with O_EXCL | O_NOFOLLOW beside it
(``tempfile.mkstemp``), synced, then renamed over the target: readers see all of it or none,
and a symlink planted at a fixed temporary name is never written through.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from plexgt.errors import DataError


def sha256_file(path: Path, block: int = 8 << 20) -> str:
    """Hex sha256 of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(block)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path.tmp``, fsync, then rename: readers see all of it or nothing. The
    temporary is created anew (O_EXCL | O_NOFOLLOW, a leftover of a killed run unlinked
    first), so nothing is ever written through a link planted at its name."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> Any:
    """A JSON file's content; DataError naming the file when it is missing or not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: corrupt JSON ({e})") from None
