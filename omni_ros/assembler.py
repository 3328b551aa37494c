"""ObservationAssembler: the latest camera frames, joint state and prompt -> one raw observation.

The policy node feeds it from ROS callbacks and the rosbag evaluator from
recorded messages, so both build observations the same way, with the same
staleness rules:

    assembler.add_image("base", rgb_hwc_uint8, stamp)
    assembler.add_joint_state(names, positions, stamp)
    assembler.add_prompt("reach the red block", stamp)
    obs = assembler.assemble(now)   # raises StaleInput(problem) when unsafe to act on
    problem = assembler.check(now)  # the same question without raising: a Problem or None

Why no observation can be made is data (`Problem`), so callers group, match
and extend it without parsing text; `str(problem)` is the sentence for people.
Times are seconds on one clock. Frames older than the one already held
(out-of-order delivery) are dropped and counted.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from omni_ros.errors import OmniRosError

ProblemKind = Literal["no_frame", "stale", "invalid", "no_state", "no_prompt"]
STATE = "state"
PROMPT = "prompt"
_CAMERA = "camera/"


def camera_source(name: str) -> str:
    """The `Problem.source` (and `Assembled.input_stamps` key) of camera `name`."""
    return _CAMERA + name


@dataclass(frozen=True)
class Problem:
    """Why no observation can be made: what is wrong (`kind`), with which input (`source`), and the specifics.

    `source` is "camera/<name>", "state" or "prompt" (the keys of `Assembled.input_stamps`); `detail` holds the
    measurement or specifics ("0.62 s old > 0.5 s", "lacks joints ['j2']").
    """

    kind: ProblemKind
    source: str
    detail: str = ""

    @property
    def camera(self) -> str | None:
        """The camera this problem is about, if any."""
        return self.source[len(_CAMERA) :] if self.source.startswith(_CAMERA) else None

    @property
    def summary(self) -> str:
        """The problem without its measurements, so equal problems group: "camera 'base' is stale"."""
        return f"{self._subject()} is stale" if self.kind == "stale" else str(self)

    def _subject(self) -> str:
        camera = self.camera
        if camera is not None:
            return f"camera '{camera}'"
        return "joint state" if self.source == STATE else self.source

    def __str__(self) -> str:
        subject = self._subject()
        if self.kind == "no_frame":
            return f"no frame yet from {subject}"
        if self.kind in ("no_state", "no_prompt"):
            return f"no {subject} yet"
        if self.kind == "stale":
            return f"{subject} is stale" + (f" ({self.detail})" if self.detail else "")
        return f"{subject} {self.detail}"


class StaleInput(OmniRosError):
    """An input is missing, too old or invalid; no observation (and no command) now."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


@dataclass
class Assembled:
    """A raw observation (the `Policy.infer` dict) and the stamp it stands for (its oldest input)."""

    obs: dict[str, Any]
    stamp: float
    input_stamps: dict[str, float] = field(default_factory=dict)


@dataclass
class AssemblerStats:
    images: int = 0
    joint_states: int = 0
    dropped_out_of_order: int = 0
    rejected: int = 0
    last_reject_reason: str = ""


class ObservationAssembler:
    def __init__(
        self,
        camera_names: Sequence[str],
        joint_names: Sequence[str],
        camera_stale_s: float = 0.5,
        state_stale_s: float = 0.25,
        prompt_stale_s: float | None = None,
        default_prompt: str = "",
    ) -> None:
        self.camera_names = tuple(camera_names)
        self.joint_names = tuple(joint_names)
        self.camera_stale_s = camera_stale_s
        self.state_stale_s = state_stale_s
        self.prompt_stale_s = prompt_stale_s
        self.stats = AssemblerStats()
        self._lock = threading.Lock()
        self._images: dict[str, tuple[np.ndarray, float]] = {}
        self._state: tuple[np.ndarray, float] | None = None
        self._state_problem: Problem | None = None
        self._prompt: tuple[str, float] | None = (default_prompt, -math.inf) if default_prompt else None
        self._default_prompt = default_prompt

    def add_image(self, camera: str, image: np.ndarray, stamp: float) -> bool:
        """Keep `image` as the camera's latest frame unless an newer one is already held."""
        if camera not in self.camera_names:
            return self._reject(f"unknown camera '{camera}'")
        with self._lock:
            held = self._images.get(camera)
            if held is not None and stamp < held[1]:
                self.stats.dropped_out_of_order += 1
                return False
            self._images[camera] = (image, stamp)
            self.stats.images += 1
        return True

    def add_joint_state(self, names: Sequence[str], positions: Sequence[float], stamp: float) -> bool:
        """Reorder by the configured joint names; missing joints or NaNs make the state invalid (stale)."""
        index = {n: i for i, n in enumerate(names)}
        missing = [n for n in self.joint_names if n not in index]
        with self._lock:
            if self._state is not None and stamp < self._state[1]:
                self.stats.dropped_out_of_order += 1
                return False
            if missing:
                detail = f"lacks joints {missing}"
            elif len(positions) < len(names):
                detail = f"has {len(names)} names but {len(positions)} positions"
            else:
                q = np.array([positions[index[n]] for n in self.joint_names], dtype=np.float32)
                bad = [self.joint_names[i] for i in np.flatnonzero(~np.isfinite(q))]
                if not bad:
                    self._state_problem = None
                    self._state = (q, stamp)
                    self.stats.joint_states += 1
                    return True
                detail = f"has non-finite positions for {bad}"
            self._state_problem = Problem("invalid", STATE, detail)
            self.stats.rejected += 1
            self.stats.last_reject_reason = str(self._state_problem)
            return False

    def add_prompt(self, text: str, stamp: float) -> None:
        text = text.strip()
        with self._lock:
            self._prompt = (text, stamp) if text else None

    def has_prompt(self) -> bool:
        """Whether any prompt is held (from the topic, a goal or the configured default), stale or not."""
        with self._lock:
            return self._prompt is not None

    def latest_state(self) -> np.ndarray | None:
        with self._lock:
            return None if self._state is None else self._state[0].copy()

    def check(self, now: float) -> Problem | None:
        """Why no observation can be made at `now` (None when one can)."""
        with self._lock:
            return self._problem(now)

    def assemble(self, now: float) -> Assembled:
        with self._lock:
            problem = self._problem(now)
            if problem is not None:
                raise StaleInput(problem)
            held_state, held_prompt = self._state, self._prompt
            assert held_state is not None and held_prompt is not None  # no problem: both are held
            images = {name: self._images[name][0] for name in self.camera_names}
            stamps = {camera_source(name): self._images[name][1] for name in self.camera_names}
            stamps[STATE] = held_state[1]
            prompt = held_prompt[0]
            state = held_state[0].copy()
        return Assembled({"images": images, "state": state, "prompt": prompt}, min(stamps.values()), stamps)

    def _problem(self, now: float) -> Problem | None:
        for name in self.camera_names:
            if name not in self._images:
                return Problem("no_frame", camera_source(name))
            age = now - self._images[name][1]
            if age > self.camera_stale_s:
                return Problem("stale", camera_source(name), f"{age:.2f} s old > {self.camera_stale_s} s")
        if self._state_problem is not None:
            return self._state_problem
        if self._state is None:
            return Problem("no_state", STATE)
        age = now - self._state[1]
        if age > self.state_stale_s:
            return Problem("stale", STATE, f"{age:.2f} s old > {self.state_stale_s} s")
        if self._prompt is None:
            return Problem("no_prompt", PROMPT)
        if self.prompt_stale_s is not None and now - self._prompt[1] > self.prompt_stale_s:
            return Problem("stale", PROMPT, f"> {self.prompt_stale_s} s old")
        return None

    def _reject(self, reason: str) -> bool:
        with self._lock:
            self.stats.rejected += 1
            self.stats.last_reject_reason = reason
        return False
