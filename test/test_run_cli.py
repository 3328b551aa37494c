"""`omni-ros run PROMPT` (its own process) against a stand-in RunPolicy server here: the goal's fields arrive,
feedback is printed, the outcome decides the exit status (0 only for succeeded), no server is exit status 2."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest
import rclpy
from rclpy.action import ActionServer, CancelResponse
from rclpy.executors import MultiThreadedExecutor

from omni_ros.action import RunPolicy


class Server:
    """Answers each goal with two feedbacks, then `outcome` (succeeded -> succeed, else abort); `until_canceled`
    runs until a cancel arrives."""

    def __init__(self, context, outcome: str) -> None:
        self.outcome, self.goals = outcome, []
        self.node = rclpy.create_node("run_cli_server", context=context)
        self.server = ActionServer(
            self.node,
            RunPolicy,
            "/run_cli/run_policy",
            self._execute,
            cancel_callback=lambda _handle: CancelResponse.ACCEPT,  # rclpy's default refuses every cancel
        )
        self.executor = MultiThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _execute(self, handle):
        self.goals.append(handle.request)
        if self.outcome == "until_canceled":  # like the node: runs until a cancel, then ends canceled
            deadline = time.monotonic() + 60  # bounded: a lost cancel fails the test instead of hanging it
            while not handle.is_cancel_requested and time.monotonic() < deadline:
                time.sleep(0.02)
            if not handle.is_cancel_requested:
                handle.abort()
                return RunPolicy.Result(outcome="aborted", reason="no cancel arrived")
            handle.canceled()
            return RunPolicy.Result(outcome="canceled", reason="cancel requested", duration_s=1.0)
        for i in range(2):
            handle.publish_feedback(RunPolicy.Feedback(elapsed_s=0.1 * i, chunks=i, commands=10 * i, state="executing"))
            time.sleep(0.2)
        if self.outcome == "succeeded":
            handle.succeed()
        else:
            handle.abort()
        return RunPolicy.Result(outcome=self.outcome, reason="stand-in", duration_s=0.4, chunks=1, commands=10)

    def stop(self) -> None:
        self.executor.shutdown()
        self.thread.join(timeout=5)
        self.server.destroy()
        self.node.destroy_node()


def run_cli(root, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "omni_ros.cli", "run", *args, "--action", "/run_cli/run_policy"]
    return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("outcome,status", [("succeeded", 0), ("aborted", 1)])
def test_run_sends_the_goal_and_exits_by_outcome(root, ros_context, outcome, status):
    server = Server(ros_context, outcome)
    try:
        proc = run_cli(root, "pick up the cube", "--max-duration", "30", "--success-topic", "/done", "--wait", "30")
    finally:
        server.stop()
    assert proc.returncode == status, proc.stdout + proc.stderr
    goal = server.goals[0]
    assert (goal.prompt, goal.max_duration_s, goal.success_topic) == ("pick up the cube", 30.0, "/done")
    assert "executing: chunks 1, commands 10" in proc.stdout
    assert f"outcome: {outcome} (stand-in); 0.4 s, chunks 1, commands 10" in proc.stdout


def test_run_without_a_server_is_status_2(root):
    proc = run_cli(root, "anything", "--wait", "1")
    assert proc.returncode == 2
    assert "no policy node serves /run_cli/run_policy" in proc.stderr


def test_ctrl_c_cancels_the_goal(root, ros_context):
    server = Server(ros_context, "until_canceled")
    command = [sys.executable, "-m", "omni_ros.cli", "run", "wave", "--action", "/run_cli/run_policy", "--wait", "30"]
    proc = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not server.goals:
            assert time.monotonic() < deadline and proc.poll() is None, "the goal never arrived"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    assert proc.returncode == 1, out
    assert "cancelling (the robot holds)" in out
    assert "outcome: canceled (cancel requested)" in out
