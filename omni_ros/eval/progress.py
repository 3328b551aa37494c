"""A progress bar over bag messages on stderr (redrawn in place on a terminal, a line per 10% otherwise)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, label: str = "messages", stream: TextIO | None = None, enabled: bool = True):
        self.total = max(int(total), 0)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.done = 0
        self.extra = ""
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._last_decile = -1

    def update(self, n: int = 1, extra: str | None = None) -> None:
        self.done += n
        if extra is not None:
            self.extra = extra
        if not self.enabled:
            return
        now = time.monotonic()
        if self._tty:
            if now - self._last_draw >= 0.1:
                self._last_draw = now
                self._draw("\r")
        else:
            decile = int(10 * self.done / self.total) if self.total else 0
            if decile > self._last_decile:
                self._last_decile = decile
                self._draw("")
                self.stream.write("\n")

    def close(self) -> None:
        if not self.enabled:
            return
        if self._tty or self._last_decile < 10:
            self._draw("\r" if self._tty else "")
            self.stream.write("\n")
        self.stream.flush()

    def _draw(self, prefix: str) -> None:
        frac = min(self.done / self.total, 1.0) if self.total else 1.0
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        elapsed = time.monotonic() - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        text = f"{prefix}[{bar}] {frac * 100:5.1f}% {self.done}/{self.total} {self.label} {rate:7.0f}/s {self.extra}"
        self.stream.write(text.rstrip())
        self.stream.flush()
