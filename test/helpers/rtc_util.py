"""Shared pieces of the real-time chunking tests: the shipped demo policy and two observations of one episode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import omni_ros.policy
from omni_ros.policy.pipeline import InferencePipeline
from omni_ros.sim.config import SimConfig
from omni_ros.sim.env import SimEnv


def demo_policy(root: Path) -> InferencePipeline:
    return omni_ros.policy.load(root / "checkpoints" / "demo", seed=0)


def two_observations(seed: int, offset: Any, ticks: int) -> tuple[dict, dict]:
    """An observation, and one `ticks` control ticks later after the arm was sent `offset` away: the plan of
    the first no longer fits the second, as between two chunks of a moving robot."""
    env = SimEnv(SimConfig())
    first = env.reset(seed)
    env.command(env.arm.q + np.asarray(offset))
    for _ in range(ticks):
        env.step(0.02)
    return first, env.observe()
