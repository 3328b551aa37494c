"""Configuration of action-chunk execution (the `control:` section of the YAML config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


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
