"""The `eval:` section of the YAML config: which recorded topics feed the replay, and how it is scored.

Empty topic fields fall back to the policy node's own `topics:` (and `control.command_topic`), so a bag
recorded on the robot replays with the config the robot runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from omni_ros.typed_config import FieldError


@dataclass
class EvalCamera:
    """A recorded camera topic (sensor_msgs/Image or CompressedImage, detected from the bag) and its name."""

    name: str
    topic: str


@dataclass
class GroundTruthConfig:
    """What the predicted actions are compared with."""

    # command: a recorded command topic (trajectory_msgs/JointTrajectory, sensor_msgs/JointState or
    # std_msgs/Float64MultiArray, detected from the bag); joint_states: the measured joint positions
    # `offset_s` after each action's time.
    source: Literal["command", "joint_states"] = "command"
    # The command topic; empty -> control.command_topic.
    topic: str = ""
    # joint_states source: the action for time t is the joint position at t + offset_s.
    offset_s: float = 0.0
    # JointTrajectory: `first` takes each message's first point as the target at its stamp (what the policy
    # node and the sim do); `all` places every point at stamp + time_from_start, later messages winning.
    trajectory_points: Literal["first", "all"] = "first"
    # Joint order of Float64MultiArray commands (they carry no names); empty -> robot.joint_names.
    joint_names: list[str] = field(default_factory=list)
    # Recorded commands further apart than this are not interpolated across (the gap scores nothing), s.
    max_gap_s: float = 0.25


@dataclass
class EvalConfig:
    """Replay of recorded bags (`omni-ros eval`)."""

    # Camera topics -> camera names; empty -> topics.cameras.
    cameras: list[EvalCamera] = field(default_factory=list)
    # sensor_msgs/JointState; empty -> topics.joint_states.
    joint_states: str = ""
    # std_msgs/String prompt topic; empty -> topics.prompt.
    prompt_topic: str = ""
    # A fixed prompt used instead of the prompt topic; empty -> the topic (or topics.default_prompt).
    prompt: str = ""
    ground_truth: GroundTruthConfig = field(default_factory=GroundTruthConfig)
    # Inference instants: every k-th frame of the trigger camera ...
    every_k_frames: int = 1
    # ... (empty -> the first camera), or, when rate_hz > 0, a fixed rate in bag time.
    trigger_camera: str = ""
    rate_hz: float = 0.0
    # Episodes: each bag is at least one; a silence longer than episode_gap_s (> 0) between messages, or
    # any message on episode_marker_topic, starts another.
    episode_gap_s: float = 0.0
    episode_marker_topic: str = ""
    # Time of a message: its header stamp (what the node sees) or, when false or zero, the bag's log time.
    use_header_stamps: bool = True
    # Report: episodes whose trajectories are plotted, and camera frames shown.
    plot_episodes: int = 3
    report_frames: int = 4

    def __post_init__(self) -> None:
        # Which cameras there are may come from `topics:`: OmniConfig checks trigger_camera against them.
        if self.every_k_frames < 1:
            raise FieldError("every_k_frames", f"must be >= 1, got {self.every_k_frames}")
        if self.rate_hz < 0:
            raise FieldError("rate_hz", f"must be >= 0 (0: every k-th frame instead), got {self.rate_hz}")
