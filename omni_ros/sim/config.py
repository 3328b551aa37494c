"""Configuration of the simulated robot (the `sim:` section of the YAML config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from omni_ros.sim.so101.config import SO101_JOINTS, So101Config
from omni_ros.typed_config import FieldError

# The simulators `engine` picks (omni_ros.sim.engines).
ENGINES = ("planar", "so101")

# The views the renderer draws (omni_ros.sim.render).
CAMERAS = ("base", "wrist")
# The block colors, RGB: far apart from each other and from the table, floor and arm colors so a pixel's
# color says what it shows. They live here because a config may name only these.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 70, 230),
    "yellow": (240, 210, 20),
    "purple": (150, 40, 190),
    "orange": (250, 130, 10),
    "cyan": (20, 200, 220),
}


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
    # Colors the blocks are drawn from (see COLORS).
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
    # std_msgs/Bool: true when an episode succeeds, false when the next starts (a RunPolicy goal's success_topic).
    success_topic: str = "/sim/success"
    reset_service: str = "/sim/reset"
    # Settings of the SO-101 simulator only.
    so101: So101Config = field(default_factory=So101Config)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise FieldError("engine", f"is {self.engine!r}; choose one of {list(ENGINES)}")
        n = self.n_joints
        if n < 1:
            raise FieldError("n_joints", f"must be >= 1, got {n}")
        if self.engine == "so101":
            self._check_so101()
        else:
            self._check_planar()
        if self.joint_names and len(self.joint_names) != n:
            raise FieldError("joint_names", f"has {len(self.joint_names)} names for {n} joints")
        for key in ("camera_rate_hz", "joint_state_rate_hz"):
            if not getattr(self, key) > 0:
                raise FieldError(key, f"must be positive, got {getattr(self, key)}")
        unknown = [c for c in self.cameras if c not in CAMERAS]
        if unknown:
            raise FieldError("cameras", f"lists unknown cameras {unknown}; available: {list(CAMERAS)}")
        if not self.cameras:
            raise FieldError("cameras", f"is empty; name at least one of {list(CAMERAS)}")
        for key in ("image_width", "image_height"):
            if getattr(self, key) < 16:
                raise FieldError(key, f"must be at least 16 pixels, got {getattr(self, key)}")
        unknown = [c for c in self.block_colors if c not in COLORS]
        if unknown:
            raise FieldError("block_colors", f"lists unknown block colors {unknown}; known: {sorted(COLORS)}")
        if not 1 <= self.n_blocks <= len(self.block_colors):
            raise FieldError(
                "n_blocks",
                f"must be between 1 and {len(self.block_colors)} (the number of block_colors), got {self.n_blocks}",
            )

    def _check_planar(self) -> None:
        n = self.n_joints
        if len(self.link_lengths) != n:
            raise FieldError("link_lengths", f"has {len(self.link_lengths)} values for {n} joints (sim.n_joints)")
        if not all(length > 0 for length in self.link_lengths):
            raise FieldError("link_lengths", f"must be positive, got {self.link_lengths}")
        for key in ("joint_lower", "joint_upper", "home"):
            values = getattr(self, key)
            if len(values) not in (1, n) and not (key == "home" and not values):
                raise FieldError(key, f"has {len(values)} values; expected 1 or {n} (one per joint)")
        lower = self.joint_lower * (n // len(self.joint_lower))
        upper = self.joint_upper * (n // len(self.joint_upper))
        if any(lo >= hi for lo, hi in zip(lower, upper, strict=True)):
            raise FieldError("joint_lower", f"must be below joint_upper: {self.joint_lower} vs {self.joint_upper}")
        for key in ("max_joint_velocity", "time_constant"):
            if not getattr(self, key) > 0:
                raise FieldError(key, f"must be positive, got {getattr(self, key)}")

    def _check_so101(self) -> None:
        # The MJCF fixes the arm: its joints, and a gripper that closes on cubes up to 6 cm.
        if self.n_joints != len(SO101_JOINTS):
            raise FieldError("n_joints", f"must be {len(SO101_JOINTS)} for the SO-101 ({', '.join(SO101_JOINTS)})")
        if self.home and len(self.home) != len(SO101_JOINTS):
            raise FieldError("home", f"needs {len(SO101_JOINTS)} values for the SO-101, got {len(self.home)}")
        if not 0 < self.block_size <= 0.06:
            raise FieldError("block_size", f"must be in (0, 0.06] m for the SO-101's gripper, got {self.block_size}")
