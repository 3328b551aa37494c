"""How the policy node's commands reach the robot's controller (`robot.command_interface`).

    joint_trajectory         trajectory_msgs/JointTrajectory on control.command_topic, one point (the target now)
                             per control tick; topics.forward_command, when set, gets a Float64MultiArray copy
    forward_position         std_msgs/Float64MultiArray on topics.forward_command per control tick, in
                             robot.joint_names order (ros2_control's forward_command_controller)
    follow_joint_trajectory  each chunk as one control_msgs/FollowJointTrajectory goal: the executor's plan at the
                             chunk's action times still ahead (blended and limited as the ticks would command it),
                             time_from_start increasing per point; the controller (joint_trajectory_controller,
                             MoveIt) interpolates. A stop (cancel, e-stop, stale input, pause, deactivation)
                             cancels the controller's goal, which holds position. A rejected or aborted goal is a
                             controller failure: commands stop and the node reports it (status, RunPolicy).

Every interface has `send(positions, now)` (a control tick that commands), `halt()` (commands stop now) and
`destroy()`. `send` runs on the control thread; rclpy's ActionClient guards its state with a lock, and its
callbacks run on the node's executor thread, where a failure is only recorded (`on_failure` must not wait on
the control thread: the client may hold its lock while it calls back).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from omni_ros.config import OmniConfig
from omni_ros.control.limits import per_joint
from omni_ros.nodes import messages

# control_msgs/action/FollowJointTrajectory Result error codes, by value, for the status line.
FJT_ERRORS = {
    0: "SUCCESSFUL",
    -1: "INVALID_GOAL",
    -2: "INVALID_JOINTS",
    -3: "OLD_HEADER_TIMESTAMP",
    -4: "PATH_TOLERANCE_VIOLATED",
    -5: "GOAL_TOLERANCE_VIOLATED",
}


class CommandInterface(Protocol):
    def send(self, positions: np.ndarray, now: float) -> None: ...
    def halt(self) -> None: ...
    def destroy(self) -> None: ...


class TopicCommands:
    """joint_trajectory and forward_position: a message per control tick on lifecycle publishers."""

    def __init__(self, node: Any, config: OmniConfig) -> None:
        from std_msgs.msg import Float64MultiArray
        from trajectory_msgs.msg import JointTrajectory

        self._node, self._robot = node, config.robot
        self._trajectory = self._forward = None
        if config.robot.command_interface == "joint_trajectory":
            self._trajectory = node.create_lifecycle_publisher(JointTrajectory, config.control.command_topic, 10)
        if config.topics.forward_command:
            self._forward = node.create_lifecycle_publisher(Float64MultiArray, config.topics.forward_command, 10)

    def send(self, positions: np.ndarray, now: float) -> None:
        robot = self._robot
        if self._trajectory is not None:
            period = 1.0 / robot.control_rate_hz
            self._trajectory.publish(messages.joint_command(robot.joint_names, positions, now, period))
        if self._forward is not None:
            self._forward.publish(messages.forward_command(positions))

    def halt(self) -> None:
        pass  # a position target per tick: no tick, no motion beyond the last target

    def destroy(self) -> None:
        for pub in (self._trajectory, self._forward):
            if pub is not None:
                self._node.destroy_lifecycle_publisher(pub)
        self._trajectory = self._forward = None


def tolerances(names: list[str], position: list[float], velocity: list[float] | None = None) -> list[Any]:
    """control_msgs/JointTolerance per joint from per-joint config lists (empty: none sent)."""
    from control_msgs.msg import JointTolerance

    pos = per_joint(position, len(names), "position tolerance")
    vel = per_joint(velocity or [], len(names), "velocity tolerance")
    if pos is None and vel is None:
        return []
    return [
        JointTolerance(
            name=n,
            position=0.0 if pos is None else float(pos[i]),
            velocity=0.0 if vel is None else float(vel[i]),
        )
        for i, n in enumerate(names)
    ]


def trajectory_goal(
    joint_names: list[str], times: np.ndarray, points: np.ndarray, stamp: float, config: OmniConfig
) -> Any:
    """A FollowJointTrajectory goal: point i at `stamp + times[i]`, with the configured tolerances."""
    from control_msgs.action import FollowJointTrajectory
    from trajectory_msgs.msg import JointTrajectoryPoint

    from omni_ros.ros_convert import sec_to_stamp

    fjt = config.control.follow_joint_trajectory
    goal = FollowJointTrajectory.Goal()
    sec_to_stamp(stamp, goal.trajectory.header.stamp)
    goal.trajectory.joint_names = list(joint_names)
    for t, q in zip(times, points, strict=True):
        point = JointTrajectoryPoint(positions=np.asarray(q, dtype=np.float64).tolist())
        ns = round(float(t) * 1e9)
        point.time_from_start.sec, point.time_from_start.nanosec = ns // 1_000_000_000, ns % 1_000_000_000
        goal.trajectory.points.append(point)
    goal.path_tolerance = tolerances(joint_names, fjt.path_position_tolerance)
    goal.goal_tolerance = tolerances(joint_names, fjt.goal_position_tolerance, fjt.goal_velocity_tolerance)
    ns = round(fjt.goal_time_tolerance_s * 1e9)
    goal.goal_time_tolerance.sec, goal.goal_time_tolerance.nanosec = ns // 1_000_000_000, ns % 1_000_000_000
    return goal


class FollowJointTrajectoryCommands:
    """follow_joint_trajectory: a goal per chunk to the controller's action server.

    `preview(now)` gives (seconds from now, positions) of the plan ahead (ActionChunkExecutor.preview) and
    `newest_chunk()` the id of the chunk it belongs to; `on_failure(reason)` is called (executor thread) when
    the controller rejects or aborts the latest goal, or its server is missing for server_timeout_s.
    """

    def __init__(
        self,
        node: Any,
        config: OmniConfig,
        preview: Callable[[float], tuple[np.ndarray, np.ndarray] | None],
        newest_chunk: Callable[[], int | None],
        on_failure: Callable[[str], None],
    ) -> None:
        from control_msgs.action import FollowJointTrajectory
        from rclpy.action import ActionClient

        self._node, self._config = node, config
        self._preview, self._newest_chunk, self._on_failure = preview, newest_chunk, on_failure
        self._action = config.control.follow_joint_trajectory.action
        self._client: Any = ActionClient(node, FollowJointTrajectory, self._action)
        self._lock = threading.Lock()
        self._sent_chunk: int | None = None  # the chunk of the latest goal (None: send the next one)
        self._seq = 0  # goals sent; callbacks of superseded goals are ignored
        self._handle: Any = None  # the latest accepted goal
        self._missing_since: float | None = None
        self._failed = False

    def send(self, positions: np.ndarray, now: float) -> None:
        chunk = self._newest_chunk()
        with self._lock:
            if self._failed or chunk is None or chunk == self._sent_chunk:
                return
        if not self._client.server_is_ready():
            with self._lock:
                self._missing_since = now if self._missing_since is None else self._missing_since
                missing = now - self._missing_since
            if missing >= self._config.control.follow_joint_trajectory.server_timeout_s:
                self._fail(f"no FollowJointTrajectory server on {self._action} for {missing:.1f} s")
            return
        plan = self._preview(now)
        if plan is None:
            return
        times, points = plan
        goal = trajectory_goal(self._config.robot.joint_names, times, points, now, self._config)
        with self._lock:
            self._missing_since = None
            self._sent_chunk = chunk
            self._seq += 1
            seq = self._seq
        future: Any = self._client.send_goal_async(goal)
        future.add_done_callback(functools.partial(self._on_response, seq))

    def halt(self) -> None:
        with self._lock:
            handle, self._handle = self._handle, None
            self._sent_chunk = None
            self._seq += 1  # whatever the controller says about earlier goals no longer matters
            # A failure stops commands through the loop (a pause, which halts here); after a resume or a new
            # RunPolicy goal, goals go out again.
            self._failed = False
            self._missing_since = None
        if handle is not None:
            handle.cancel_goal_async()  # joint_trajectory_controller holds position on cancel

    def destroy(self) -> None:
        self.halt()
        self._client.destroy()

    # -- callbacks (executor thread) ---------------------------------------------------------------------------

    def _on_response(self, seq: int, future: Any) -> None:
        handle = future.result()
        with self._lock:
            current = seq == self._seq
            if current and handle.accepted:
                self._handle = handle
        if not handle.accepted:
            if current:
                self._fail(f"controller {self._action} rejected the trajectory goal")
            return
        if not current:  # halted (or superseded) while the goal was in flight
            handle.cancel_goal_async()
            return
        handle.get_result_async().add_done_callback(functools.partial(self._on_result, seq))

    def _on_result(self, seq: int, future: Any) -> None:
        from action_msgs.msg import GoalStatus

        response = future.result()
        with self._lock:
            current = seq == self._seq
        if not current or response.status == GoalStatus.STATUS_CANCELED:
            return  # preempted by our next goal, or cancelled by a halt
        code, text = response.result.error_code, response.result.error_string
        if response.status == GoalStatus.STATUS_ABORTED or code != 0:
            name = FJT_ERRORS.get(code, str(code))
            self._fail(f"controller {self._action} aborted the trajectory: {name}" + (f": {text}" if text else ""))

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self._failed:
                return
            self._failed = True
            self._sent_chunk = None
        self._on_failure(reason)


def make(node: Any, config: OmniConfig, loop: Any, on_failure: Callable[[str], None]) -> CommandInterface:
    """The interface `config.robot.command_interface` names, for the policy node and its PolicyLoop."""
    if config.robot.command_interface == "follow_joint_trajectory":
        return FollowJointTrajectoryCommands(
            node, config, loop.executor.preview, loop.executor.newest_chunk_id, on_failure
        )
    return TopicCommands(node, config)
