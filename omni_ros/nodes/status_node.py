"""A node that reports the runtime's health as `omni_ros/PolicyStatus`."""

from __future__ import annotations

import time

from rclpy.node import Node

from omni_ros.config import OmniConfig
from omni_ros.msg import PolicyStatus

STATE_NAMES = {
    PolicyStatus.IDLE: "idle",
    PolicyStatus.RUNNING: "running",
    PolicyStatus.STALE_INPUT: "stale-input",
    PolicyStatus.PAUSED: "paused",
    PolicyStatus.ESTOPPED: "e-stopped",
    PolicyStatus.ERROR: "error",
}


class StatusNode(Node):
    """Publishes PolicyStatus at `status.rate_hz`; the state is set by its owner."""

    def __init__(self, config: OmniConfig, node_name: str = "omni_ros_status") -> None:
        super().__init__(node_name)
        self._config = config
        self.state = PolicyStatus.IDLE
        self.detail = "waiting for a policy"
        self.counters = {"chunks": 0, "commands": 0, "dropped_frames": 0, "errors": 0}
        self.last_inference_time = 0.0
        self._pub = self.create_publisher(PolicyStatus, config.status.topic, 10)
        self._timer = self.create_timer(1.0 / config.status.rate_hz, self.publish_status)
        self._started = time.monotonic()

    def publish_status(self) -> PolicyStatus:
        msg = PolicyStatus()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.state = self.state
        msg.state_name = STATE_NAMES[self.state]
        policy = self._config.policy
        msg.backend = f"{policy.backend}-{policy.device}"
        msg.model = policy.checkpoint or policy.preset
        msg.last_inference_time = float(self.last_inference_time)
        msg.control_rate = float(self._config.robot.control_rate_hz)
        msg.dry_run = self._config.robot.dry_run
        for key, value in self.counters.items():
            setattr(msg, key, value)
        msg.detail = self.detail
        self._pub.publish(msg)
        return msg
