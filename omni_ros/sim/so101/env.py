"""The MuJoCo SO-101 simulator as one object, with the interface of the planar `SimEnv`.

    env = So101Env(load_config("config/sim_so101.yaml").sim)
    obs = env.reset(seed=3)            # {"images": {"base": ..., "wrist": ...}, "state": q (6,), "prompt": ...}
    env.command(q_target); env.step(0.02)
    env.success(), env.time

Joint position targets go to the arm's six position servos (the MJCF's STS3215 actuators); MuJoCo
integrates arm and cubes every `sim.so101.physics_dt`. The cubes are free bodies: the arm can push
them, and the task reads their positions from the physics. Task and success rule: the fingertips
(the `gripperframe` site) within `sim.success_radius` of the prompted cube's centre, seen from
above, and at most `sim.so101.touch_height` above its top face, for `sim.success_hold_s`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from omni_ros.sim.config import SimConfig
from omni_ros.sim.env import EpisodeInfo
from omni_ros.sim.scene import COLORS, Block, Scene, choose_colors
from omni_ros.sim.so101.assets import JOINTS
from omni_ros.sim.so101.gl import release_current_context
from omni_ros.sim.so101.ik import So101Kinematics
from omni_ros.sim.so101.model import build_spec, compile_model, mujoco
from omni_ros.sim.task import EpisodeClock, SuccessHold, Task, sample_task

# Start pose: the fingers pointing down ~12 cm above the middle of the workspace, gripper closed.
HOME = (0.0, -0.95, 0.75, 1.25, 0.0, 0.0)
# Radians; the gripper is held closed for the touch task.
GRIPPER_CLOSED = 0.0


def sample_layout(
    rng: np.random.Generator,
    colors: Sequence[str],
    n_cubes: int,
    size: float,
    reach: Sequence[float],
    bearing_deg: float,
    min_separation: float,
) -> Scene:
    """`n_cubes` cubes of distinct colours in the sector in front of the base, `min_separation` apart."""
    chosen = choose_colors(rng, colors, n_cubes)
    near, far = float(reach[0]), float(reach[1])
    half = math.radians(bearing_deg)
    points: list[np.ndarray] = []
    for _ in range(10_000):
        if len(points) == n_cubes:
            break
        # Uniform over the sector's area, not its radius.
        r = math.sqrt(rng.uniform(near**2, far**2))
        theta = rng.uniform(-half, half)
        p = np.array([r * math.cos(theta), r * math.sin(theta)])
        if all(np.linalg.norm(p - q) >= min_separation for q in points):
            points.append(p)
    if len(points) < n_cubes:
        raise ValueError(f"cannot place {n_cubes} cubes {min_separation} m apart between {near} and {far} m")
    return Scene(
        tuple(
            Block(colors[int(i)], (float(p[0]), float(p[1])), float(rng.uniform(0, math.pi / 2)), size)
            for i, p in zip(chosen, points, strict=True)
        )
    )


def render_cameras(renderer: Any, data: Any, cameras: Sequence[str]) -> dict[str, np.ndarray]:
    """Frames of `cameras` from `renderer`, then the GL context released for the next frame's thread."""
    out = {}
    try:
        for camera in cameras:
            renderer.update_scene(data, camera=camera)
            out[camera] = renderer.render()
    finally:
        release_current_context()
    return out


class So101Env(EpisodeClock):
    """The SO-101 touching coloured cubes; deterministic for a given seed and command sequence."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        s = config.so101
        # SimConfig checked the settings (n_joints, cameras, sizes, sim.so101.*) when it was made.
        self.joint_names = list(config.joint_names) or list(JOINTS)
        self.n_cubes = int(config.n_blocks)
        self.home = np.asarray(config.home if config.home else HOME, dtype=np.float64)

        spec = build_spec(s, self.n_cubes, config.block_size, config.image_width, config.image_height)
        self.model = compile_model(spec)
        self.data = mujoco.MjData(self.model)
        self.kinematics = So101Kinematics(self.model)
        self.lower, self.upper = self.kinematics.lower, self.kinematics.upper
        self._qadr = self.kinematics.qpos_adr
        self._dadr = self.kinematics.dof_adr
        self._actuators = np.array([mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_ACTUATOR, n) for n in JOINTS])
        self._cube_qadr = [int(self.model.joint(f"cube_{i}").qposadr[0]) for i in range(self.n_cubes)]
        self._cube_geom = [self.model.geom(f"cube_{i}").id for i in range(self.n_cubes)]
        self._cube_body = [self.model.body(f"cube_{i}").id for i in range(self.n_cubes)]
        self._site = self.kinematics.site
        self._renderer: Any = None
        self.cameras = tuple(config.cameras)
        self.time = 0.0
        self._layout: Scene | None = None
        self._colors: tuple[str, ...] = ()
        self.task: Task | None = None
        self.episode: EpisodeInfo | None = None
        self._hold = SuccessHold(config.success_hold_s)
        self._target = np.zeros(len(JOINTS))

    # ----- the shared simulator interface (omni_ros.sim.env.SimEnv) -----------------------------------------

    @property
    def n_joints(self) -> int:
        return len(JOINTS)

    def reset(self, seed: int | None = None, target: str | None = None, prompt: str | None = None) -> dict[str, Any]:
        """Start an episode: cube layout and start pose from `seed`, then the target (pinned or random).

        The layout and start pose depend only on the seed, so the same seed with another `target` or
        `prompt` gives the same table with a different goal.
        """
        cfg = self.config
        seed = cfg.seed if seed is None else int(seed)
        rng = np.random.default_rng(seed)
        s = cfg.so101
        layout = sample_layout(
            rng, cfg.block_colors, self.n_cubes, cfg.block_size, s.reach, s.bearing_deg, s.min_separation
        )
        start = self.home + rng.uniform(-cfg.home_noise, cfg.home_noise, size=len(JOINTS))
        start[5] = GRIPPER_CLOSED
        start = np.clip(start, self.lower, self.upper)
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[self._qadr] = start
        for adr, geom, block in zip(self._cube_qadr, self._cube_geom, layout.blocks, strict=True):
            half = block.yaw / 2
            pose = [block.xy[0], block.xy[1], block.size / 2, math.cos(half), 0.0, 0.0, math.sin(half)]
            self.data.qpos[adr : adr + 7] = pose
            self.model.geom_rgba[geom] = [c / 255.0 for c in COLORS[block.color]] + [1.0]
        self._target = start.copy()
        self.data.ctrl[self._actuators] = start
        mujoco.mj_forward(self.model, self.data)
        self._layout = layout
        self._colors = tuple(b.color for b in layout.blocks)
        self.task = sample_task(rng, layout, cfg.success_radius, target=target, prompt=prompt)
        self.episode = EpisodeInfo(seed, self.task.target, self.task.prompt, self._colors)
        self.time = 0.0
        self._hold.reset()
        return self.observe()

    def command(self, positions: ArrayLike) -> None:
        """Joint position targets the servos follow from now on; clipped to the joint ranges, NaN refused."""
        target = np.asarray(positions, dtype=np.float64)
        if target.shape != (len(JOINTS),):
            raise ValueError(f"command has shape {target.shape}, expected ({len(JOINTS)},)")
        if not np.all(np.isfinite(target)):
            raise ValueError(f"command has non-finite values: {target.tolist()}")
        self._target = np.clip(target, self.lower, self.upper)
        self.data.ctrl[self._actuators] = self._target

    def step(self, dt: float) -> None:
        """Advance simulated time by `dt` seconds (whole physics steps; the remainder carries over)."""
        if self._layout is None:
            raise RuntimeError("call reset() before step()")
        h = self.model.opt.timestep
        n = math.floor((self.time + float(dt) - self.data.time) / h + 1e-6)
        if n > 0:
            mujoco.mj_step(self.model, self.data, nstep=n)
        self.time += float(dt)
        self._score_step(float(dt))

    @property
    def scene(self) -> Scene | None:
        """The cubes where the physics has them now."""
        if self._layout is None:
            return None
        blocks = []
        for block, body in zip(self._layout.blocks, self._cube_body, strict=True):
            x, y = self.data.xpos[body][:2]
            blocks.append(Block(block.color, (float(x), float(y)), block.yaw, block.size))
        return Scene(tuple(blocks))

    def tool_position(self) -> np.ndarray:
        """(3,) world position of the fingertips (the tool point)."""
        return self.data.site_xpos[self._site].copy()

    def _touching(self, index: int) -> bool:
        tip = self.data.site_xpos[self._site]
        centre = self.data.xpos[self._cube_body[index]]
        top = centre[2] + self.config.block_size / 2
        horizontal = math.hypot(tip[0] - centre[0], tip[1] - centre[1])
        return horizontal <= self.config.success_radius and tip[2] <= top + self.config.so101.touch_height

    def success(self) -> bool:
        """The fingertips are on the prompted cube now (the episode succeeds once they stay there)."""
        return self.task is not None and self._touching(self._colors.index(self.task.target))

    def ended_on(self) -> str | None:
        """The cube the fingertips are on now, if any."""
        for i, color in enumerate(self._colors):
            if self._touching(i):
                return color
        return None

    def distance_to_target(self) -> float:
        """Metres from the fingertips to the top face's centre of the prompted cube."""
        assert self.task is not None  # set by reset()
        centre = self.data.xpos[self._cube_body[self._colors.index(self.task.target)]].copy()
        centre[2] += self.config.block_size / 2
        return float(np.linalg.norm(self.tool_position() - centre))

    @property
    def positions(self) -> np.ndarray:
        return self.data.qpos[self._qadr].copy()

    @property
    def velocities(self) -> np.ndarray:
        return self.data.qvel[self._dadr].copy()

    @property
    def state(self) -> np.ndarray:
        return self.positions.astype(np.float32)

    @property
    def commanded(self) -> np.ndarray:
        return self._target.copy()

    def render(self) -> dict[str, np.ndarray]:
        """One RGB frame per camera, (H, W, 3) uint8."""
        if self._layout is None:
            raise RuntimeError("call reset() before render()")
        if self._renderer is None:
            # Created on first use, in the thread that renders (a GL context is current in one thread).
            self._renderer = mujoco.Renderer(self.model, self.config.image_height, self.config.image_width)
            weakref.finalize(self, self._renderer.close)
        return render_cameras(self._renderer, self.data, self.cameras)

    def observe(self) -> dict[str, Any]:
        assert self.task is not None  # set by reset()
        return {"images": self.render(), "state": self.state, "prompt": self.task.prompt}

    def close(self) -> None:
        """Free the GL context now (it is also freed when the simulator is garbage collected)."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
