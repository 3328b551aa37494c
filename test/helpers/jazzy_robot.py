"""A robot process built only from the ROS 2 Jazzy wheels (run with .venv-jazzy/bin/python, never the product
venv; it imports nothing of omni_ros): publishes two 240x320 rgb8 cameras at 15 Hz, joint states at 50 Hz (at
the latest commanded position) and a latched prompt, and records the trajectory_msgs/JointTrajectory commands it
receives. After `--seconds` of commands (longer, up to `--max-seconds`, until it holds `--min-commands` whose
stamps span `--span` seconds and fill `--min-bins` distinct 0.1 s intervals: a node stalled by a busy machine
resumes its stream), or `--timeout` without any, it
prints one JSON line and exits:

    {"rclpy": path, "commands": n, "rate_hz": rate by the commands' header stamps, "span_s": first to last stamp,
     "stamp_bins": distinct 0.1 s intervals holding a stamp (a burst fills one or two, a stream many),
     "joint_names": [...] (each distinct list seen), "points": [...] (point counts seen), "finite": bool}
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

JOINTS = ["joint_1", "joint_2", "joint_3"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to record commands")
    parser.add_argument("--span", type=float, default=0.0, help="keep recording until the stamps span this long")
    parser.add_argument("--min-commands", type=int, default=0, help="keep recording until this many commands")
    parser.add_argument("--min-bins", type=int, default=0, help="... and their stamps fill this many 0.1 s intervals")
    parser.add_argument(
        "--max-seconds", type=float, default=0.0, help="the longest recording when --span or --min-commands ask more"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="give up without a first command")
    args = parser.parse_args()
    rclpy.init()
    node = rclpy.create_node("jazzy_robot")
    cams = {
        name: node.create_publisher(Image, f"/camera/{name}/image_raw", qos_profile_sensor_data)
        for name in ("base", "wrist")
    }
    joints = node.create_publisher(JointState, "/joint_states", qos_profile_sensor_data)
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    prompt = node.create_publisher(String, "/omni_ros/prompt", latched)
    prompt.publish(String(data="reach the red block"))
    frame = np.full((240, 320, 3), 90, np.uint8).tobytes()  # tobytes: assigning an ndarray is ~50x slower
    position = [0.0, 0.0, 0.0]
    received: list[JointTrajectory] = []

    def on_command(msg: JointTrajectory) -> None:
        received.append(msg)
        if msg.points and len(msg.points[0].positions) == len(JOINTS):
            position[:] = list(msg.points[0].positions)

    node.create_subscription(JointTrajectory, "/arm_controller/joint_trajectory", on_command, 100)

    def publish_images() -> None:
        stamp = node.get_clock().now().to_msg()
        for pub in cams.values():
            msg = Image(height=240, width=320, encoding="rgb8", step=320 * 3, data=frame)
            msg.header.stamp = stamp
            pub.publish(msg)

    def publish_state() -> None:
        msg = JointState(name=JOINTS, position=list(position))
        msg.header.stamp = node.get_clock().now().to_msg()
        joints.publish(msg)

    node.create_timer(1 / 15, publish_images)
    node.create_timer(1 / 50, publish_state)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    deadline = time.monotonic() + args.timeout
    while not received and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.05)
    first = len(received)
    start = time.monotonic()
    end, limit = start + args.seconds, start + max(args.seconds, args.max_seconds)

    def stamp(m: JointTrajectory) -> float:
        return m.header.stamp.sec + m.header.stamp.nanosec * 1e-9

    def span_s() -> float:
        stamps = [stamp(m) for m in received[first:]]
        return max(stamps) - min(stamps) if len(stamps) > 1 else 0.0

    def bins() -> int:
        return len({math.floor(stamp(m) * 10) for m in received[first:]})

    def enough() -> bool:
        return span_s() >= args.span and len(received) - first >= args.min_commands and bins() >= args.min_bins

    # enough() reads every command: asked twice a second, not at every spin (it would take the CPU it measures).
    done, next_check = False, end
    while received and not done:
        executor.spin_once(timeout_sec=0.01)
        now = time.monotonic()
        if now >= limit:
            break
        if now >= next_check:
            done, next_check = enough(), now + 0.5
    window = received[first:]
    stamps = [stamp(m) for m in window]
    span = span_s()
    report = {
        "rclpy": rclpy.__file__,
        "commands": len(window),
        # Rate by the node's own stamps (when each command was sent), counting only those that arrived here.
        "rate_hz": (len(stamps) - 1) / span if span > 0 else 0.0,
        "span_s": span,
        "stamp_bins": bins(),
        "joint_names": sorted({tuple(m.joint_names) for m in window}),
        "points": sorted({len(m.points) for m in window}),
        "finite": all(math.isfinite(v) for m in window for p in m.points for v in p.positions),
    }
    print(json.dumps(report), flush=True)
    node.destroy_node()
    rclpy.try_shutdown()


if __name__ == "__main__":
    main()
