"""ObservationAssembler: the latest camera frames, joint state and prompt -> one raw observation.

The policy node feeds it from ROS callbacks and the rosbag evaluator from
recorded messages, so both build observations the same way, with the same
staleness rules:

    assembler.add_image("base", rgb_hwc_uint8, stamp)
    assembler.add_joint_state(names, positions, stamp)
    assembler.add_prompt("reach the red block", stamp)
    obs = assembler.assemble(now)   # raises StaleInput(reason) when unsafe to act on

Times are seconds on one clock. Frames older than the one already held
(out-of-order delivery) are dropped and counted.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_ros.errors import OmniRosError


class StaleInput(OmniRosError):
    """An input is missing, too old or invalid; no observation (and no command) now."""


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
        self._state_problem = ""
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
                self._state_problem = f"joint state lacks joints {missing}"
            elif len(positions) < len(names):
                self._state_problem = f"joint state has {len(names)} names but {len(positions)} positions"
            else:
                q = np.array([positions[index[n]] for n in self.joint_names], dtype=np.float32)
                bad = [self.joint_names[i] for i in np.flatnonzero(~np.isfinite(q))]
                if bad:
                    self._state_problem = f"joint state has non-finite positions for {bad}"
                else:
                    self._state_problem = ""
                    self._state = (q, stamp)
                    self.stats.joint_states += 1
                    return True
            self.stats.rejected += 1
            self.stats.last_reject_reason = self._state_problem
            return False

    def add_prompt(self, text: str, stamp: float) -> None:
        text = text.strip()
        with self._lock:
            self._prompt = (text, stamp) if text else None

    def latest_state(self) -> np.ndarray | None:
        with self._lock:
            return None if self._state is None else self._state[0].copy()

    def check(self, now: float) -> str:
        """Why no observation can be made at `now` ('' when one can)."""
        with self._lock:
            return self._problem(now)

    def assemble(self, now: float) -> Assembled:
        with self._lock:
            problem = self._problem(now)
            if problem:
                raise StaleInput(problem)
            images = {name: self._images[name][0] for name in self.camera_names}
            stamps = {f"camera/{name}": self._images[name][1] for name in self.camera_names}
            stamps["state"] = self._state[1]
            prompt = self._prompt[0]
            state = self._state[0].copy()
        return Assembled({"images": images, "state": state, "prompt": prompt}, min(stamps.values()), stamps)

    def _problem(self, now: float) -> str:
        for name in self.camera_names:
            if name not in self._images:
                return f"no frame yet from camera '{name}'"
            age = now - self._images[name][1]
            if age > self.camera_stale_s:
                return f"camera '{name}' is stale ({age:.2f} s old > {self.camera_stale_s} s)"
        if self._state_problem:
            return self._state_problem
        if self._state is None:
            return "no joint state yet"
        age = now - self._state[1]
        if age > self.state_stale_s:
            return f"joint state is stale ({age:.2f} s old > {self.state_stale_s} s)"
        if self._prompt is None:
            return "no prompt yet"
        if self.prompt_stale_s is not None and now - self._prompt[1] > self.prompt_stale_s:
            return f"prompt is stale (> {self.prompt_stale_s} s old)"
        return ""

    def _reject(self, reason: str) -> bool:
        with self._lock:
            self.stats.rejected += 1
            self.stats.last_reject_reason = reason
        return False
