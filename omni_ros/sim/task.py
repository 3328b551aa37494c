"""The language task: "reach the red block" and its phrasings, the success test, episode sampling."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from omni_ros.sim.scene import COLORS, Scene

TEMPLATES = (
    "reach the {color} block",
    "touch the {color} block",
    "move to the {color} block",
    "go to the {color} block",
    "put the gripper on the {color} block",
    "point at the {color} cube",
)
_COLOR_WORD = re.compile(r"\b(" + "|".join(COLORS) + r")\b")


def make_prompt(color: str, template: int = 0) -> str:
    if color not in COLORS:
        raise ValueError(f"unknown color {color!r}; known: {sorted(COLORS)}")
    return TEMPLATES[template % len(TEMPLATES)].format(color=color)


def parse_target(prompt: str) -> str | None:
    """The block color a prompt asks for (the first color word), or None."""
    match = _COLOR_WORD.search(prompt.lower())
    return match.group(1) if match else None


@dataclass(frozen=True)
class Task:
    """One episode's goal: which block, how it was asked, how close counts."""

    target: str
    prompt: str
    success_radius: float

    def distance(self, scene: Scene, tip: np.ndarray) -> float:
        return float(np.linalg.norm(np.asarray(tip) - np.asarray(scene.block(self.target).xy)))

    def success(self, scene: Scene, tip: np.ndarray) -> bool:
        """The gripper's tool point is within `success_radius` of the prompted block's centre."""
        return self.distance(scene, tip) <= self.success_radius


def sample_task(
    rng: np.random.Generator, scene: Scene, success_radius: float, target: str | None = None, prompt: str | None = None
) -> Task:
    """A random target block and phrasing; `target` or `prompt` pin them (prompt-following tests)."""
    if prompt is not None:
        named = parse_target(prompt)
        if named is None:
            raise ValueError(f"prompt {prompt!r} names no block color; known: {sorted(COLORS)}")
        if target is not None and target != named:
            raise ValueError(f"prompt {prompt!r} asks for {named}, not {target}")
        target = named
    if target is None:
        target = scene.colors[int(rng.integers(len(scene.blocks)))]
    scene.block(target)  # raises when that block is not on the table
    if prompt is None:
        prompt = make_prompt(target, int(rng.integers(len(TEMPLATES))))
    return Task(target=target, prompt=prompt, success_radius=success_radius)


class SuccessHold:
    """Success needs the goal held: `update` after every step; `succeeded_at` is when it had held `hold_s`."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = float(hold_s)
        self.reset()

    def reset(self) -> None:
        self.since: float | None = None
        self.succeeded_at: float | None = None

    def update(self, on_target: bool, now: float, dt: float) -> None:
        """`on_target` measured at `now`, after a step of `dt` (which counts as on target)."""
        if self.succeeded_at is not None:
            return
        if not on_target:
            self.since = None
            return
        self.since = now - dt if self.since is None else self.since
        if now - self.since >= self.hold_s - 1e-9:
            self.succeeded_at = now


class EpisodeClock:
    """Episode time and outcome, shared by the simulators: they set `config`, `time` and `_hold`."""

    config: Any
    time: float
    _hold: SuccessHold

    @property
    def succeeded_at(self) -> float | None:
        """Simulated time the episode succeeded (the goal held for success_hold_s), or None."""
        return self._hold.succeeded_at

    @property
    def done(self) -> bool:
        return self.time >= self.config.episode_time_s

    def _score_step(self, dt: float) -> None:
        """After a step of `dt` ending at `time`: success counts only within the episode. A simulator that
        keeps running past the end (the node waits `auto_reset_s` before the next episode) must not turn a
        failed episode into a late success."""
        if self._hold.succeeded_at is None and self.time <= self.config.episode_time_s + 1e-9:
            self._hold.update(self.success(), self.time, dt)

    def success(self) -> bool:
        raise NotImplementedError
