"""Configuration of the simulated robot (the `sim:` section of the YAML config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from omni_ros.sim.so101.config import So101Config


@dataclass
class SimConfig:
    """A planar N-joint arm on a table, its cameras, blocks and task (or, with engine so101, the MuJoCo SO-101)."""

    # "planar": the 2-D arm drawn with OpenCV (fast); "so101": the SO-101 arm in MuJoCo (omni_ros.sim.so101).
    # The planar-arm fields below (link_lengths, joint limits, dynamics) do not apply to the SO-101.
    engine: Literal["planar", "so101"] = "planar"
    n_joints: int = 3
    # Metres, base to tip; one per joint.
    link_lengths: list[float] = field(default_factory=lambda: [0.3, 0.25, 0.15])
    # Radians; one value for all joints or one per joint.
    joint_lower: list[float] = field(default_factory=lambda: [-2.9])
    joint_upper: list[float] = field(default_factory=lambda: [2.9])
    # Actuator saturation, rad/s (a real servo cannot follow a step instantly).
    max_joint_velocity: float = 3.0
    # First-order lag of each joint towards its commanded position, seconds.
    time_constant: float = 0.08
    # Start pose in radians; empty -> a folded pose pointing into the table.
    home: list[float] = field(default_factory=list)
    # Random perturbation of the start pose per episode, radians.
    home_noise: float = 0.15
    # Names published in JointState; empty -> joint_1 .. joint_N.
    joint_names: list[str] = field(default_factory=list)
    # "base" is a top-down view of the table, "wrist" looks down from the gripper.
    cameras: list[str] = field(default_factory=lambda: ["base", "wrist"])
    image_width: int = 224
    image_height: int = 224
    camera_rate_hz: float = 30.0
    joint_state_rate_hz: float = 50.0
    # Colors the blocks are drawn from (see omni_ros.sim.scene.COLORS).
    block_colors: list[str] = field(default_factory=lambda: ["red", "green", "blue", "yellow"])
    n_blocks: int = 3
    # Edge length of a block, metres.
    block_size: float = 0.05
    # The episode succeeds when the gripper tip is this close to the prompted block's centre.
    success_radius: float = 0.04
    # ... and stays that close for this long (s): reaching means settling on the block, not sweeping past it.
    success_hold_s: float = 0.3
    episode_time_s: float = 10.0
    # The ROS node starts the next episode this long after a success or time-out; 0 waits for the reset service.
    auto_reset_s: float = 3.0
    # Seed of the first episode; each reset moves to the next seed.
    seed: int = 0
    camera_topic: str = "/camera/{camera}/image_raw"
    joint_state_topic: str = "/joint_states"
    prompt_topic: str = "/omni_ros/prompt"
    episode_topic: str = "/sim/episode"
    reset_service: str = "/sim/reset"
    # Settings of the SO-101 simulator only.
    so101: So101Config = field(default_factory=So101Config)
