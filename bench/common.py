"""What the benchmarks share: the median timing loop, and the one way each hands over its result (JSON on
stdout, and in --out when given)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Importing omni_ros puts torch's thread settings (OMP_WAIT_POLICY) in place before anything loads torch, in this
# process and the workers it starts (omni_ros/cpu_threads.py); benchmarks measure what the product runs.
import omni_ros  # noqa: F401


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
