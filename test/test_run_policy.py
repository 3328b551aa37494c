"""The RunPolicy action over DDS, one OS process per node: the planar sim and the policy node (tiny preset) run
as processes, the action client and a command listener live here.

One stack serves every case in order (starting two torch processes per case would dominate the run): a goal
while the node is inactive waits and then runs, success through the sim's success topic, time-out, cancel (no
command stamped after the cancel's acknowledgement), preemption, e-stop during a goal, and the feedback.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import rclpy
from lifecycle_msgs.msg import State
from lifecycle_msgs.srv import ChangeState, GetState
from rclpy.action import ActionClient
from rclpy.executors import SingleThreadedExecutor
from std_msgs.msg import Bool
from trajectory_msgs.msg import JointTrajectory

from omni_ros.action import RunPolicy

CONFIG = """
name: run_policy_test
policy:
  preset: tiny
  num_threads: 1
robot:
  joint_names: [joint_1, joint_2, joint_3]
  dry_run: false
status:
  rate_hz: 5.0
sim:
  camera_rate_hz: 15.0
  # The sim must not drive the policy's prompt (the goals do), and it succeeds on its own: every tip position is
  # within the success radius, so an episode succeeds after success_hold_s and the next starts auto_reset_s later.
  prompt_topic: /sim/prompt
  success_radius: 10.0
  success_hold_s: 0.2
  auto_reset_s: 0.5
"""
# Generous: two torch processes share two busy cores.
START_S = 120.0
STEP_S = 60.0
# An unanswered lifecycle request is checked (and sent again) after this long: configure takes seconds.
REPLY_S = 30.0


def _logs(procs) -> str:
    """The processes' output so far (they write to files: a pipe nobody reads would fill and block them)."""
    return "\n".join(f"--- {' '.join(p.args[2:4])}:\n{Path(p.log).read_text()[-4000:]}" for p in procs)


class Client:
    def __init__(self, context) -> None:
        self.node = rclpy.create_node("run_policy_client", context=context)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.action = ActionClient(self.node, RunPolicy, "/omni_ros/run_policy")
        self.commands: list[tuple[float, JointTrajectory]] = []
        self.node.create_subscription(JointTrajectory, "/arm_controller/joint_trajectory", self._command, 100)
        self.estop = self.node.create_publisher(Bool, "/omni_ros/estop", 10)
        self.change_state = self.node.create_client(ChangeState, "/omni_ros_policy/change_state")
        self.get_state = self.node.create_client(GetState, "/omni_ros_policy/get_state")
        self.feedback: list[RunPolicy.Feedback] = []

    def _command(self, msg: JointTrajectory) -> None:
        self.commands.append((time.time(), msg))

    def spin_until(self, done: Callable[[], bool], timeout: float, procs, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{_logs(procs)}"
            self.executor.spin_once(timeout_sec=0.05)
            for p in procs:
                assert p.poll() is None, _logs(procs)

    def send(self, procs, prompt: str, max_duration_s: float = 0.0, success_topic: str = ""):
        goal = RunPolicy.Goal(prompt=prompt, max_duration_s=max_duration_s, success_topic=success_topic)
        future = self.action.send_goal_async(goal, feedback_callback=lambda m: self.feedback.append(m.feedback))
        self.spin_until(future.done, STEP_S, procs, "goal acceptance")
        handle = future.result()
        assert handle.accepted
        return handle

    def result(self, procs, handle):
        future = handle.get_result_async()
        self.spin_until(future.done, STEP_S, procs, "the result")
        return future.result()

    def transition(self, procs, transition_id: int, target: int) -> None:
        """Change the node's lifecycle state to `target`. A service reply can be lost while DDS is still
        matching the reply's reader (the request arrived, the node changed state, the answer never came), so an
        unanswered request is followed by asking the node's state, and sent again only if it did not change."""
        self.spin_until(lambda: self.change_state.service_is_ready(), START_S, procs, "the lifecycle service")
        deadline = time.monotonic() + START_S
        while True:
            request = ChangeState.Request()
            request.transition.id = transition_id
            future = self.change_state.call_async(request)
            try:
                self.spin_until(future.done, REPLY_S, procs, "the transition")
                assert future.result().success
                return
            except AssertionError:
                if future.done() or time.monotonic() > deadline:
                    raise
            if self.state(procs) == target:
                return

    def state(self, procs) -> int:
        self.spin_until(lambda: self.get_state.service_is_ready(), STEP_S, procs, "the state service")
        future = self.get_state.call_async(GetState.Request())
        self.spin_until(future.done, STEP_S, procs, "the state")
        return future.result().current_state.id

    def stamps_after(self, t: float) -> list[float]:
        return [s for _, m in self.commands if (s := m.header.stamp.sec + m.header.stamp.nanosec * 1e-9) > t]


@pytest.fixture
def stack(tmp_path, root):
    config = tmp_path / "run_policy.yaml"
    config.write_text(CONFIG)
    commands = [
        [sys.executable, "-m", "omni_ros.nodes.sim_robot_node", "--config", str(config)],
        # Unconfigured: the test drives the lifecycle, to send a goal while the node is inactive.
        [sys.executable, "-m", "omni_ros.nodes.policy_node", "--config", str(config), "--no-activate"],
    ]
    procs = []
    for i, command in enumerate(commands):
        log = tmp_path / f"process_{i}.log"
        with log.open("w") as out:
            procs.append(subprocess.Popen(command, cwd=root, stdout=out, stderr=subprocess.STDOUT, text=True))
        procs[-1].log = log
    yield procs
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def test_run_policy_goals(stack, ros_context):
    from lifecycle_msgs.msg import Transition

    c = Client(ros_context)
    c.transition(stack, Transition.TRANSITION_CONFIGURE, State.PRIMARY_STATE_INACTIVE)
    c.spin_until(lambda: c.action.server_is_ready(), START_S, stack, "the action server")

    # 1. Inactive: accepted, waits saying why, no commands; activation lets it run.
    c.feedback.clear()
    handle = c.send(stack, "pick up the red block")
    c.spin_until(lambda: len(c.feedback) >= 2, STEP_S, stack, "feedback while inactive")
    assert all(f.state == "waiting" for f in c.feedback)
    assert "activated" in c.feedback[-1].waiting_for
    assert not c.commands
    c.transition(stack, Transition.TRANSITION_ACTIVATE, State.PRIMARY_STATE_ACTIVE)
    c.spin_until(lambda: len(c.commands) >= 20, START_S, stack, "commands after activation")
    c.spin_until(lambda: c.feedback[-1].state == "executing", STEP_S, stack, "executing feedback")

    # Feedback: counts grow from the goal's start, an inference took time, elapsed grows.
    c.spin_until(lambda: c.feedback[-1].commands >= 20, STEP_S, stack, "counted commands")
    last = c.feedback[-1]
    assert last.chunks >= 1 and last.last_inference_ms > 0 and last.waiting_for == ""
    elapsed = [f.elapsed_s for f in c.feedback]
    assert elapsed == sorted(elapsed) and elapsed[-1] > elapsed[0]

    # 2. Cancel: acknowledged, then nothing is commanded; the result says canceled.
    cancel = handle.cancel_goal_async()
    c.spin_until(cancel.done, STEP_S, stack, "the cancel response")
    acknowledged = time.time()
    assert len(cancel.result().goals_canceling) == 1
    result = c.result(stack, handle)
    assert result.result.outcome == "canceled" and result.result.reason == "cancel requested"
    assert result.result.commands >= 20
    c.spin_until(lambda: time.time() > acknowledged + 1.0, STEP_S, stack, "a quiet second")
    # Stamped by the node's clock when published: none after the acknowledgement arrived here (same host clock).
    assert c.stamps_after(acknowledged) == []

    # 3. Success: the sim's success topic ends the goal.
    handle = c.send(stack, "touch any block", success_topic="/sim/success")
    result = c.result(stack, handle)
    assert result.result.outcome == "succeeded", result.result.reason
    assert result.status == 4  # action_msgs/GoalStatus.STATUS_SUCCEEDED

    # 4. Time-out: no success topic, 1.5 s.
    handle = c.send(stack, "move", max_duration_s=1.5)
    result = c.result(stack, handle)
    assert result.result.outcome == "timed_out"
    # The server checks at 20 Hz: within a check period (and scheduling slack on a busy machine) of 1.5 s.
    assert 1.5 <= result.result.duration_s < 2.5

    # 5. Preemption: a second goal ends the first canceled; the second runs.
    first = c.send(stack, "first task")
    c.commands.clear()
    c.spin_until(lambda: len(c.commands) >= 5, STEP_S, stack, "commands of the first goal")
    second = c.send(stack, "second task")
    result = c.result(stack, first)
    assert result.result.outcome == "canceled" and "preempted" in result.result.reason
    c.commands.clear()
    c.spin_until(lambda: len(c.commands) >= 5, STEP_S, stack, "commands of the second goal")

    # 6. E-stop during a goal: aborted at once, and the robot holds.
    c.estop.publish(Bool(data=True))
    result = c.result(stack, second)
    stopped = time.time()
    assert result.result.outcome == "aborted" and result.result.reason == "e-stop engaged"
    c.spin_until(lambda: time.time() > stopped + 1.0, STEP_S, stack, "a quiet second")
    assert c.stamps_after(stopped) == []
    # A goal while the e-stop is engaged is refused at once (accepted, then aborted, saying why).
    handle = c.send(stack, "while stopped")
    result = c.result(stack, handle)
    assert result.result.outcome == "aborted" and "e-stop" in result.result.reason
    c.node.destroy_node()
