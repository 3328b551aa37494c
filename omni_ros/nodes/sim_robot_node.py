"""Simulated robot node: a planar arm with cameras, standing in for hardware over ROS 2.

    python -m omni_ros.nodes.sim_robot_node [--config config/sim.yaml] [--seed N] [--duration S]

Publishes, from the config's `sim:` section,
- `sensor_msgs/Image` (rgb8) per camera on `camera_topic` ("/camera/base/image_raw", ...) at `camera_rate_hz`,
  stamped with the time the frame was rendered;
- `sensor_msgs/JointState` (names, positions, velocities) on `joint_state_topic` at `joint_state_rate_hz`;
- the episode's prompt as `std_msgs/String` on `prompt_topic` (transient-local: late joiners get it);
- the episode (seed, target, prompt, success, time) as JSON `std_msgs/String` on `episode_topic`;
- `std_msgs/Bool` on `success_topic`: true when the episode succeeds, false when the next one starts;
and follows `trajectory_msgs/JointTrajectory` on `control.command_topic` (the first point is the position
target now; joints matched by name). `std_srvs/Trigger` on `reset_service` starts the next episode, as does
the end of an episode after `auto_reset_s`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from omni_ros.config import OmniConfig
from omni_ros.ros_convert import rgb_to_image
from omni_ros.sim.engines import make_env

# Reliable publishers serve both reliable and best-effort (sensor-data) subscribers.
SENSOR_QOS = QoSProfile(depth=2, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE)
LATCHED_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
COMMAND_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
# Longest simulated step after a stall (a paused process must not teleport the arm).
MAX_STEP_S = 0.1


class SimRobotNode(Node):
    """Runs a `SimEnv` in real time and exposes it like a robot driver (see module docstring)."""

    def __init__(self, config: OmniConfig, node_name: str = "omni_ros_sim", seed: int | None = None, **kwargs) -> None:
        sim = config.sim
        env = make_env(sim)  # SimConfig checked its settings; the simulator fails here, before any ROS entity
        super().__init__(node_name, **kwargs)
        self.config = config
        self.env = env
        self._seed = sim.seed if seed is None else int(seed)
        self._group = MutuallyExclusiveCallbackGroup()  # callbacks share the env: one at a time
        self._image_pubs = {
            cam: self.create_publisher(Image, sim.camera_topic.format(camera=cam), SENSOR_QOS) for cam in sim.cameras
        }
        self._joint_pub = self.create_publisher(JointState, sim.joint_state_topic, SENSOR_QOS)
        self._prompt_pub = self.create_publisher(String, sim.prompt_topic, LATCHED_QOS)
        self._episode_pub = self.create_publisher(String, sim.episode_topic, LATCHED_QOS)
        # Volatile: a late subscriber (a RunPolicy goal) must see the next success, not an old episode's.
        self._success_pub = self.create_publisher(Bool, sim.success_topic, COMMAND_QOS)
        self.create_subscription(
            JointTrajectory, config.control.command_topic, self._on_command, COMMAND_QOS, callback_group=self._group
        )
        self.create_service(Trigger, sim.reset_service, self._on_reset, callback_group=self._group)
        self.commands_received = 0
        self.commands_rejected = 0
        self._last_reject = ("", 0.0)
        self.frames_published = 0
        self._last_step = time.monotonic()
        self._ended_at: float | None = None
        self._reset_episode(self._seed)
        self.create_timer(1.0 / sim.joint_state_rate_hz, self._on_state_timer, callback_group=self._group)
        self.create_timer(1.0 / sim.camera_rate_hz, self._on_camera_timer, callback_group=self._group)
        cams = ", ".join(sim.camera_topic.format(camera=c) for c in sim.cameras)
        self.get_logger().info(
            f"simulated {sim.engine} {env.n_joints}-joint arm: cameras {cams} at {sim.camera_rate_hz:g} Hz, "
            f"joint states {sim.joint_state_topic}, commands {config.control.command_topic}"
        )

    # ----- episode ------------------------------------------------------------------------------------------

    def _reset_episode(self, seed: int) -> None:
        self.env.reset(seed)
        assert self.env.task is not None and self.env.scene is not None  # set by reset()
        self._seed = seed
        self._ended_at = None
        self._last_step = time.monotonic()
        self._prompt_pub.publish(String(data=self.env.task.prompt))
        self._success_pub.publish(Bool(data=False))
        self._publish_episode()
        self.get_logger().info(f"episode seed {seed}: '{self.env.task.prompt}' (blocks {self.env.scene.colors})")

    def episode_info(self) -> dict:
        assert self.env.episode is not None  # the node resets the sim before it serves
        info = self.env.episode.to_dict()
        info.update(
            success=self.env.succeeded_at is not None,
            time_to_success=self.env.succeeded_at,
            time=round(self.env.time, 3),
            distance=round(self.env.distance_to_target(), 4),
        )
        return info

    def _publish_episode(self) -> None:
        self._episode_pub.publish(String(data=json.dumps(self.episode_info())))

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        self._reset_episode(self._seed + 1)
        response.success = True
        assert self.env.episode is not None  # the node resets the sim before it serves
        response.message = json.dumps(self.env.episode.to_dict())
        return response

    # ----- simulation ---------------------------------------------------------------------------------------

    def _advance(self) -> None:
        now = time.monotonic()
        dt = min(now - self._last_step, MAX_STEP_S)
        self._last_step = now
        if dt <= 0:
            return
        was_success = self.env.succeeded_at is not None
        self.env.step(dt)
        if not was_success and self.env.succeeded_at is not None:
            assert self.env.task is not None  # the node resets the sim before it serves
            self.get_logger().info(
                f"success: reached the {self.env.task.target} block in {self.env.succeeded_at:.2f} s"
            )
            self._publish_episode()
            self._success_pub.publish(Bool(data=True))
        ended = self.env.succeeded_at is not None or self.env.done
        if ended and self._ended_at is None:
            self._ended_at = now
            if self.env.succeeded_at is None:
                self._publish_episode()
        delay = self.config.sim.auto_reset_s
        if self._ended_at is not None and delay > 0 and now - self._ended_at >= delay:
            self._reset_episode(self._seed + 1)

    def _on_state_timer(self) -> None:
        self._advance()
        msg = JointState()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.name = list(self.env.joint_names)
        msg.position = self.env.positions.tolist()
        msg.velocity = self.env.velocities.tolist()
        self._joint_pub.publish(msg)

    def _on_camera_timer(self) -> None:
        self._advance()
        stamp = self.get_clock().now().to_msg()
        for camera, frame in self.env.render().items():
            msg = rgb_to_image(frame, Image(), frame_id=f"{camera}_camera")
            msg.header.stamp = stamp
            self._image_pubs[camera].publish(msg)
            self.frames_published += 1

    def _on_command(self, msg: JointTrajectory) -> None:
        try:
            target = self._command_target(msg)
        except ValueError as exc:
            self.commands_rejected += 1
            # A new reason is logged at once; a repeated one at most every 2 s (commands come at 50 Hz).
            now = time.monotonic()
            if str(exc) != self._last_reject[0] or now - self._last_reject[1] > 2.0:
                self._last_reject = (str(exc), now)
                self.get_logger().warning(f"rejected joint command: {exc}")
            return
        self._advance()  # the old target applied until now
        self.env.command(target)
        self.commands_received += 1

    def _command_target(self, msg: JointTrajectory) -> np.ndarray:
        if not msg.points:
            raise ValueError("trajectory has no points")
        names = list(msg.joint_names)
        positions = list(msg.points[0].positions)
        if len(positions) != len(names):
            raise ValueError(f"{len(positions)} positions for {len(names)} joint names")
        index = {name: i for i, name in enumerate(names)}
        missing = [n for n in self.env.joint_names if n not in index]
        if missing:
            raise ValueError(f"missing joints {missing} (got {names})")
        target = np.array([positions[index[n]] for n in self.env.joint_names], dtype=np.float64)
        if not np.all(np.isfinite(target)):
            raise ValueError(f"non-finite positions {target.tolist()}")
        return target


def main(argv: Sequence[str] | None = None) -> int:
    from omni_ros.config import ConfigError, load_config
    from omni_ros.ros_env import run_node

    parser = argparse.ArgumentParser(prog="sim_robot_node", description="omni_ros simulated robot")
    parser.add_argument("--config", help="omni_ros YAML config (its sim: and control: sections are used)")
    parser.add_argument("--seed", type=int, help="seed of the first episode (default: sim.seed)")
    parser.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds (0: run forever)")
    args, ros_args = parser.parse_known_args(argv)
    try:
        config = load_config(args.config)
        make_env(config.sim)
    except (ConfigError, ValueError) as exc:
        print(f"sim_robot_node: config error: {exc}", file=sys.stderr)
        return 2
    return run_node(
        "sim_robot_node", lambda: SimRobotNode(config, seed=args.seed), ros_args, (ValueError,), duration=args.duration
    )


if __name__ == "__main__":
    sys.exit(main())
