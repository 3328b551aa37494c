"""Idle cores kept polling while an inference runs: Linux's CPU latency request (PM QoS, /dev/cpu_dma_latency).

With torch's passive waiting (omni_ros/cpu_threads.py) an OpenMP worker with nothing to do sleeps at once and its
core goes idle; the next parallel region, microseconds later, waits for that core to leave its idle state. On a
virtual machine that is a halted vCPU's exit and re-entry through the hypervisor, on bare metal a C-state's exit
latency, and a denoising step is hundreds of parallel regions: on the 2-vCPU Intel Xeon (AMX) a compiled
full-size SmolVLA's ten int8 steps took 513 ms on 2 torch threads against 404 on one, so the product ran them on
one thread and left the second core half idle (bench/results/step_threads_compiled_smolvla_idle_poll_off.json).
With the request below held: 300 against 370 ms, and the chunk 803 ms against 929
(bench/results/step_threads_compiled_smolvla_idle_poll_on.json).

While a process keeps a request of 0 us open on /dev/cpu_dma_latency, the kernel's cpuidle keeps every idle core
in its polling state (`POLL`, exit latency 0): a woken thread runs within microseconds. Unlike spinning OpenMP
workers (`omp_wait_policy: brief`), nothing competes with other processes for a core: the polling is the idle
task's, which yields to any runnable thread at once, so the simulator or driver beside the policy keeps its share.
The request is held only while an inference runs (`held()`, around the runner's `sample`), so between chunks and
when the robot is idle the cores sleep as before. The device is root's; a robot that runs its nodes as a user
grants a group write access with a udev rule (docs/policy.md, "Idle cores polling while inferring").

`policy.cpu_idle_poll`: auto (hold it where the device can be written, else run without and say so once at info),
on (the same, but a warning where it cannot), off (never).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("omni_ros.cpu_idle")

DEVICE = Path("/dev/cpu_dma_latency")
MODES = ("auto", "on", "off")
# The request held while inferring, in microseconds: 0 leaves cpuidle only its polling state (any halt or
# C-state has an exit latency above 0: the haltpoll VM's "haltpoll idle" 1 us, an Intel C1 1-2 us).
LATENCY_US = 0


@dataclass(frozen=True)
class IdlePoll:
    """Whether inference holds the request, and why ("off: /dev/cpu_dma_latency missing")."""

    active: bool
    reason: str

    def describe(self) -> str:
        return ("on: " if self.active else "off: ") + self.reason


class LatencyRequest:
    """A process's request on `device`: opened by the first `held()` caller, closed when the last one leaves."""

    def __init__(self, device: Path = DEVICE, mode: str = "auto") -> None:
        self.mode = mode
        self.device = device
        self._lock = threading.Lock()
        self._users = 0
        self._fd: int | None = None
        self._failed = ""  # why opening the device failed at run time ('' while it has not)
        self._said: set[str] = set()

    def status(self) -> IdlePoll:
        if self.mode == "off":
            return IdlePoll(False, "policy.cpu_idle_poll off")
        if self._failed:
            return IdlePoll(False, self._failed)
        if not os.access(self.device, os.W_OK):
            why = "missing" if not self.device.exists() else "not writable by this user (root's; a udev rule grants it)"
            return IdlePoll(False, f"{self.device} {why}")
        return IdlePoll(True, f"{self.device} held at {LATENCY_US} us (policy.cpu_idle_poll {self.mode})")

    @property
    def holding(self) -> bool:
        """Whether the request is open now (some `held()` block is running)."""
        return self._fd is not None

    def say(self, state: IdlePoll) -> None:
        """Once per reason: a warning where `on` was asked for and cannot be had, info otherwise."""
        text = state.describe()
        if text in self._said:
            return
        self._said.add(text)
        level = logging.WARNING if self.mode == "on" and not state.active else logging.INFO
        logger.log(level, "cpu idle polling %s", text)

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0 and self._fd is None and self.status().active:
                self._open()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0 and self._fd is not None:
                    os.close(self._fd)  # the kernel drops the request with its file
                    self._fd = None

    def _open(self) -> None:
        try:
            fd = os.open(self.device, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            self._failed = f"{self.device} could not be opened ({exc.strerror})"
            self.say(self.status())
            return
        try:
            os.write(fd, struct.pack("i", LATENCY_US))  # a binary s32, as the device takes it
        except OSError as exc:
            os.close(fd)
            self._failed = f"{self.device} refused the request ({exc.strerror})"
            self.say(self.status())
            return
        self._fd = fd


# This process's request (the kernel keeps one per open file; one is enough for every thread).
REQUEST = LatencyRequest()


def configure(mode: str) -> IdlePoll:
    """Apply `policy.cpu_idle_poll` (auto, on, off) for this process; returns what inference will do."""
    mode = mode.lower()
    if mode not in MODES:
        raise ValueError(f"cpu_idle_poll must be one of {', '.join(MODES)}, got {mode!r}")
    REQUEST.mode = mode
    state = REQUEST.status()
    REQUEST.say(state)
    return state


def status() -> IdlePoll:
    """What `held()` does in this process now."""
    return REQUEST.status()


def held() -> AbstractContextManager[None]:
    """A block during which idle cores poll (where `status().active`); nests, and is shared across threads."""
    return REQUEST.held()
