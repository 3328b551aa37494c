"""A stand-in for ros2_control's joint_trajectory_controller: a control_msgs/FollowJointTrajectory action server
that records every goal and cancel (JSON lines) and accepts, rejects or aborts as its mode topic says.

    python test/helpers/fjt_controller.py ACTION RECORD_FILE [--mode-topic /fjt_test/mode]

Modes (std_msgs/String on the mode topic, latched): accept (a goal stays executing until a newer goal preempts
it, as the real controller's does, or it is cancelled: unlike the real one it does not end at the trajectory's
end, so that a stop always finds a goal to cancel), reject (refuse goals), abort (accept, then abort at once
with PATH_TOLERANCE_VIOLATED).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time

import rclpy
from control_msgs.action import FollowJointTrajectory
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String


def seconds(duration) -> float:
    return duration.sec + duration.nanosec * 1e-9


class Controller:
    def __init__(self, node, action: str, record: str, mode_topic: str) -> None:
        self.node, self.record = node, record
        self.mode = "accept"
        self.lock = threading.Lock()
        self.latest = 0  # sequence number of the newest goal (older ones are preempted)
        group = ReentrantCallbackGroup()
        latched = QoSProfile(
            depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL
        )
        node.create_subscription(String, mode_topic, self._set_mode, latched, callback_group=group)
        self.server = ActionServer(
            node,
            FollowJointTrajectory,
            action,
            execute_callback=self._execute,
            goal_callback=self._goal,
            cancel_callback=self._cancel,
            callback_group=group,
        )

    def _write(self, entry: dict) -> None:
        entry["received"] = time.time()
        with self.lock, open(self.record, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def _set_mode(self, msg: String) -> None:
        self.mode = msg.data
        self._write({"mode": msg.data})

    def _goal(self, goal) -> GoalResponse:
        t = goal.trajectory
        self._write(
            {
                "goal": True,
                "mode": self.mode,
                "stamp": t.header.stamp.sec + t.header.stamp.nanosec * 1e-9,
                "joint_names": list(t.joint_names),
                "times": [seconds(p.time_from_start) for p in t.points],
                "positions": [list(p.positions) for p in t.points],
                "path_tolerance": [[j.name, j.position] for j in goal.path_tolerance],
                "goal_tolerance": [[j.name, j.position, j.velocity] for j in goal.goal_tolerance],
                "goal_time_tolerance": seconds(goal.goal_time_tolerance),
            }
        )
        return GoalResponse.REJECT if self.mode == "reject" else GoalResponse.ACCEPT

    def _cancel(self, handle) -> CancelResponse:
        self._write({"cancel": True})
        return CancelResponse.ACCEPT

    def _execute(self, handle):
        with self.lock:
            self.latest += 1
            seq = self.latest
        result = FollowJointTrajectory.Result()
        while True:
            if handle.is_cancel_requested:
                handle.canceled()  # the real controller holds position here
                return result
            if seq != self.latest:
                result.error_code = FollowJointTrajectory.Result.INVALID_GOAL
                result.error_string = "Current goal cancelled due to new incoming action."
                handle.abort()
                return result
            if self.mode == "abort":
                result.error_code = FollowJointTrajectory.Result.PATH_TOLERANCE_VIOLATED
                result.error_string = "joint_1 path error 0.7 > 0.5"
                handle.abort()
                return result
            time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action")
    parser.add_argument("record")
    parser.add_argument("--mode-topic", default="/fjt_test/mode")
    args = parser.parse_args()
    rclpy.init()
    node = rclpy.create_node("fjt_controller")
    Controller(node, args.action, args.record, args.mode_topic)
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(node)
    with contextlib.suppress(KeyboardInterrupt):
        executor.spin()


if __name__ == "__main__":
    main()
