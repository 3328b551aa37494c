"""The policy node's outgoing messages from plain values (no node, no DDS), and the status it reports."""

from __future__ import annotations

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus

from omni_ros.control.executor import ExecState
from omni_ros.msg import PolicyStatus
from omni_ros.nodes import messages

JOINTS = ["joint_1", "joint_2", "joint_3"]


def test_action_chunk_is_row_major_and_stamped_with_its_observation():
    actions = np.arange(12, dtype=np.float32).reshape(4, 3) / 8
    msg = messages.action_chunk(7, JOINTS, actions, stamp=12.25, dt=0.02, inference_s=0.031, backend="torch-cpu")
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (12, 250_000_000)
    assert msg.chunk_id == 7 and list(msg.joint_names) == JOINTS
    assert (msg.horizon, msg.action_dim) == (4, 3)
    assert np.array_equal(np.asarray(msg.actions).reshape(4, 3), actions)
    assert msg.dt == pytest.approx(0.02) and msg.inference_time == pytest.approx(0.031)
    assert msg.backend == "torch-cpu"


def test_joint_command_reaches_the_target_within_one_period():
    msg = messages.joint_command(JOINTS, np.array([0.1, -0.2, 0.3], np.float32), stamp=3.5, period_s=0.02)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (3, 500_000_000)
    assert list(msg.joint_names) == JOINTS and len(msg.points) == 1
    point = msg.points[0]
    assert list(point.positions) == pytest.approx([0.1, -0.2, 0.3])
    assert (point.time_from_start.sec, point.time_from_start.nanosec) == (0, 20_000_000)
    forward = messages.forward_command(np.array([0.1, -0.2, 0.3]))
    assert list(forward.data) == pytest.approx([0.1, -0.2, 0.3])


@pytest.mark.parametrize(
    "state,kwargs,code,detail",
    [
        (ExecState.RUNNING, {}, PolicyStatus.RUNNING, "executing"),
        (ExecState.RUNNING, {"dry_run": True}, PolicyStatus.RUNNING, "dry run: chunks only"),
        (ExecState.IDLE, {}, PolicyStatus.IDLE, "waiting for the first chunk"),
        (ExecState.PAUSED, {}, PolicyStatus.PAUSED, "paused"),
        (ExecState.PAUSED, {"active": False}, PolicyStatus.IDLE, "inactive (lifecycle)"),
        (ExecState.ESTOPPED, {}, PolicyStatus.ESTOPPED, "e-stopped"),
        (ExecState.STALE_INPUT, {"exec_reason": "no prompt yet"}, PolicyStatus.STALE_INPUT, "no prompt yet"),
        (ExecState.STALE_INPUT, {}, PolicyStatus.STALE_INPUT, "stale input"),
        (
            ExecState.RUNNING,
            {"consecutive_errors": messages.ERROR_AFTER, "last_error": "RuntimeError: boom"},
            PolicyStatus.ERROR,
            "inference failing: RuntimeError: boom",
        ),
        (ExecState.RUNNING, {"consecutive_errors": messages.ERROR_AFTER - 1}, PolicyStatus.RUNNING, "executing"),
        (
            ExecState.RUNNING,
            {"exec_reason": "chunk exhausted, holding its last action", "keeping_up": "the plan ran out 2 time(s)"},
            PolicyStatus.RUNNING,
            "executing; chunk exhausted, holding its last action (the plan ran out 2 time(s))",
        ),
        # What the robot did before does not stay in the detail once the plan has actions again.
        (ExecState.RUNNING, {"keeping_up": "the plan ran out 2 time(s)"}, PolicyStatus.RUNNING, "executing"),
    ],
)
def test_policy_state(state, kwargs, code, detail):
    args = {"active": True, "consecutive_errors": 0, "last_error": "", "exec_reason": "", "dry_run": False}
    assert messages.policy_state(state, **{**args, **kwargs}) == (code, detail)


def _status(code: int, detail: str = "why") -> PolicyStatus:
    return messages.policy_status(
        20.5,
        code,
        detail,
        backend="executorch-xnnpack",
        model="pi0-tiny",
        last_inference_s=0.04567,
        control_rate=50.0,
        achieved_rate=49.5,
        dry_run=True,
        counts={"chunks": 3, "commands": 140, "dropped_frames": 2, "errors": 1},
        precision="int8: exported program (int8-dynamic)",
    )


def test_policy_status_carries_every_field():
    msg = _status(PolicyStatus.STALE_INPUT, "camera 'base' is stale")
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (20, 500_000_000)
    assert (msg.state, msg.state_name, msg.detail) == (
        PolicyStatus.STALE_INPUT,
        "stale-input",
        "camera 'base' is stale",
    )
    assert (msg.backend, msg.model, msg.dry_run) == ("executorch-xnnpack", "pi0-tiny", True)
    assert msg.precision == "int8: exported program (int8-dynamic)"
    assert msg.last_inference_time == pytest.approx(0.04567)
    assert (msg.control_rate, msg.achieved_rate) == (50.0, 49.5)
    assert (msg.chunks, msg.commands, msg.dropped_frames, msg.errors) == (3, 140, 2, 1)


@pytest.mark.parametrize(
    "code,level",
    [
        (PolicyStatus.RUNNING, DiagnosticStatus.OK),
        (PolicyStatus.IDLE, DiagnosticStatus.OK),
        (PolicyStatus.PAUSED, DiagnosticStatus.OK),
        (PolicyStatus.STALE_INPUT, DiagnosticStatus.WARN),
        (PolicyStatus.ESTOPPED, DiagnosticStatus.WARN),
        (PolicyStatus.ERROR, DiagnosticStatus.ERROR),
    ],
)
def test_diagnostics_mirror_the_status(code, level):
    status = _status(code)
    array = messages.diagnostics(status, "omni_ros_policy: policy")
    assert array.header.stamp == status.header.stamp and len(array.status) == 1
    diag = array.status[0]
    assert diag.level == level and diag.name == "omni_ros_policy: policy"
    assert diag.message == "why" and diag.hardware_id == "executorch-xnnpack"
    values = {kv.key: kv.value for kv in diag.values}
    assert values == {
        "state": messages.STATUS_NAMES[code],
        "model": "pi0-tiny",
        "precision": "int8: exported program (int8-dynamic)",
        "last_inference_s": "0.0457",
        "achieved_rate_hz": "49.5",
        "dry_run": "True",
        "chunks": "3",
        "commands": "140",
        "dropped_frames": "2",
        "errors": "1",
    }


def test_diagnostics_carry_the_executors_motion_counts():
    motion = {"plan_ran_out": 3, "held_s": 2.5, "resumed_chunks": 2}
    values = {
        kv.key: kv.value for kv in messages.diagnostics(_status(PolicyStatus.RUNNING), "p", motion).status[0].values
    }
    assert values["plan_ran_out"] == "3" and values["held_s"] == "2.5" and values["resumed_chunks"] == "2"
    assert values["state"] == "running"  # the status's values are kept
