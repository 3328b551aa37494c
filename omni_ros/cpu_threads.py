"""torch's CPU thread pool: how many threads, and whether they spin while they wait, set before torch starts.

A robot computer always runs other processes. torch's OpenMP workers (libgomp) spin for a while after each
parallel region by default; when another process keeps one core busy, a spinning worker and that process fight
for the core and every parallel region waits for the loser (measured: the demo policy's inference p95 went from
14.6 ms to 160 ms, DESIGN.md section 11). `OMP_WAIT_POLICY=PASSIVE` makes idle workers sleep instead.

libgomp reads OMP_WAIT_POLICY and OMP_NUM_THREADS once, when it is loaded, which is when torch is imported. So:

- `apply_defaults()` runs when the `omni_ros` package is imported (omni_ros/__init__.py), before any of our code
  can import torch: every entry point that imports omni_ros first (the CLI, the nodes, the bridge, the
  evaluator, the benchmarks) gets PASSIVE. A value already in the environment is the user's and wins.
- `configure(policy_config)` applies `policy.omp_wait_policy` and `policy.num_threads` once the config is read
  (the CLI and the node mains call it before building a policy). Before torch is imported it sets the
  environment; after, the thread count still changes (`torch.set_num_threads`) but the wait policy cannot, and
  it says so once instead of pretending.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

logger = logging.getLogger("omni_ros.cpu_threads")

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
NUM_THREADS_ENV = "OMP_NUM_THREADS"
DEFAULT_WAIT_POLICY = "passive"
# "runtime": leave the OpenMP runtime's own default (libgomp: spin a while, then sleep).
WAIT_POLICIES = ("passive", "active", "runtime")

_warned: set[str] = set()


@dataclass(frozen=True)
class ThreadSettings:
    """What is in effect for this process, as far as it can be known."""

    wait_policy: str  # passive, active, or runtime
    num_threads: int  # 0: torch's default
    torch_imported: bool

    def to_dict(self) -> dict[str, Any]:
        return {"wait_policy": self.wait_policy, "num_threads": self.num_threads, "torch_imported": self.torch_imported}


def torch_imported() -> bool:
    return "torch" in sys.modules


def apply_defaults() -> None:
    """PASSIVE waiting unless the environment says otherwise; a no-op once torch is loaded."""
    if WAIT_POLICY_ENV in os.environ or torch_imported():
        return
    os.environ[WAIT_POLICY_ENV] = DEFAULT_WAIT_POLICY.upper()


def current() -> ThreadSettings:
    value = os.environ.get(WAIT_POLICY_ENV, "").strip().lower()
    wait = value if value in ("passive", "active") else "runtime"
    threads = 0
    if torch_imported():
        threads = int(sys.modules["torch"].get_num_threads())
    else:
        try:
            threads = int(os.environ.get(NUM_THREADS_ENV, "0"))
        except ValueError:
            threads = 0
    return ThreadSettings(wait, threads, torch_imported())


def configure(policy: Any = None, *, wait_policy: str | None = None, num_threads: int | None = None) -> ThreadSettings:
    """Apply a `policy:` config section (its `omp_wait_policy` and `num_threads`), or explicit values.

    wait_policy None keeps what is in effect (the environment's, else our PASSIVE default); num_threads None
    or 0 keeps torch's default (one per physical core).
    """
    if policy is not None:
        wait_policy = getattr(policy, "omp_wait_policy", None) if wait_policy is None else wait_policy
        num_threads = getattr(policy, "num_threads", 0) if num_threads is None else num_threads
    if wait_policy is not None:
        wait_policy = wait_policy.lower()
        if wait_policy not in WAIT_POLICIES:
            raise ValueError(f"omp_wait_policy must be one of {', '.join(WAIT_POLICIES)}, got {wait_policy!r}")
        if current().wait_policy != wait_policy:
            if torch_imported():
                _warn_once(
                    f"policy.omp_wait_policy: {wait_policy} asked for after torch was imported; the OpenMP wait "
                    f"policy stays {current().wait_policy} (set {WAIT_POLICY_ENV} in the environment, or import "
                    f"omni_ros before torch)"
                )
            elif wait_policy == "runtime":
                os.environ.pop(WAIT_POLICY_ENV, None)
            else:
                os.environ[WAIT_POLICY_ENV] = wait_policy.upper()
    if num_threads:
        if num_threads < 0:
            raise ValueError(f"num_threads must be >= 0, got {num_threads}")
        if torch_imported():
            torch = sys.modules["torch"]
            if torch.get_num_threads() != num_threads:
                torch.set_num_threads(num_threads)
        else:
            os.environ[NUM_THREADS_ENV] = str(num_threads)
    return current()


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads at `n` for a block, restored after (0: unchanged). For a stage whose GEMMs run on
    another pool (XNNPACK's) and whose own torch ops are too small to share: with passive waiting, each parallel
    region of a second torch thread costs a wake-up that a small op does not repay."""
    import torch

    before = torch.get_num_threads()
    if n <= 0 or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class StepThreads:
    """torch's intra-op threads for a loop of equal steps (denoising), chosen by timing them.

    Whether a step's torch ops (products of a chunk's few rows, norms, rotary, attention over the cached prefix)
    are worth a second torch thread depends on the model, the kernels and the machine: where XNNPACK runs the
    GEMMs on its own pool, one torch thread made a full-size SmolVLA's ten steps 21% faster on the AMD EPYC with
    VNNI (497 against 629 ms) and the edge pi0's 12% slower (113 against 101 ms; bench/results/
    xnnpack_glue_*vnni.json); on the Intel Xeon with AMX, with torch's passive waiting, one thread ran the edge
    pi0's ten steps in 159 ms against 222 (fp32), 99 against 154 (bf16) and 114 against 265 (oneDNN int8;
    bench/results/step_threads.json). So the loop tries both: after `warmup` steps, steps alternate between the
    candidates until each has `samples` timings, then the one with the lower median runs every later step.
    """

    def __init__(self, candidates: tuple[int, ...], samples: int = 8, warmup: int = 10) -> None:
        self.candidates = tuple(dict.fromkeys(n for n in candidates if n > 0))
        self.samples, self.warmup = samples, warmup
        self.timings: dict[int, list[float]] = {n: [] for n in self.candidates}
        self.chosen: int | None = self.candidates[0] if len(self.candidates) == 1 else None
        self._steps = 0

    def next(self) -> int:
        """The thread count for the next step."""
        if self.chosen is not None:
            return self.chosen
        if self._steps < self.warmup:
            return self.candidates[-1]
        return min(self.candidates, key=lambda n: len(self.timings[n]))

    def record(self, threads: int, seconds: float) -> None:
        """A step ran `seconds` on `threads` threads (from `next()`)."""
        self._steps += 1
        if self.chosen is not None or self._steps <= self.warmup:
            return
        self.timings[threads].append(seconds)
        if all(len(t) >= self.samples for t in self.timings.values()):
            medians = {n: sorted(t)[len(t) // 2] for n, t in self.timings.items()}
            self.chosen = min(medians, key=medians.__getitem__)
            summary = ", ".join(f"{medians[n] * 1e3:.1f} ms on {n}" for n in self.candidates)
            logger.info("denoising steps: %d torch thread(s) (a step took %s)", self.chosen, summary)

    def step(self, run: Callable[[], T]) -> T:
        """`run()` as one step, on the threads `next()` says, timed."""
        threads = self.next()
        with torch_threads(threads):
            start = time.perf_counter()
            out = run()
            self.record(threads, time.perf_counter() - start)
        return out


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)
