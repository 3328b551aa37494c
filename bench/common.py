"""What the benchmarks share: the median timing loop, and the one way each hands over its result (JSON on
stdout, and in --out when given)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def emit(report: dict[str, Any], out: str | None) -> None:
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n", encoding="utf-8")


def timings_ms(fn: Callable[[], object], runs: int, warmup: int = 1) -> list[float]:
    """Wall times of `fn` in milliseconds over `runs` calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def median_ms(fn: Callable[[], object], runs: int, warmup: int = 1) -> float:
    return round(statistics.median(timings_ms(fn, runs, warmup)), 3)


class SpawnedServer:
    """`target(*args, pipe, stop)` in a spawned process: it sends its port on `pipe` once it serves, and
    returns when `stop` is set. `with SpawnedServer(main, ...) as url:` is the server's ws:// URL."""

    def __init__(self, target: Callable[..., None], *args: Any, start_timeout_s: float = 600.0) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._parent, child = ctx.Pipe()
        self._stop = ctx.Event()
        self._timeout = start_timeout_s
        self._proc = ctx.Process(target=target, args=(*args, child, self._stop), daemon=True)

    def __enter__(self) -> str:
        self._proc.start()
        if not self._parent.poll(self._timeout):
            raise RuntimeError("benchmark server did not start")
        return f"ws://127.0.0.1:{self._parent.recv()}"

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._proc.join(30)
        if self._proc.is_alive():
            self._proc.kill()
