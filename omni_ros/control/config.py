"""Configuration of action-chunk execution (the `control:` section of the YAML config)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from omni_ros.typed_config import FieldError

# Per-joint settings: each is empty, one value for every joint, or one value per joint.
PER_JOINT = ("position_lower", "position_upper", "max_velocity")


@dataclass
class ControlConfig:
    """How chunks become commands, and the limits every command obeys."""

    # Start the next inference when the current chunk has fewer than this fraction of its actions left.
    prefetch_threshold: float = 0.5
    # How an arriving chunk takes over from the one being executed.
    blending: Literal["latest", "linear", "ensemble"] = "linear"
    # Cross-fade length (linear) and fade-in/out length (ensemble), seconds.
    blend_window_s: float = 0.2
    # ACT temporal-ensembling weight exp(-decay * age in action steps); > 0 favours older predictions.
    ensemble_decay: float = 0.01
    # Anchor each chunk at its observation stamp, skipping the actions whose time passed during inference.
    latency_compensation: bool = True
    # Joint position limits in robot units; empty -> none, one value -> every joint.
    position_lower: list[float] = field(default_factory=list)
    position_upper: list[float] = field(default_factory=list)
    # Joint speed limits (units/s), enforced as a max step per control tick; empty -> none.
    max_velocity: list[float] = field(default_factory=lambda: [2.0])
    # Inputs older than these are stale: commands stop and the last safe position is held.
    camera_stale_s: float = 0.5
    state_stale_s: float = 0.25
    # null: a prompt never goes stale (it is latched).
    prompt_stale_s: float | None = None
    # Where joint commands go (trajectory_msgs/JointTrajectory, first point = target now).
    command_topic: str = "/arm_controller/joint_trajectory"

    def __post_init__(self) -> None:
        if not 0.0 <= self.prefetch_threshold <= 1.0:
            raise FieldError("prefetch_threshold", f"is a fraction of the chunk, 0..1; got {self.prefetch_threshold}")
        if self.blend_window_s < 0:
            raise FieldError("blend_window_s", f"must be >= 0, got {self.blend_window_s}")
        for key in PER_JOINT:
            values = getattr(self, key)
            if not all(math.isfinite(v) for v in values):
                raise FieldError(key, f"values must be finite, got {values}")
        if any(v <= 0 for v in self.max_velocity):
            raise FieldError("max_velocity", f"must be positive, got {self.max_velocity}")
        # How many joints there are is the robot's (checked where the limits are built); the lists must at
        # least agree with each other.
        counts = {key: len(getattr(self, key)) for key in PER_JOINT if len(getattr(self, key)) > 1}
        if len(set(counts.values())) > 1:
            listed = ", ".join(f"{key} has {n}" for key, n in counts.items())
            raise FieldError(
                next(iter(counts)), f"disagrees with the other per-joint limits on the joint count ({listed} values)"
            )
        lower, upper = self.position_lower, self.position_upper
        if lower and upper:
            n = max(len(lower), len(upper))
            pairs = zip(lower * (n // len(lower)), upper * (n // len(upper)), strict=True)
            if any(lo > hi for lo, hi in pairs):
                raise FieldError("position_lower", f"must not exceed position_upper: {lower} vs {upper}")
