"""The policy node's outgoing messages, built from plain values (pure functions: no node, no DDS).

action_chunk(...)     -> omni_ros/ActionChunk        (a whole chunk, stamped with its observation)
joint_command(...)    -> trajectory_msgs/JointTrajectory (one point: the position target now)
forward_command(...)  -> std_msgs/Float64MultiArray  (the same target, for forward_command_controller)
policy_status(...)    -> omni_ros/PolicyStatus
diagnostics(...)      -> diagnostic_msgs/DiagnosticArray (the status, for /diagnostics tools)
policy_state(...)     -> the status code and detail for the executor's state
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from omni_ros.control.executor import PLAN_EXHAUSTED, ExecState
from omni_ros.msg import ActionChunk, PolicyStatus
from omni_ros.ros_convert import sec_to_stamp

STATUS_CODES = {
    ExecState.IDLE: PolicyStatus.IDLE,
    ExecState.RUNNING: PolicyStatus.RUNNING,
    ExecState.STALE_INPUT: PolicyStatus.STALE_INPUT,
    ExecState.PAUSED: PolicyStatus.PAUSED,
    ExecState.ESTOPPED: PolicyStatus.ESTOPPED,
}
STATUS_NAMES = {
    PolicyStatus.IDLE: "idle",
    PolicyStatus.RUNNING: "running",
    PolicyStatus.STALE_INPUT: "stale-input",
    PolicyStatus.PAUSED: "paused",
    PolicyStatus.ESTOPPED: "e-stopped",
    PolicyStatus.ERROR: "error",
}
DIAGNOSTIC_LEVELS = {
    PolicyStatus.RUNNING: DiagnosticStatus.OK,
    PolicyStatus.IDLE: DiagnosticStatus.OK,
    PolicyStatus.PAUSED: DiagnosticStatus.OK,
    PolicyStatus.STALE_INPUT: DiagnosticStatus.WARN,
    PolicyStatus.ESTOPPED: DiagnosticStatus.WARN,
    PolicyStatus.ERROR: DiagnosticStatus.ERROR,
}
# The counters a PolicyStatus carries (fields of the same names).
COUNTERS = ("chunks", "commands", "dropped_frames", "errors")
# Consecutive inference failures after which the node reports ERROR (it keeps retrying).
ERROR_AFTER = 3


def action_chunk(
    chunk_id: int,
    joint_names: Sequence[str],
    actions: np.ndarray,
    stamp: float,
    dt: float,
    inference_s: float,
    backend: str,
) -> ActionChunk:
    """A (horizon, action_dim) chunk, row-major, stamped with the observation it answers."""
    msg = ActionChunk()
    sec_to_stamp(stamp, msg.header.stamp)
    msg.chunk_id = int(chunk_id)
    msg.joint_names = list(joint_names)
    msg.horizon, msg.action_dim = int(actions.shape[0]), int(actions.shape[1])
    msg.dt = float(dt)
    msg.actions = np.asarray(actions, dtype=np.float64).ravel().tolist()
    msg.inference_time = float(inference_s)
    msg.backend = backend
    return msg


def joint_command(joint_names: Sequence[str], positions: np.ndarray, stamp: float, period_s: float) -> JointTrajectory:
    """One trajectory point: reach `positions` within one control period."""
    msg = JointTrajectory()
    sec_to_stamp(stamp, msg.header.stamp)
    msg.joint_names = list(joint_names)
    point = JointTrajectoryPoint()
    point.positions = np.asarray(positions, dtype=np.float64).tolist()
    point.time_from_start.sec, point.time_from_start.nanosec = 0, int(period_s * 1e9)
    msg.points = [point]
    return msg


def forward_command(positions: np.ndarray) -> Float64MultiArray:
    return Float64MultiArray(data=np.asarray(positions, dtype=np.float64).tolist())


def policy_state(
    state: ExecState,
    *,
    active: bool,
    consecutive_errors: int,
    last_error: str,
    exec_reason: str,
    dry_run: bool,
    controller_error: str = "",
    keeping_up: str = "",
) -> tuple[int, str]:
    """The PolicyStatus code and detail: a controller failure, repeated inference failures and lifecycle
    inactivity come first. While the running plan has run out, the detail says so, with `keeping_up` (the
    executor's account of why: ActionChunkExecutor.keeping_up)."""
    if controller_error:
        return (
            PolicyStatus.ERROR,
            f"controller failure (holding; ~/resume or a new RunPolicy goal retries): {controller_error}",
        )
    if consecutive_errors >= ERROR_AFTER:
        return PolicyStatus.ERROR, f"inference failing: {last_error}"
    if not active and state is ExecState.PAUSED:
        return PolicyStatus.IDLE, "inactive (lifecycle)"
    if state is ExecState.STALE_INPUT:
        detail = exec_reason or "stale input"
    elif state is ExecState.IDLE:
        detail = "waiting for the first chunk"
    elif state is ExecState.RUNNING:
        detail = "dry run: chunks only" if dry_run else "executing"
        if PLAN_EXHAUSTED in exec_reason:
            detail += f"; {PLAN_EXHAUSTED}" + (f" ({keeping_up})" if keeping_up else "")
    else:
        detail = state.value
    return STATUS_CODES[state], detail


def policy_status(
    stamp: float,
    code: int,
    detail: str,
    *,
    backend: str,
    model: str,
    last_inference_s: float,
    control_rate: float,
    achieved_rate: float,
    dry_run: bool,
    counts: Mapping[str, int],
    precision: str = "",
) -> PolicyStatus:
    msg = PolicyStatus()
    sec_to_stamp(stamp, msg.header.stamp)
    msg.state, msg.state_name, msg.detail = code, STATUS_NAMES[code], detail
    msg.backend, msg.model, msg.precision = backend, model, precision
    msg.last_inference_time = float(last_inference_s)
    msg.control_rate = float(control_rate)
    msg.achieved_rate = float(achieved_rate)
    msg.dry_run = bool(dry_run)
    msg.chunks, msg.commands = int(counts["chunks"]), int(counts["commands"])
    msg.dropped_frames, msg.errors = int(counts["dropped_frames"]), int(counts["errors"])
    return msg


def diagnostics(status: PolicyStatus, name: str, motion: Mapping[str, float] | None = None) -> DiagnosticArray:
    """The status as one DiagnosticStatus named `name` (OK / WARN for stale input and e-stop / ERROR), with the
    executor's `motion` counts (ActionChunkExecutor.motion_counts: how often the plan ran out, seconds held, ...)
    as further values when given."""
    diag = DiagnosticStatus(
        level=DIAGNOSTIC_LEVELS[status.state], name=name, message=status.detail, hardware_id=status.backend
    )
    diag.values = [
        KeyValue(key=k, value=str(v))
        for k, v in (
            ("state", status.state_name),
            ("model", status.model),
            ("precision", status.precision),
            ("last_inference_s", f"{status.last_inference_time:.4f}"),
            ("achieved_rate_hz", f"{status.achieved_rate:.1f}"),
            ("dry_run", status.dry_run),
            ("chunks", status.chunks),
            ("commands", status.commands),
            ("dropped_frames", status.dropped_frames),
            ("errors", status.errors),
            *(motion or {}).items(),
        )
    ]
    array = DiagnosticArray()
    array.header.stamp = status.header.stamp
    array.status = [diag]
    return array
