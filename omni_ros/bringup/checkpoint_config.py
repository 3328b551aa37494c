"""A robot config made from a checkpoint (`omni-ros config init`) and a config checked against one
(`omni-ros config check --checkpoint`).

The checkpoint decides what the node must be given: one camera per `observation.images.*` feature, in the
checkpoint's order (the loader refuses any other list), and one joint per state and action dim (the node reads
the state from /joint_states by `robot.joint_names` and commands the same joints). Joint names come from the
checkpoint where LeRobot stored them (the dataset's feature `names`, or `action_feature_names`); otherwise they
are placeholders the user must replace.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_ros.config import OmniConfig

# LeRobot names motor features "<joint>.pos" (SO-100/101, Koch); the ROS joint is the part before.
POSITION_SUFFIX = ".pos"
PLACEHOLDER_PREFIX = "joint_"


@dataclass
class CheckpointIO:
    """What a checkpoint expects of the robot: cameras, dims, joint names (if it has them)."""

    path: Path
    layout: str
    family: str
    cameras: list[str]
    state_dim: int
    action_dim: int
    # camera -> (height, width) the checkpoint was trained on, where config.json says.
    image_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    # One per action dim from the checkpoint, or None: placeholders.
    joint_names: list[str] | None = None
    # Where joint_names came from ("output_features.action.names", ...), for the config's comment.
    names_source: str = ""
    tokenizer: str | None = None

    def joints(self) -> list[str]:
        """The joint names to configure: the checkpoint's, else `joint_1..N` placeholders."""
        if self.joint_names is not None:
            return list(self.joint_names)
        return [f"{PLACEHOLDER_PREFIX}{i}" for i in range(1, self.action_dim + 1)]

    def dim_problem(self) -> str | None:
        """Why the node cannot serve this checkpoint as one arm's joints, or None."""
        if self.state_dim != self.action_dim:
            return (
                f"the checkpoint's state has {self.state_dim} dims but its action {self.action_dim}: the policy "
                "node reads the state from and commands the same robot.joint_names, so it needs them equal"
            )
        return None


def inspect(path: str | Path, tokenizer: str | None = None) -> CheckpointIO:
    """Read what checkpoint folder `path` expects (its layout adapter's cameras and dims, config.json's names)."""
    from omni_ros.policy import layouts

    path = Path(path).resolve()
    checkpoint = layouts.read(path, tokenizer=tokenizer)
    cfg = checkpoint.config
    io = CheckpointIO(
        path=path,
        layout=checkpoint.layout,
        family=checkpoint.family + (f" ({cfg.variant})" if getattr(cfg, "variant", None) else ""),
        cameras=list(cfg.camera_names),
        state_dim=int(cfg.state_dim),
        action_dim=int(cfg.action_dim),
        tokenizer=tokenizer,
    )
    raw = _config_json(path)
    inputs = raw.get("input_features") or {}
    for cam in io.cameras:
        shape = (inputs.get(f"observation.images.{cam}") or {}).get("shape")
        if isinstance(shape, list) and len(shape) == 3:
            io.image_sizes[cam] = (int(shape[1]), int(shape[2]))
    io.joint_names, io.names_source = _joint_names(raw, io.action_dim)
    return io


def _config_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}  # the layout reader already accepted the folder; names are optional
    return data if isinstance(data, dict) else {}


def _names_list(names: Any) -> list[str] | None:
    # LeRobot stores `names` as a list, or as {"motors": [...]} in older datasets.
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    if isinstance(names, list) and names and all(isinstance(n, str) and n for n in names):
        return [n[: -len(POSITION_SUFFIX)] if n.endswith(POSITION_SUFFIX) else n for n in names]
    return None


def _joint_names(raw: dict[str, Any], action_dim: int) -> tuple[list[str] | None, str]:
    """The checkpoint's joint names, one per action dim, and where they were found; (None, why not) otherwise."""
    candidates = [
        ("output_features.action.names", ((raw.get("output_features") or {}).get("action") or {}).get("names")),
        (
            "input_features.observation.state.names",
            ((raw.get("input_features") or {}).get("observation.state") or {}).get("names"),
        ),
        ("action_feature_names", raw.get("action_feature_names")),
    ]
    wrong = []
    for source, value in candidates:
        names = _names_list(value)
        if names is None:
            continue
        if len(names) != action_dim or len(set(names)) != len(names):
            wrong.append(f"{source} lists {len(names)} names for {action_dim} action dims")
            continue
        return names, source
    return None, "; ".join(wrong) or "the checkpoint stores no feature names"


def _q(text: str) -> str:
    # JSON strings are valid YAML scalars, quoted only where needed.
    return json.dumps(text)


def render(io: CheckpointIO, out: Path) -> str:
    """The commented YAML config for `io`, written to `out` (the checkpoint path is made relative to it)."""
    try:
        checkpoint = str(io.path.relative_to(out.resolve().parent))
    except ValueError:
        checkpoint = str(io.path)
    joints = io.joints()
    lines = [
        f"# omni_ros config for checkpoint {io.path}",
        f"# written by `omni-ros config init` ({io.layout} layout, {io.family}): {len(io.cameras)} camera(s), "
        f"state {io.state_dim} / action {io.action_dim} dims.",
        "# Next: edit the topics to your robot's, then `omni-ros config check --config THIS` and `omni-ros doctor "
        "--config THIS` (docs/bringup.md).",
    ]
    problem = io.dim_problem()
    if problem:
        lines += [f"# WARNING: {problem}; `config check` refuses this config until that changes."]
    lines += [
        f"name: {_q(io.path.name)}",
        "policy:",
        "  # Relative paths are read from this file's folder.",
        f"  checkpoint: {_q(checkpoint)}",
    ]
    if io.tokenizer:
        lines += [f"  tokenizer: {_q(str(Path(io.tokenizer).resolve()))}"]
    lines += ["robot:"]
    if io.joint_names is not None:
        lines += [
            f"  # From the checkpoint ({io.names_source}), in its action order: the names /joint_states must carry.",
        ]
    else:
        lines += [
            f"  # PLACEHOLDERS ({io.names_source}): replace with your robot's joint names, in the order of the",
            "  # checkpoint's state/action dims (the dataset's order); /joint_states must carry each of them.",
        ]
    lines += ["  joint_names:"] + [f"    - {_q(j)}" for j in joints]
    lines += [
        "  control_rate_hz: 50.0",
        "  # Safe bring-up: chunks are computed and published, no commands; set false once `omni-ros doctor` says",
        "  # ready and the chunks look right.",
        "  dry_run: true",
        "  # How commands reach the controller: joint_trajectory (JointTrajectory on control.command_topic each",
        "  # tick), forward_position (Float64MultiArray on topics.forward_command, forward_command_controller) or",
        "  # follow_joint_trajectory (each chunk one control_msgs/FollowJointTrajectory goal).",
        "  command_interface: joint_trajectory",
        "topics:",
        "  # One sensor_msgs/Image per camera the checkpoint was trained with, in its order (names must match).",
        "  cameras:",
    ]
    for cam in io.cameras:
        size = io.image_sizes.get(cam)
        trained = f" (trained at {size[0]}x{size[1]}; any size is resized)" if size else ""
        lines += [
            f"    # feature observation.images.{cam}{trained}",
            f"    - name: {_q(cam)}",
            f"      topic: {_q(f'/camera/{cam}/image_raw')}",
            "      compressed: false",
        ]
    lines += [
        "  # sensor_msgs/JointState with every joint of robot.joint_names.",
        '  joint_states: "/joint_states"',
        "  # std_msgs/String, latched: the task prompt (or send a RunPolicy goal).",
        '  prompt: "/omni_ros/prompt"',
        '  default_prompt: ""',
        "  # std_msgs/Float64MultiArray per tick, for command_interface forward_position (e.g.",
        '  # "/forward_position_controller/commands"); with joint_trajectory, a copy when set.',
        '  forward_command: ""',
        "control:",
        "  # command_interface joint_trajectory: trajectory_msgs/JointTrajectory, one point per control tick.",
        '  command_topic: "/arm_controller/joint_trajectory"',
        "  # command_interface follow_joint_trajectory: the controller's action and the goals' tolerances",
        "  # (per joint: [] the controller's defaults, one value for all, or one per joint; -1 no limit).",
        "  follow_joint_trajectory:",
        '    action: "/arm_controller/follow_joint_trajectory"',
        "    path_position_tolerance: []",
        "    goal_position_tolerance: []",
        "    goal_time_tolerance_s: 0.0",
        "",
    ]
    return "\n".join(lines)


def check(config: OmniConfig, io: CheckpointIO) -> tuple[list[str], list[str]]:
    """(problems, warnings): what in `config` the node would refuse with checkpoint `io` (empty: it fits), and
    what it would serve but may be a mistake."""
    problems: list[str] = []
    warnings: list[str] = []
    configured = [c.name for c in config.topics.cameras]
    if configured != io.cameras:
        missing = [c for c in io.cameras if c not in configured]
        unknown = [c for c in configured if c not in io.cameras]
        parts = []
        if missing:
            parts.append(f"no topic for {missing}")
        if unknown:
            parts.append(f"{unknown} not in the checkpoint")
        if not parts:
            parts.append("same cameras in another order")
        problems.append(
            f"topics.cameras {configured} != the checkpoint's cameras {io.cameras} ({'; '.join(parts)}); list one "
            "entry per checkpoint camera, in its order"
        )
    joints = config.robot.joint_names
    if len(joints) != io.action_dim:
        problems.append(f"robot.joint_names lists {len(joints)} joints but the checkpoint's action has {io.action_dim}")
    dim_problem = io.dim_problem()
    if dim_problem:
        problems.append(dim_problem)  # the cause; joints vs state would repeat it
    elif len(joints) != io.state_dim:
        problems.append(f"robot.joint_names lists {len(joints)} joints but the checkpoint's state has {io.state_dim}")
    if len(set(joints)) != len(joints):
        dupes = sorted({j for j in joints if joints.count(j) > 1})
        problems.append(f"robot.joint_names repeats {dupes}")
    if io.joint_names is not None and len(joints) == len(io.joint_names) and joints != io.joint_names:
        diff = [f"{i}: {c!r} vs {j!r}" for i, (c, j) in enumerate(zip(joints, io.joint_names, strict=True)) if c != j]
        # A robot may name its joints differently from the dataset; only the order must agree.
        warnings.append(
            f"robot.joint_names differ from the checkpoint's ({io.names_source}) at {', '.join(diff)}: fine if "
            "only the names differ, wrong if the order does"
        )
    return problems, warnings
