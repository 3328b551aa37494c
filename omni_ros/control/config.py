"""Configuration of action-chunk execution (the `control:` section of the YAML config)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from omni_ros.typed_config import FieldError

# Per-joint settings: each is empty, one value for every joint, or one value per joint.
PER_JOINT = ("position_lower", "position_upper", "max_velocity")


@dataclass
class RtcConfig:
    """Real-time chunking (`blending: rtc`): the next chunk is sampled to continue the one executing."""

    # guided: the paper's soft-masked guidance (a backward pass through the expert per denoising step);
    # inpaint: hard prefix inpainting, the first d actions frozen, no gradient (ExecuTorch, QNN; best with a
    # model trained with training-time RTC, `omni-ros train --rtc-max-delay`).
    method: Literal["guided", "inpaint"] = "guided"
    # Soft mask over the actions after the frozen prefix (DESIGN.md section 9). linear, not the paper's exp:
    # the executed part of the new chunk starts right after the prefix, where exp already gives the old plan
    # little weight when the overlap is short (H - s - d = 4 actions at 0.3 s latency: 0.57 vs 0.8), and ones
    # ties the chunk to the old plan so long that the policy reacts late (bench/results/rtc_sweep.json).
    schedule: Literal["exp", "linear", "ones", "zeros"] = "linear"
    # Maximum guidance weight beta; null: the policy's number of denoising steps (beta / steps > 2 overshoots).
    max_guidance_weight: float | None = None
    # Inference delay d in actions; null: ceil(max of the recent measured latencies / action dt).
    inference_delay: int | None = None
    # How many recent chunk latencies the estimate of d looks at.
    latency_window: int = 10
    # After the d actions of the old plan, fade to the new chunk over this long (s); null: blend_window_s;
    # 0: switch at once, as in the paper. Guidance makes the chunks agree, but not exactly (a soft
    # constraint): the fade keeps what is left of their disagreement from reaching the robot as a step.
    # Cutting it to end at the old chunk's last action helped at 0.3 s but leaves no fade at all when that
    # action passed before the switch (0.4 s: jump p95 0.05 -> 0.23 rad); docs/rtc.md.
    switch_fade_s: float | None = None

    def fade(self, blend_window_s: float) -> float:
        return blend_window_s if self.switch_fade_s is None else self.switch_fade_s

    def __post_init__(self) -> None:
        beta = self.max_guidance_weight
        if beta is not None and not (math.isfinite(beta) and beta >= 0):
            raise FieldError("max_guidance_weight", f"must be >= 0 or null, got {beta}")
        if self.inference_delay is not None and self.inference_delay < 0:
            raise FieldError("inference_delay", f"must be >= 0 or null, got {self.inference_delay}")
        fade = self.switch_fade_s
        if fade is not None and not (math.isfinite(fade) and fade >= 0):
            raise FieldError("switch_fade_s", f"must be >= 0 or null, got {fade}")
        if self.latency_window < 1:
            raise FieldError("latency_window", f"must be >= 1, got {self.latency_window}")


@dataclass
class FollowJointTrajectoryConfig:
    """`robot.command_interface: follow_joint_trajectory`: each chunk goes to a control_msgs/FollowJointTrajectory
    action server (ros2_control's joint_trajectory_controller, MoveIt's controller managers) as one trajectory."""

    # The controller's action, e.g. /<controller>/follow_joint_trajectory.
    action: str = "/arm_controller/follow_joint_trajectory"
    # Tolerances sent with every goal, per joint: empty (the controller's defaults), one value for every joint
    # or one per joint; 0 keeps the controller's default for that joint, -1 lifts its limit (control_msgs'
    # JointTolerance). The controller aborts a goal that violates them, which fails a running RunPolicy goal.
    path_position_tolerance: list[float] = field(default_factory=list)
    goal_position_tolerance: list[float] = field(default_factory=list)
    goal_velocity_tolerance: list[float] = field(default_factory=list)
    # Leeway after the trajectory's end to reach the goal tolerance (s); 0: the controller's default.
    goal_time_tolerance_s: float = 0.0
    # Wait this long for the action server at start-up and per goal before reporting it missing (s).
    server_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.action:
            raise FieldError("action", "must name the controller's FollowJointTrajectory action")
        for key in ("path_position_tolerance", "goal_position_tolerance", "goal_velocity_tolerance"):
            values = getattr(self, key)
            if not all(math.isfinite(v) and (v >= 0 or v == -1) for v in values):
                raise FieldError(key, f"values must be >= 0 or -1 (no limit), got {values}")
        if not (math.isfinite(self.goal_time_tolerance_s) and self.goal_time_tolerance_s >= 0):
            raise FieldError("goal_time_tolerance_s", f"must be >= 0, got {self.goal_time_tolerance_s}")
        if not self.server_timeout_s > 0:
            raise FieldError("server_timeout_s", f"must be positive, got {self.server_timeout_s}")


@dataclass
class ControlConfig:
    """How chunks become commands, and the limits every command obeys."""

    # Start the next inference when the current chunk has fewer than this fraction of its actions left.
    prefetch_threshold: float = 0.5
    # How an arriving chunk takes over from the one being executed. rtc: the policy samples it to continue
    # the executing plan (real-time chunking, settings in `rtc`); the executor keeps the old chunk for the
    # inference delay and then switches (with a short fade, rtc.switch_fade_s).
    blending: Literal["latest", "linear", "ensemble", "rtc"] = "linear"
    # Cross-fade length (linear) and fade-in/out length (ensemble), seconds.
    blend_window_s: float = 0.2
    # ACT temporal-ensembling weight exp(-decay * age in action steps); > 0 favours older predictions.
    ensemble_decay: float = 0.01
    rtc: RtcConfig = field(default_factory=RtcConfig)
    # Anchor each chunk at its observation stamp, skipping the actions whose time passed during inference.
    latency_compensation: bool = True
    # A policy slower than its chunks (every action of a chunk due before the chunk arrives): run such a chunk
    # from its arrival when the robot held still since its observation (what a synchronous policy does: move,
    # stop, think, move), and stop prefetching while inference takes longer than a chunk (a prefetched answer
    # would be late and dropped). false: late chunks are dropped and the robot holds until one is in time.
    run_late_chunks: bool = True
    # A chunk arriving after the plan before it ran out (the robot holding its last action): play it on from the
    # action after the plan's last one, shifted to start now, instead of skipping the actions that fell due while
    # the robot held (it would jump ahead over motion it never made). The robot pauses and resumes where it
    # stopped; with a policy slower than half a chunk this also halves the time held (bench/realtime.py's live
    # run). false: such a chunk skips to the action due now, as if the robot had kept moving.
    resume_where_held: bool = True
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
    # Where joint commands go with robot.command_interface joint_trajectory (trajectory_msgs/JointTrajectory,
    # first point = target now).
    command_topic: str = "/arm_controller/joint_trajectory"
    follow_joint_trajectory: FollowJointTrajectoryConfig = field(default_factory=FollowJointTrajectoryConfig)

    def __post_init__(self) -> None:
        if not 0.0 <= self.prefetch_threshold <= 1.0:
            raise FieldError("prefetch_threshold", f"is a fraction of the chunk, 0..1; got {self.prefetch_threshold}")
        if self.blend_window_s < 0:
            raise FieldError("blend_window_s", f"must be >= 0, got {self.blend_window_s}")
        if self.blending == "rtc" and not self.latency_compensation:
            raise FieldError("blending", "'rtc' needs latency_compensation: chunks continue the plan from their stamp")
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
