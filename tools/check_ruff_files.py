"""Fail when ``ruff check`` would skip a Python file of the package.

ruff's default excludes skip any folder named like a build output (``dist``, ``build``, ...),
which once left ``plexgt/dist/`` unlinted for months; this lists what ruff checks
(``ruff check --show-files``) and compares it with every ``.py`` file under ``plexgt/``.
usage: python tools/check_ruff_files.py RUFF
"""

import subprocess
import sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent
out = subprocess.run([sys.argv[1], "check", "--show-files", "."], cwd=root, check=True,
                     capture_output=True, text=True).stdout
shown = {Path(line.strip()).resolve() for line in out.splitlines() if line.strip()}
missing = sorted(p for p in (root / "plexgt").rglob("*.py") if p.resolve() not in shown)
for p in missing:
    print(f"ruff does not check {p.relative_to(root)}", file=sys.stderr)
if missing:
    sys.exit(1)
print(f"ruff checks every one of the package's {len(list((root / 'plexgt').rglob('*.py')))} "
      ".py files")
