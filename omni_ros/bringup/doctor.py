"""`omni-ros doctor`: join the ROS graph and say, input by input, why the policy node would not move the robot.

For each input the config expects (every camera, the joint states, the prompt) it reports the publishers and
their message type, the rate and age of what arrives (age by header stamp, as the node judges staleness), image
size and encoding (each frame is converted the way the node converts it), and the joint names present and
missing; for the outputs, whether a controller subscribes to the commands. The verdict is "ready" or the first
thing to fix; the exit status is 0 only when ready.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from omni_ros.config import OmniConfig

IMAGE, COMPRESSED, JOINT_STATE, STRING = (
    "sensor_msgs/msg/Image",
    "sensor_msgs/msg/CompressedImage",
    "sensor_msgs/msg/JointState",
    "std_msgs/msg/String",
)
TRAJECTORY = "trajectory_msgs/msg/JointTrajectory"
# Longest wait for the inputs' publishers to be discovered before the listening starts (s).
DISCOVERY_S = 5.0
# How long an input that looks stale at the end of the listening window may take to send a fresh message.
STALE_GRACE_S = 1.0


@dataclass
class Seen:
    """What arrived on one topic during the observation."""

    received: list[float] = field(default_factory=list)
    last_stamp: float = 0.0  # header stamp (else arrival) of the latest message
    last: Any = None
    error: str = ""  # why the latest image could not be converted ('' when it could)


@dataclass
class Check:
    """One line of the report."""

    what: str
    topic: str
    problem: str  # '' when fine
    detail: str

    def line(self) -> str:
        status = "ok" if not self.problem else f"PROBLEM: {self.problem}"
        return f"{self.what:<22} {self.topic:<36} {self.detail}  -> {status}"


def rate(times: list[float]) -> float:
    if len(times) < 2 or times[-1] <= times[0]:
        return 0.0
    return (len(times) - 1) / (times[-1] - times[0])


def observe(
    config: OmniConfig, seconds: float, context: Any = None, discovery_s: float = DISCOVERY_S
) -> tuple[list[Check], list[str]]:
    """Wait for discovery, listen for `seconds`, then (checks, notes). Needs rclpy initialised on `context`
    (None: the default)."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    from sensor_msgs.msg import CompressedImage, Image, JointState
    from std_msgs.msg import String

    from omni_ros.ros_convert import ImageError, compressed_to_rgb, image_to_rgb, message_stamp

    node = rclpy.create_node("omni_ros_doctor", context=context)
    clock = lambda: node.get_clock().now().nanoseconds * 1e-9  # noqa: E731
    topics = config.topics
    seen: dict[str, Seen] = {}

    def on_message(key: str, msg: Any, convert: Any = None) -> None:
        now = clock()
        s = seen.setdefault(key, Seen())
        s.received.append(now)
        s.last, s.last_stamp = msg, message_stamp(msg, now)
        if convert is not None:
            try:
                convert(msg)
                s.error = ""
            except ImageError as exc:
                s.error = str(exc)

    for cam in topics.cameras:
        node.create_subscription(
            CompressedImage if cam.compressed else Image,
            cam.topic,
            lambda m, k=cam.topic, c=cam.compressed: on_message(k, m, compressed_to_rgb if c else image_to_rgb),
            qos_profile_sensor_data,
        )
    node.create_subscription(
        JointState, topics.joint_states, lambda m: on_message(topics.joint_states, m), qos_profile_sensor_data
    )
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    node.create_subscription(String, topics.prompt, lambda m: on_message(topics.prompt, m), latched)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    inputs = [c.topic for c in topics.cameras] + [topics.joint_states]
    try:
        # Discovery between processes takes 0.1-2.6 s (more on a loaded machine): listen for `seconds` once
        # every input has a publisher, or once `discovery_s` has passed without (a missing one is reported).
        deadline = time.monotonic() + discovery_s
        while time.monotonic() < deadline and not all(node.count_publishers(t) for t in inputs):
            executor.spin_once(timeout_sec=0.05)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.05)
        # One look at the end could catch a publisher in a momentary stall (a busy machine paused every input
        # for 0.3 s once): an input that looks stale gets up to STALE_GRACE_S more to send a fresh message. A dead
        # publisher stays stale and is reported; one that only hiccuped is not.
        limits = {c.topic: config.control.camera_stale_s for c in topics.cameras}
        limits[topics.joint_states] = config.control.state_stale_s

        def stale() -> bool:
            t = clock()
            return any(t - s.last_stamp > limits[k] for k, s in seen.items() if k in limits)

        grace = time.monotonic() + STALE_GRACE_S
        while stale() and time.monotonic() < grace:
            executor.spin_once(timeout_sec=0.02)
        # The command side is discovered like the inputs, as late on a busy machine (CI once saw an action server
        # created 3 s earlier still undiscovered): a controller that looks missing gets discovery_s to appear.
        grace = time.monotonic() + discovery_s
        while not config.robot.dry_run and _controller_missing(node, config) and time.monotonic() < grace:
            executor.spin_once(timeout_sec=0.05)
        now = clock()
        checks = [_camera(node, c.name, c.topic, c.compressed, seen.get(c.topic), now, config) for c in topics.cameras]
        checks.append(_joints(node, seen.get(topics.joint_states), now, config))
        notes: list[str] = []
        checks += _prompt_qos(node, topics.prompt)
        prompt = seen.get(topics.prompt)
        if prompt is not None:
            notes.append(f"prompt on {topics.prompt}: '{prompt.last.data.strip()}'")
        elif topics.default_prompt:
            notes.append(f"no prompt on {topics.prompt}; default_prompt '{topics.default_prompt}' is used")
        else:
            notes.append(f"no prompt on {topics.prompt} yet: publish one, or send a RunPolicy goal")
        checks += _outputs(node, config, notes)
    finally:
        executor.shutdown()
        node.destroy_node()
    return checks, notes


def _publishers(node: Any, topic: str) -> tuple[int, list[str]]:
    infos = node.get_publishers_info_by_topic(topic)
    return len(infos), sorted({i.topic_type for i in infos})


def _header(node: Any, topic: str, expected: str, s: Seen | None, now: float, stale_s: float) -> tuple[str, str]:
    """(problem, detail) common to every input: publishers, type, rate, age."""
    count, types = _publishers(node, topic)
    detail = f"publishers {count}" + (f" {','.join(types)}" if types else "")
    if count == 0:
        return f"nothing publishes {topic}", detail
    if expected not in types:
        return f"{topic} carries {', '.join(types)}, the node expects {expected}", detail
    if s is None or not s.received:
        return f"no message on {topic} in the observation (publisher QoS, or it does not publish)", detail
    age = now - s.last_stamp
    detail += f", {rate(s.received):.1f} Hz, age {age:.2f} s"
    if age > stale_s:
        return f"{topic} is stale: its latest message is {age:.2f} s old > {stale_s} s (header stamp)", detail
    return "", detail


def _camera(node: Any, name: str, topic: str, compressed: bool, s: Seen | None, now: float, config: OmniConfig):
    expected = COMPRESSED if compressed else IMAGE
    problem, detail = _header(node, topic, expected, s, now, config.control.camera_stale_s)
    if s is not None and s.last is not None:
        msg = s.last
        detail += f", {msg.format}" if compressed else f", {msg.width}x{msg.height} {msg.encoding}"
        if not problem and s.error:
            problem = f"camera '{name}': {s.error}"
    return Check(f"camera '{name}'", topic, problem, detail)


def _joints(node: Any, s: Seen | None, now: float, config: OmniConfig) -> Check:
    topic = config.topics.joint_states
    problem, detail = _header(node, topic, JOINT_STATE, s, now, config.control.state_stale_s)
    wanted = config.robot.joint_names
    if s is not None and s.last is not None:
        names = list(s.last.name)
        missing = [j for j in wanted if j not in names]
        detail += f", joints {len(wanted) - len(missing)}/{len(wanted)} present"
        if missing:
            detail += f" (missing {missing}; it sends {names})"
            problem = problem or f"{topic} lacks joints {missing} of robot.joint_names"
    return Check("joint_states", topic, problem, detail)


def _prompt_qos(node: Any, topic: str) -> list[Check]:
    """A prompt publisher the node cannot hear: it subscribes latched (transient local), which a volatile
    publisher does not offer, so DDS never matches them and the prompt is silently lost."""
    from rclpy.qos import DurabilityPolicy

    infos = node.get_publishers_info_by_topic(topic)
    volatile = [i for i in infos if i.qos_profile.durability == DurabilityPolicy.VOLATILE]
    if not infos or len(volatile) < len(infos):
        return []
    problem = (
        f"{topic} is published VOLATILE; the node subscribes TRANSIENT_LOCAL (latched), so no prompt arrives: "
        "publish it with durability transient_local"
    )
    return [Check("prompt", topic, problem, f"publishers {len(infos)} volatile")]


def _controller_missing(node: Any, config: OmniConfig) -> bool:
    """Whether a command output has nothing on its other end (yet: discovery may still be under way)."""
    interface = config.robot.command_interface
    if interface == "follow_joint_trajectory":
        action = config.control.follow_joint_trajectory.action
        if not dict(node.get_service_names_and_types()).get(f"{action}/_action/send_goal"):
            return True
    topics = [config.control.command_topic] if interface == "joint_trajectory" else []
    topics += [config.topics.forward_command] if config.topics.forward_command else []
    return any(node.count_subscribers(t) == 0 for t in topics)


def _outputs(node: Any, config: OmniConfig, notes: list[str]) -> list[Check]:
    checks = []
    interface = config.robot.command_interface
    services = dict(node.get_service_names_and_types())
    outputs = []
    if interface == "joint_trajectory":
        outputs.append(("commands", config.control.command_topic, TRAJECTORY))
    if config.topics.forward_command:
        outputs.append(("forward_command", config.topics.forward_command, "std_msgs/msg/Float64MultiArray"))
    if interface == "follow_joint_trajectory":
        action = config.control.follow_joint_trajectory.action
        types = services.get(f"{action}/_action/send_goal", [])
        expected = "control_msgs/action/FollowJointTrajectory_SendGoal"
        problem = ""
        if not types:
            problem = f"no controller serves {action}: trajectories would go nowhere"
            if config.robot.dry_run:
                notes.append(f"no controller serves {action} (fine in dry run: nothing is commanded)")
                problem = ""
        elif expected not in types:
            problem = f"{action} is served as {', '.join(types)}, the node sends FollowJointTrajectory"
        detail = "action server " + ("up" if types else "missing")
        checks.append(Check("commands (action)", action, problem, detail))
    for what, topic, expected in outputs:
        infos = node.get_subscriptions_info_by_topic(topic)
        types = sorted({i.topic_type for i in infos})
        detail = f"subscribers {len(infos)}" + (f" {','.join(types)}" if types else "")
        problem = ""
        if not infos:
            if config.robot.dry_run:
                notes.append(f"no controller subscribes {topic} (fine in dry run: nothing is commanded)")
            else:
                problem = f"no controller subscribes {topic}: commands would go nowhere"
        elif expected not in types:
            problem = f"{topic} is subscribed as {', '.join(types)}, the node publishes {expected}"
        checks.append(Check(what, topic, problem, detail))
    served = f"{config.topics.run_policy}/_action/send_goal" in services
    notes.append(
        f"RunPolicy {config.topics.run_policy}: "
        + ("served (a policy node is up)" if served else "not served yet (the policy node serves it once configured)")
    )
    return checks


def verdict(checks: list[Check]) -> str:
    for c in checks:
        if c.problem:
            return f"verdict: NOT READY: {c.problem}"
    return "verdict: ready"


def run(config: OmniConfig, seconds: float) -> int:
    """Initialise rclpy (LOCALHOST discovery unless the user chose), observe, print the report; exit status."""
    import rclpy

    from omni_ros.ros_env import default_to_localhost

    default_to_localhost()
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        checks, notes = observe(config, seconds, context)
    finally:
        context.try_shutdown()
    print(f"omni-ros doctor: listened {seconds:g} s")
    for c in checks:
        print(c.line())
    for n in notes:
        print(f"note: {n}")
    line = verdict(checks)
    print(line)
    return 0 if line == "verdict: ready" else 1
