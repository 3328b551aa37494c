"""The language task: "reach the red block" and its phrasings, the success test, episode sampling."""

from __future__ import annotations

import re
from dataclasses import dataclass

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
