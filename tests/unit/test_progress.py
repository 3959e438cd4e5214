"""The progress bar: tqdm's on a terminal, plain lines in a batch log."""

from __future__ import annotations

import io
import sys

from plexgt.util.progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_tqdm_and_a_log_gets_lines(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    p = Progress("train", 4, every_s=0.0)
    for _ in range(4):
        p.update(1, info="loss=1.0")
    p.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 4 and "\r" not in log.getvalue()
    assert lines[-1].startswith("train [") and "100.0%" in lines[-1] and "loss=1.0" in lines[-1]
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    p = Progress("prep: building tiles", 10, start=2)
    p.update(8, info="x=1")
    p.close()
    out = tty.getvalue()
    assert "\r" in out and "prep: building tiles" in out and "10/10" in out and "x=1" in out
    quiet = _Tty()
    monkeypatch.setattr(sys, "stderr", quiet)
    p = Progress("off", 3, enabled=False)
    p.update(3)
    p.close()
    assert quiet.getvalue() == ""
