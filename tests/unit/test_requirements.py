"""setup.cfg's torch floor covers every torch API plexgt calls: an install that satisfies it
imports and runs (torch 2.3 met the old floor, and ``import plexgt.ops`` failed there on
``torch.library.custom_op``)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ADDED_IN = {
    # pattern in plexgt's source -> the torch release that added it
    r"torch\.library\.custom_op\(": (2, 4),
    r"\.register_fake\b": (2, 4),
    r"\.register_autograd\b": (2, 4),
    r"torch\.get_autocast_dtype\(": (2, 4),
    r"torch\.is_autocast_enabled\(\s*[^\s)]": (2, 4),  # with a device type
    r"torch\.serialization\.add_safe_globals\(": (2, 4),
    r"torch\.library\.(triton_op|wrap_triton)\b": (2, 6),
    r"torch\.accelerator\.": (2, 6),
}


def _torch_floor() -> tuple[int, ...]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    for req in cfg["options"]["install_requires"].split():
        m = re.fullmatch(r"torch>=(\d+(?:\.\d+)*)", req)
        if m:
            return tuple(int(x) for x in m.group(1).split("."))
    raise AssertionError("setup.cfg requires no torch>=X.Y")


def test_the_torch_floor_has_every_api_plexgt_calls():
    source = {p: p.read_text() for p in (ROOT / "plexgt").rglob("*.py")}
    used = {pat: min(str(p.relative_to(ROOT)) for p, text in source.items()
                     if re.search(pat, text))
            for pat in ADDED_IN if any(re.search(pat, t) for t in source.values())}
    assert used, "none of the listed APIs is used: the table is stale"
    floor = _torch_floor()
    newer = {pat: (ADDED_IN[pat], where) for pat, where in used.items() if ADDED_IN[pat] > floor}
    assert not newer, f"setup.cfg says torch>={'.'.join(map(str, floor))}; needs: {newer}"
