"""torch's CPU thread pool: how many threads, and whether they spin while they wait, set before torch starts.

A robot computer always runs other processes. torch's OpenMP workers (libgomp) spin for a while after each
parallel region by default; when another process keeps one core busy, a spinning worker and that process fight
for the core and every parallel region waits for the loser (measured: the demo policy's inference p95 went from
14.6 ms to 160 ms, DESIGN.md section 11). `OMP_WAIT_POLICY=PASSIVE` makes idle workers sleep instead.

Sleeping at once has its own cost where waking a worker is slow: on a virtual machine an idle vCPU is halted and
brought back for each of a model's ops (they follow each other microseconds apart), and on the 2-vCPU Xeon
measured a full-size SmolVLA's denoising products ran no faster on 2 threads than on 1. `brief` keeps PASSIVE but
lets an idle worker spin `BRIEF_SPIN_COUNT` iterations first (libgomp's `GOMP_SPINCOUNT`, ~0.3 ms there):
workers stay awake through a burst of ops. It is not the default: beside a process that keeps a core busy, a
worker that spins loses the scheduler's preference for threads that slept: the `small` preset's p50 went from
100 to 297 ms where passive's stayed at 124-128 (bench/results/contention.json). For a machine the policy has to
itself (a server VM) it is the faster choice.

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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from omni_ros import cpu_idle

T = TypeVar("T")

logger = logging.getLogger("omni_ros.cpu_threads")

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
NUM_THREADS_ENV = "OMP_NUM_THREADS"
# libgomp's spin iterations before an idle worker sleeps; it wins over OMP_WAIT_POLICY's own count (0 for
# PASSIVE, 300,000 unset, 3e10 ACTIVE: libgomp's env.c).
SPIN_COUNT_ENV = "GOMP_SPINCOUNT"
# 10,000 iterations: ~0.3 ms of spinning on the Intel Xeon measured; on a full-size SmolVLA chunk at 2 threads
# 1,000 kept most of the wake-up cost and 30,000 gained little more (scratch sweep: 1,019 / 843 / 816 ms against
# 994 passive).
BRIEF_SPIN_COUNT = 10_000
DEFAULT_WAIT_POLICY = "passive"
# passive: sleep at once; brief: spin BRIEF_SPIN_COUNT, then sleep; active: spin; "runtime": leave the OpenMP
# runtime's own default (libgomp: spin ~3 ms, then sleep).
WAIT_POLICIES = ("passive", "brief", "active", "runtime")

_warned: set[str] = set()


@dataclass(frozen=True)
class ThreadSettings:
    """What is in effect for this process, as far as it can be known."""

    wait_policy: str  # passive, brief, active, or runtime
    num_threads: int  # 0: torch's default
    torch_imported: bool
    idle_poll: cpu_idle.IdlePoll  # whether idle cores poll while inferring, and why

    def to_dict(self) -> dict[str, Any]:
        return {
            "wait_policy": self.wait_policy,
            "num_threads": self.num_threads,
            "torch_imported": self.torch_imported,
            "cpu_idle_poll": self.idle_poll.describe(),
        }

    @property
    def wakes_are_slow(self) -> bool:
        """Whether waking an idle torch worker costs a core's exit from its idle state: passive waiting without
        idle polling. Then a loop of small parallel regions (a compiled denoising step) is better on one thread."""
        return self.wait_policy == "passive" and not self.idle_poll.active


def torch_imported() -> bool:
    return "torch" in sys.modules


def apply_defaults() -> None:
    """The default wait policy unless the environment sets one (either variable); a no-op once torch is loaded."""
    if WAIT_POLICY_ENV in os.environ or SPIN_COUNT_ENV in os.environ or torch_imported():
        return
    set_wait_policy(DEFAULT_WAIT_POLICY)


def wait_policy_env(policy: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with the variables libgomp reads for `policy`: the
    environment of a child process that is to run under that wait policy."""
    env = dict(os.environ if base is None else base)
    for name in (WAIT_POLICY_ENV, SPIN_COUNT_ENV):
        env.pop(name, None)
    if policy in ("passive", "brief"):
        env[WAIT_POLICY_ENV] = "PASSIVE"
    elif policy == "active":
        env[WAIT_POLICY_ENV] = "ACTIVE"
    if policy == "brief":
        env[SPIN_COUNT_ENV] = str(BRIEF_SPIN_COUNT)
    return env


def set_wait_policy(policy: str) -> None:
    """The environment libgomp reads when torch loads (this process's, and the children it starts after)."""
    wanted = wait_policy_env(policy, {})
    for name in (WAIT_POLICY_ENV, SPIN_COUNT_ENV):
        if name in wanted:
            os.environ[name] = wanted[name]
        else:
            os.environ.pop(name, None)


def _wait_policy_in_effect() -> str:
    value = os.environ.get(WAIT_POLICY_ENV, "").strip().lower()
    spin = os.environ.get(SPIN_COUNT_ENV, "").strip()
    if spin and value != "active":  # libgomp: the spin count wins over the policy's own
        return "passive" if spin == "0" else "brief"
    return value if value in ("passive", "active") else "runtime"


def current() -> ThreadSettings:
    wait = _wait_policy_in_effect()
    threads = 0
    if torch_imported():
        threads = int(sys.modules["torch"].get_num_threads())
    else:
        try:
            threads = int(os.environ.get(NUM_THREADS_ENV, "0"))
        except ValueError:
            threads = 0
    return ThreadSettings(wait, threads, torch_imported(), cpu_idle.status())


def configure(
    policy: Any = None,
    *,
    wait_policy: str | None = None,
    num_threads: int | None = None,
    idle_poll: str | None = None,
) -> ThreadSettings:
    """Apply a `policy:` config section (its `omp_wait_policy`, `num_threads` and `cpu_idle_poll`), or explicit
    values.

    wait_policy None keeps what is in effect (the environment's, else our PASSIVE default); num_threads None
    or 0 keeps torch's default (one per physical core); idle_poll None keeps what is set (auto by default).
    """
    if policy is not None:
        wait_policy = getattr(policy, "omp_wait_policy", None) if wait_policy is None else wait_policy
        num_threads = getattr(policy, "num_threads", 0) if num_threads is None else num_threads
        idle_poll = getattr(policy, "cpu_idle_poll", None) if idle_poll is None else idle_poll
    if idle_poll is not None:
        cpu_idle.configure(idle_poll)
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
            else:
                set_wait_policy(wait_policy)
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
