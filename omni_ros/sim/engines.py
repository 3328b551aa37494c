"""One place that picks the simulator (`sim.engine`) and its scripted expert.

Both simulators offer the same interface (see `SimRobot`), so the ROS node, collection, evaluation and
rosbag recording never ask which one runs. The SO-101 is imported only when chosen: MuJoCo and its GL
context stay out of processes that drive the planar arm.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
from numpy.typing import ArrayLike

from omni_ros.sim.config import ENGINES, SimConfig
from omni_ros.sim.env import EpisodeInfo
from omni_ros.sim.scene import Scene
from omni_ros.sim.task import Task

if TYPE_CHECKING:
    from omni_ros.sim.env import SimEnv
    from omni_ros.sim.so101.env import So101Env


class SimRobot(Protocol):
    """What every simulator provides (omni_ros.sim.env.SimEnv, omni_ros.sim.so101.env.So101Env)."""

    config: SimConfig
    joint_names: list[str]
    time: float
    task: Task | None
    episode: EpisodeInfo | None

    @property
    def succeeded_at(self) -> float | None: ...

    @property
    def n_joints(self) -> int: ...
    @property
    def scene(self) -> Scene | None: ...
    @property
    def positions(self) -> np.ndarray: ...
    @property
    def velocities(self) -> np.ndarray: ...
    @property
    def state(self) -> np.ndarray: ...
    @property
    def done(self) -> bool: ...

    def reset(self, seed: int | None = None, target: str | None = None, prompt: str | None = None) -> dict: ...
    def command(self, positions: ArrayLike) -> None: ...
    def step(self, dt: float) -> None: ...
    def success(self) -> bool: ...
    def ended_on(self) -> str | None: ...
    def distance_to_target(self) -> float: ...
    def render(self) -> dict[str, np.ndarray]: ...
    def observe(self) -> dict[str, Any]: ...


class ReachingExpert(Protocol):
    """A scripted expert: action chunks towards the block at `target` (table x, y, metres)."""

    horizon: int
    dt: float

    def goal(self, target: ArrayLike) -> np.ndarray: ...
    def chunk(self, q: ArrayLike, target: ArrayLike) -> np.ndarray: ...


def make_env(sim: SimConfig) -> SimRobot:
    """The simulator `sim.engine` names, configured by `sim` (invalid settings raise ValueError)."""
    if sim.engine == "planar":
        from omni_ros.sim.env import SimEnv

        return SimEnv(sim)
    if sim.engine == "so101":
        from omni_ros.sim.so101.env import So101Env

        return So101Env(sim)
    raise ValueError(f"unknown sim.engine {sim.engine!r}; choose one of {list(ENGINES)}")


def make_expert(env: SimRobot, horizon: int, dt: float, ik_reference: Sequence[float] = ()) -> ReachingExpert:
    """The demonstrating expert of `env`'s simulator, producing (horizon, n_joints) chunks `dt` apart.

    `ik_reference` chooses the planar arm's IK branch (ignored unless it has one value per joint).
    """
    if env.config.engine == "so101":
        from omni_ros.sim.so101.expert import So101Expert

        return So101Expert(cast("So101Env", env), horizon=horizon, dt=dt)
    from omni_ros.sim.expert import ReachExpert

    planar = cast("SimEnv", env)  # the planar arm is the other engine
    reference = np.asarray(list(ik_reference), dtype=np.float64)
    if reference.shape != (env.n_joints,):
        reference = planar.home
    return ReachExpert(planar.arm, reference, horizon=horizon, dt=dt)
