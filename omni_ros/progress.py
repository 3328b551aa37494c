"""A dependency-free progress bar for long commands (collect, train, eval).

On a terminal it redraws one line; otherwise (logs, CI) it prints a line
every `every` updates and at the end, so log files stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(
        self, total: int, label: str = "", every: int = 0, stream: TextIO | None = None, enabled: bool = True
    ) -> None:
        self.total = max(1, int(total))
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every if every > 0 else max(1, self.total // 20)
        self.start = time.monotonic()
        self.done = 0
        self._start_done = 0
        self._next_line = self.every
        self._closed = False

    def resume_from(self, done: int) -> None:
        """Count `done` as already finished (a resumed run) without crediting it to this run's speed."""
        self.done = self._start_done = int(done)

    def update(self, n: int = 1, **fields: float | str) -> None:
        self.done += n
        if not self.enabled or self._closed:
            return
        final = self.done >= self.total
        if self.tty or final or self.done >= self._next_line:
            self._next_line = (self.done // self.every + 1) * self.every
            self._draw(fields, final=final)
            self._closed = final

    def close(self) -> None:
        """End the bar (a final line) if updates stopped short of `total`."""
        if self.enabled and not self._closed:
            self._draw({}, final=True)
            self._closed = True

    def _draw(self, fields: dict[str, float | str], final: bool) -> None:
        elapsed = time.monotonic() - self.start
        rate = (self.done - self._start_done) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        width = 24
        filled = int(width * min(self.done, self.total) / self.total)
        extra = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items())
        line = (
            f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
            f"{rate:.1f}/s {_clock(elapsed)}<{_clock(eta)} {extra}"
        ).rstrip()
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds < 3600 else f"{seconds // 3600}h{seconds // 60 % 60:02d}"
