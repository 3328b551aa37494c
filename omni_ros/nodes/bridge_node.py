"""The OpenPI WebSocket bridge hosted as a ROS node.

In `omni-ros up --bridge` it serves the very policy object the policy node
runs (one model in memory, one behaviour); started alone it loads the policy
from the config. The server runs on its own event-loop thread, so ROS
callbacks and WebSocket clients never wait for each other.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rclpy.node import Node

from omni_ros.config import OmniConfig
from omni_ros.policy.base import Policy


class BridgeNode(Node):
    def __init__(
        self, config: OmniConfig, policy: Policy | None = None, node_name: str = "omni_ros_bridge", **kwargs
    ) -> None:
        from omni_ros.serving.keymap import CANONICAL, KeyMap, load_keymap
        from omni_ros.serving.server import ServerThread, check_compatible

        canonical = config.serve.keymap == CANONICAL
        keymap = None if canonical else load_keymap(config.serve.keymap)
        if policy is None:
            from omni_ros.backends.factory import load_policy

            policy = load_policy(
                config.policy,
                camera_names=[c.name for c in config.topics.cameras],
                state_dim=len(config.robot.joint_names),
                action_dim=len(config.robot.joint_names),
            )
        if keymap is None:
            keymap = KeyMap.canonical(policy.spec)
        check_compatible(policy, keymap)
        super().__init__(node_name, **kwargs)
        self.policy = policy
        self.server = ServerThread(policy, config.serve, keymap).start()
        self.get_logger().info(
            f"OpenPI bridge on {self.server.url} (key map '{keymap.name}', policy {policy.metadata.model}); "
            f"health: http://{config.serve.host}:{self.server.port}/healthz"
        )

    def destroy_node(self) -> None:
        self.server.stop()
        super().destroy_node()


def main(argv: Sequence[str] | None = None) -> int:
    from omni_ros.commands.common import add_precision_args, apply_precision_args
    from omni_ros.config import load_config
    from omni_ros.errors import OmniRosError
    from omni_ros.ros_env import run_node

    parser = argparse.ArgumentParser(prog="bridge_node", description="omni_ros OpenPI WebSocket bridge node")
    parser.add_argument("--config", help="omni_ros YAML config (its policy: and serve: sections are used)")
    add_precision_args(parser)
    args, ros_args = parser.parse_known_args(argv)
    try:
        config = load_config(args.config)
        apply_precision_args(config, args)
    except OmniRosError as exc:
        print(f"bridge_node: {exc}", file=sys.stderr)
        return 2
    from omni_ros import cpu_threads

    cpu_threads.configure(config.policy)
    return run_node("bridge_node", lambda: BridgeNode(config), ros_args, (OmniRosError, OSError))


if __name__ == "__main__":
    sys.exit(main())
