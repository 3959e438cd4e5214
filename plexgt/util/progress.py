"""A progress bar on stderr that reads well in a terminal and in a batch log alike."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class Progress:
    """A progress bar on stderr: tqdm's on a TTY; in a batch log (Slurm's output file, not a
    TTY) a plain line every ``every_s`` seconds instead, since tqdm redraws one line with
    carriage returns, which a log file keeps as one unreadable line."""

    def __init__(self, label: str, total: float, enabled: bool = True, every_s: float = 5.0,
                 start: float = 0.0) -> None:
        self.label, self.total, self.done = label, max(total, 1.0), start
        self.start = start
        self.tty = sys.stderr.isatty()
        self.enabled = enabled
        self.every = 0.2 if self.tty else every_s
        self.t0 = self.last = time.monotonic()
        self.info = ""
        self._bar = None
        if enabled and self.tty:
            self._bar = tqdm(total=self.total, initial=start, desc=label, file=sys.stderr,
                             mininterval=self.every, dynamic_ncols=True, leave=True)

    def update(self, amount: float, info: str | None = None) -> None:
        """Advance by ``amount``; ``info`` (e.g. the latest loss) is shown after the bar."""
        self.done += amount
        if info is not None:
            self.info = info
        if self._bar is not None:
            if info is not None:
                self._bar.set_postfix_str(info, refresh=False)
            self._bar.update(amount)
            return
        now = time.monotonic()
        if self.enabled and now - self.last >= self.every:
            self.last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = min(1.0, self.done / self.total)
        el = now - self.t0
        run = (self.done - self.start) / self.total  # ETA from this run's own rate (resume)
        eta = el / run * (1.0 - frac) if run > 0 else float("nan")
        bar = "#" * int(frac * 30)
        text = f"{self.label} [{bar:<30}] {100 * frac:5.1f}% {el:6.1f}s eta {eta:6.1f}s"
        if self.info:
            text += " " + self.info
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
