"""The simulated robot as one object: arm + scene + task + cameras, stepped in simulated time.

    env = SimEnv(SimConfig())
    obs = env.reset(seed=3)            # {"images": {...}, "state": q, "prompt": "..."}
    env.command(q_target); env.step(0.02)
    env.success(), env.time

The observation is the raw dict `Policy.infer` takes, so a policy can drive
the simulator directly (evaluation) or through ROS (sim_robot_node).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from omni_ros.sim.arm import PlanarArm, broadcast_per_joint, default_home
from omni_ros.sim.config import SimConfig
from omni_ros.sim.render import Renderer
from omni_ros.sim.scene import Scene, sample_scene
from omni_ros.sim.task import EpisodeClock, SuccessHold, Task, sample_task

# Physics sub-step: joint dynamics stay accurate whatever step the caller uses.
MAX_PHYSICS_DT = 0.005


@dataclass(frozen=True)
class EpisodeInfo:
    seed: int
    target: str
    prompt: str
    colors: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "target": self.target, "prompt": self.prompt, "colors": list(self.colors)}


class SimEnv(EpisodeClock):
    """A planar arm reaching for colored blocks; deterministic for a given seed and command sequence."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config = config or SimConfig()
        n = config.n_joints  # SimConfig checked the per-joint lists against it
        self.arm = PlanarArm(
            config.link_lengths,
            broadcast_per_joint(config.joint_lower, n, "sim.joint_lower"),
            broadcast_per_joint(config.joint_upper, n, "sim.joint_upper"),
            time_constant=config.time_constant,
            max_velocity=config.max_joint_velocity,
        )
        self.home = broadcast_per_joint(config.home, n, "sim.home") if config.home else default_home(n)
        self.joint_names = list(config.joint_names) or [f"joint_{i}" for i in range(1, n + 1)]
        self.renderer = Renderer(config.cameras, config.image_width, config.image_height)
        self.time = 0.0
        self.scene: Scene | None = None
        self.task: Task | None = None
        self.episode: EpisodeInfo | None = None
        self._hold = SuccessHold(config.success_hold_s)

    def reset(self, seed: int | None = None, target: str | None = None, prompt: str | None = None) -> dict[str, Any]:
        """Start an episode: new layout and start pose from `seed`, then the target (pinned or random).

        The layout and start pose depend only on the seed, so the same seed with
        another `target` or `prompt` gives the same table with a different goal.
        """
        seed = self.config.seed if seed is None else int(seed)
        rng = np.random.default_rng(seed)
        cfg = self.config
        self.scene = sample_scene(rng, cfg.block_colors, cfg.n_blocks, cfg.block_size, reach=self.arm.reach)
        start = self.home + rng.uniform(-cfg.home_noise, cfg.home_noise, size=self.arm.n_joints)
        self.arm.reset(start)
        self.task = sample_task(rng, self.scene, cfg.success_radius, target=target, prompt=prompt)
        self.episode = EpisodeInfo(seed, self.task.target, self.task.prompt, tuple(self.scene.colors))
        self.time = 0.0
        self._hold.reset()
        return self.observe()

    def command(self, positions: ArrayLike) -> None:
        """Joint position targets the arm follows from now on."""
        self.arm.command(positions)

    def step(self, dt: float) -> None:
        """Advance simulated time by `dt` seconds."""
        if self.scene is None:
            raise RuntimeError("call reset() before step()")
        remaining = float(dt)
        while remaining > 1e-12:
            h = min(MAX_PHYSICS_DT, remaining)
            self.arm.step(h)
            remaining -= h
        self.time += float(dt)
        self._score_step(float(dt))

    def success(self) -> bool:
        """The tool point is on the prompted block now (the episode succeeds once it stays there)."""
        return (
            self.task is not None and self.scene is not None and self.task.success(self.scene, self.arm.end_effector())
        )

    def distance_to_target(self) -> float:
        assert self.task is not None and self.scene is not None  # set by reset()
        return self.task.distance(self.scene, self.arm.end_effector())

    def ended_on(self) -> str | None:
        """The block the tool point is on now (within the success radius), if any."""
        tip = self.arm.end_effector()
        ended_on = None
        assert self.scene is not None  # set by reset()
        for block in self.scene.blocks:
            if np.linalg.norm(tip - np.asarray(block.xy)) <= self.config.success_radius:
                ended_on = block.color
        return ended_on

    @property
    def n_joints(self) -> int:
        return self.arm.n_joints

    @property
    def positions(self) -> np.ndarray:
        """Measured joint positions (float64)."""
        return self.arm.q

    @property
    def velocities(self) -> np.ndarray:
        return self.arm.qd

    @property
    def state(self) -> np.ndarray:
        return self.arm.q.astype(np.float32)

    def render(self) -> dict[str, np.ndarray]:
        if self.scene is None:
            raise RuntimeError("call reset() before render()")
        return self.renderer.render_all(self.scene, self.arm)

    def observe(self) -> dict[str, Any]:
        assert self.task is not None  # set by reset()
        return {"images": self.render(), "state": self.state, "prompt": self.task.prompt}
