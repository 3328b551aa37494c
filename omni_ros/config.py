"""The omni_ros app configuration: one YAML file (config/*.yaml) with a section per part.

Each part owns its section's dataclass (`policy:` is omni_ros.policy.config, `control:` is
omni_ros.control.config, ...); this module puts them together, adds the robot and topic sections of the
policy node and loads a file. The machinery (`from_dict`, `to_dict`, `ConfigError`) lives in the leaf
module omni_ros.typed_config and is re-exported here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

from omni_ros.control.config import ControlConfig
from omni_ros.eval.config import EvalConfig
from omni_ros.policy.config import PolicyConfig
from omni_ros.serving.config import ServeConfig
from omni_ros.sim.config import SimConfig
from omni_ros.tts.config import TtsConfig
from omni_ros.typed_config import ConfigError, FieldError, from_dict, load_yaml, to_dict

__all__ = [
    "CONFIG_DIR",
    "ConfigError",
    "FieldError",
    "OmniConfig",
    "PolicyConfig",
    "from_dict",
    "load_config",
    "load_yaml",
    "to_dict",
]

T = TypeVar("T")

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"


@dataclass
class StatusConfig:
    """Where and how often the node reports its health."""

    topic: str = "/omni_ros/status"
    rate_hz: float = 1.0

    def __post_init__(self) -> None:
        if not self.rate_hz > 0:
            raise FieldError("rate_hz", f"must be positive, got {self.rate_hz}")


@dataclass
class RobotConfig:
    """The robot the policy drives."""

    joint_names: list[str] = field(default_factory=lambda: [f"joint_{i}" for i in range(1, 7)])
    control_rate_hz: float = 50.0
    # Safe bring-up: compute and publish chunks, never commands.
    dry_run: bool = True
    # How commands reach the robot's controller (omni_ros/nodes/command_interfaces.py):
    #   joint_trajectory: trajectory_msgs/JointTrajectory on control.command_topic at control_rate_hz
    #     (one point, the target now), for joint_trajectory_controller's topic or a custom driver;
    #   forward_position: std_msgs/Float64MultiArray on topics.forward_command at control_rate_hz, in
    #     joint_names order, for ros2_control's forward_command_controller (position interface);
    #   follow_joint_trajectory: each chunk as one control_msgs/FollowJointTrajectory goal on
    #     control.follow_joint_trajectory.action, the controller interpolating between its points.
    command_interface: Literal["joint_trajectory", "forward_position", "follow_joint_trajectory"] = "joint_trajectory"

    def __post_init__(self) -> None:
        if not self.control_rate_hz > 0:
            raise FieldError("control_rate_hz", f"must be positive, got {self.control_rate_hz}")


@dataclass
class CameraTopic:
    """One camera input of the policy node."""

    name: str
    topic: str
    # sensor_msgs/CompressedImage (jpeg/png) instead of sensor_msgs/Image.
    compressed: bool = False


@dataclass
class TopicsConfig:
    """Topics of the policy node (inputs, outputs, safety)."""

    cameras: list[CameraTopic] = field(
        default_factory=lambda: [
            CameraTopic("base", "/camera/base/image_raw"),
            CameraTopic("wrist", "/camera/wrist/image_raw"),
        ]
    )
    joint_states: str = "/joint_states"
    # std_msgs/String, transient-local (latched): the task prompt.
    prompt: str = "/omni_ros/prompt"
    # Used until a prompt arrives; empty -> wait for one.
    default_prompt: str = ""
    # std_msgs/Bool: true engages the e-stop (latched until false and a resume).
    estop: str = "/omni_ros/estop"
    action_chunk: str = "/omni_ros/action_chunk"
    # Optional std_msgs/Float64MultiArray copy of each command for forward controllers; empty -> off.
    forward_command: str = ""
    diagnostics: str = "/diagnostics"
    # omni_ros/action/RunPolicy: run on a prompt until success, time-out or cancel (omni_ros/nodes/run_policy.py).
    run_policy: str = "/omni_ros/run_policy"


@dataclass
class OmniConfig:
    """The whole omni_ros configuration (one YAML file in config/)."""

    name: str = "default"
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    robot: RobotConfig = field(default_factory=RobotConfig)
    status: StatusConfig = field(default_factory=StatusConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    tts: TtsConfig = field(default_factory=TtsConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if self.robot.command_interface == "forward_position" and not self.topics.forward_command:
            raise FieldError(
                "topics.forward_command",
                "is empty but robot.command_interface is forward_position: name the forward_command_controller's "
                "topic (e.g. /forward_position_controller/commands)",
            )
        fjt, joints = self.control.follow_joint_trajectory, len(self.robot.joint_names)
        for key in ("path_position_tolerance", "goal_position_tolerance", "goal_velocity_tolerance"):
            if len(getattr(fjt, key)) not in (0, 1, joints):
                raise FieldError(
                    f"control.follow_joint_trajectory.{key}",
                    f"has {len(getattr(fjt, key))} values: give 0, 1 or one per joint ({joints})",
                )
        # The replay's cameras default to the node's (see omni_ros.eval.replay.TopicMap), so they are checked here.
        names = [c.name for c in self.eval.cameras] or [c.name for c in self.topics.cameras]
        if not names:
            raise FieldError("eval.cameras", "and topics.cameras are both empty: no cameras configured")
        if self.eval.trigger_camera and self.eval.trigger_camera not in names:
            source = "eval.cameras" if self.eval.cameras else "topics.cameras"
            raise FieldError(
                "eval.trigger_camera", f"'{self.eval.trigger_camera}' is not one of the cameras {names} ({source})"
            )


@overload
def load_config(path: str | os.PathLike | None = None) -> OmniConfig: ...


@overload
def load_config(path: str | os.PathLike | None, cls: type[T]) -> T: ...


def load_config(path: str | os.PathLike | None = None, cls: type[Any] = OmniConfig) -> Any:
    """Load `path` (default: config/default.yaml) into `cls`, validating every key."""
    path = Path(path) if path is not None else CONFIG_DIR / "default.yaml"
    config = load_yaml(path, cls)
    policy = getattr(config, "policy", None)
    if isinstance(policy, PolicyConfig) and policy.checkpoint and not Path(policy.checkpoint).is_absolute():
        # Relative checkpoint paths mean "next to this config file", wherever the command runs from.
        policy.checkpoint = str((path.parent / policy.checkpoint).resolve())
    if isinstance(policy, PolicyConfig):
        for key in ("pte", "tokenizer", "onnx", "cache_dir"):
            value = getattr(policy, key)
            if value and not Path(value).expanduser().is_absolute():
                setattr(policy, key, str((path.parent / value).resolve()))
    if isinstance(policy, PolicyConfig) and policy.remote.ca_file and not Path(policy.remote.ca_file).is_absolute():
        policy.remote.ca_file = str((path.parent / policy.remote.ca_file).resolve())
    serve = getattr(config, "serve", None)
    if isinstance(serve, ServeConfig):
        for key in ("tls_cert", "tls_key"):
            value = getattr(serve, key)
            if value and not Path(value).is_absolute():
                setattr(serve, key, str((path.parent / value).resolve()))
    return config
