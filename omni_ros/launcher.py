"""`omni-ros up`: start the omni_ros nodes in one process.

This is the Python twin of launch/omni_ros.launch.py for machines without
`launch_ros` (such as a pip-only install): the same nodes, one
MultiThreadedExecutor, Ctrl-C to stop.
"""

from __future__ import annotations

import logging
import signal
import time

from omni_ros.config import OmniConfig
from omni_ros.ros_env import default_to_localhost

log = logging.getLogger(__name__)


def run_stack(config: OmniConfig, sim: bool = False, duration: float = 0.0) -> int:
    """Run the configured nodes until Ctrl-C or `duration` seconds (0 = forever)."""
    default_to_localhost()
    import rclpy
    from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor

    from omni_ros.msg import PolicyStatus
    from omni_ros.nodes.status_node import StatusNode

    rclpy.init(
        args=["omni-ros", "--ros-args", "--disable-external-lib-logs"],
        signal_handler_options=rclpy.signals.SignalHandlerOptions.NO,
    )
    status = StatusNode(config)
    status.detail = "placeholder stack: status only" + (" (sim)" if sim else "")
    monitor = rclpy.create_node("omni_ros_monitor")
    received = []

    def on_status(msg: PolicyStatus) -> None:
        received.append(msg)
        print(
            f"[monitor] {config.status.topic}: state={msg.state_name} backend={msg.backend} "
            f"model={msg.model} dry_run={msg.dry_run} detail='{msg.detail}'",
            flush=True,
        )

    monitor.create_subscription(PolicyStatus, config.status.topic, on_status, 10)
    executor = MultiThreadedExecutor(num_threads=2)
    for node in (status, monitor):
        executor.add_node(node)

    stop = {"flag": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    print(f"omni-ros up: config '{config.name}', status on {config.status.topic}; Ctrl-C to stop", flush=True)
    deadline = time.monotonic() + duration if duration > 0 else float("inf")
    try:
        while not stop["flag"] and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
    except ExternalShutdownException:
        pass
    finally:
        executor.shutdown()
        for node in (status, monitor):
            node.destroy_node()
        rclpy.try_shutdown()
    print(f"omni-ros up: stopped after {len(received)} status messages", flush=True)
    return 0 if received else 1
