"""A policy node (tiny model) with a peer node that plays the robot: cameras, joint states, prompt.

The peer publishes over real DDS at 30 Hz from its own thread; what it sends
is controlled by flags so a test can break one input at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import rclpy
from rclpy.executors import SingleThreadedExecutor
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from omni_ros.config import OmniConfig, load_config
from omni_ros.msg import ActionChunk, PolicyStatus
from omni_ros.nodes.policy_node import LATCHED, PolicyNode
from omni_ros.ros_convert import rgb_to_image
from omni_ros.ros_env import shutdown_executor

JOINTS = ["joint_1", "joint_2", "joint_3"]


@dataclass
class Inputs:
    cameras: bool = True
    bad_encoding: bool = False
    joints: list[str] = field(default_factory=lambda: list(JOINTS))
    nan: bool = False


class Harness:
    def __init__(self, dry_run: bool = False, configure: Callable[[OmniConfig], None] | None = None) -> None:
        cfg: OmniConfig = load_config("config/sim.yaml")
        cfg.policy.preset = "tiny"
        cfg.robot.joint_names = list(JOINTS)
        cfg.robot.dry_run = dry_run
        cfg.status.rate_hz = 10.0
        if configure is not None:
            configure(cfg)
        self.config = cfg
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = PolicyNode(cfg, node_name="policy_under_test", context=self.context)
        from rclpy.node import Node

        self.peer = Node("robot_peer", context=self.context)
        self.inputs = Inputs(joints=list(cfg.robot.joint_names))
        self.chunks: list[ActionChunk] = []
        self.commands: list[JointTrajectory] = []
        self.statuses: list[PolicyStatus] = []
        self._cams = {c.name: self.peer.create_publisher(Image, c.topic, 10) for c in cfg.topics.cameras}
        self._joints = self.peer.create_publisher(JointState, cfg.topics.joint_states, 10)
        self._prompt = self.peer.create_publisher(String, cfg.topics.prompt, LATCHED)
        self.estop_pub = self.peer.create_publisher(Bool, cfg.topics.estop, 10)
        self.peer.create_subscription(ActionChunk, cfg.topics.action_chunk, self.chunks.append, 50)
        self.peer.create_subscription(JointTrajectory, cfg.control.command_topic, self.commands.append, 100)
        self.peer.create_subscription(PolicyStatus, cfg.status.topic, self.statuses.append, 50)
        self.pause_client = self.peer.create_client(Trigger, "/policy_under_test/pause")
        self.resume_client = self.peer.create_client(Trigger, "/policy_under_test/resume")
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.peer)
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self.executor.spin, daemon=True),
            threading.Thread(target=self._publish_loop, daemon=True),
        ]

    def start(self, prompt: str | None = "reach the red block") -> Harness:
        """Configure and activate the node, start the peer, publish `prompt` (None: no prompt)."""
        self.node.trigger_configure()
        self.node.trigger_activate()
        for t in self._threads:
            t.start()
        if prompt is not None:
            self._prompt.publish(String(data=prompt))
        return self

    def _publish_loop(self) -> None:
        frame = np.zeros((48, 48, 3), np.uint8)
        while not self._stop.is_set():
            stamp = self.peer.get_clock().now().to_msg()
            inputs = self.inputs
            if inputs.cameras:
                for pub in self._cams.values():
                    msg = rgb_to_image(frame, Image())
                    if inputs.bad_encoding:
                        msg.encoding = "16UC1"
                    msg.header.stamp = stamp
                    pub.publish(msg)
            js = JointState(name=list(inputs.joints), position=[0.1 * i for i in range(len(inputs.joints))])
            if inputs.nan and js.position:
                js.position[0] = float("nan")
            js.header.stamp = stamp
            self._joints.publish(js)
            time.sleep(1 / 30)

    def wait_for(self, predicate, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return False

    def wait_state(self, name: str, timeout: float = 10.0) -> PolicyStatus:
        start = len(self.statuses)
        assert self.wait_for(lambda: any(s.state_name == name for s in self.statuses[start:]), timeout), (
            f"status never became '{name}'; last: {[(s.state_name, s.detail) for s in self.statuses[-3:]]}"
        )
        return next(s for s in self.statuses[start:] if s.state_name == name)

    def commands_during(self, seconds: float) -> int:
        before = len(self.commands)
        time.sleep(seconds)
        return len(self.commands) - before

    def call(self, client, timeout: float = 5.0) -> Trigger.Response:
        assert client.wait_for_service(timeout_sec=timeout)
        future = client.call_async(Trigger.Request())
        assert self.wait_for(future.done, timeout)
        return future.result()

    def close(self) -> None:
        self._stop.set()
        shutdown_executor(self.executor)
        self.node.destroy_node()
        self.peer.destroy_node()
        self.context.try_shutdown()
