"""The one spin loop of every `python -m omni_ros.nodes.X`: a shutdown that lands under a publishing callback
is a clean stop, while a callback's own error still surfaces."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["events", "single"])
def rclpy_started(request, monkeypatch):
    """rclpy started, and the spin loop on each executor `$OMNI_ROS_EXECUTOR` can name."""
    import rclpy

    monkeypatch.setenv("OMNI_ROS_EXECUTOR", request.param)

    rclpy.init()
    yield rclpy
    rclpy.try_shutdown()


def test_a_shutdown_under_a_publishing_callback_is_a_clean_stop(rclpy_started):
    from std_msgs.msg import String

    from omni_ros.ros_env import spin_until_shutdown

    node = rclpy_started.create_node("shutdown_race")
    publisher = node.create_publisher(String, "race", 1)
    calls = []

    def tick() -> None:
        calls.append(1)
        rclpy_started.shutdown()  # what SIGINT does, between two lines of a callback
        publisher.publish(String(data="late"))  # RCLError: the publisher's context is invalid

    node.create_timer(0.01, tick)
    spin_until_shutdown(node, duration=10.0)
    assert calls == [1] and not rclpy_started.ok()


def test_a_callback_error_while_running_still_fails(rclpy_started):
    from omni_ros.ros_env import spin_until_shutdown

    node = rclpy_started.create_node("failing_callback")

    def tick() -> None:
        raise RuntimeError("a real bug")

    node.create_timer(0.01, tick)
    with pytest.raises(RuntimeError, match="a real bug"):
        spin_until_shutdown(node, duration=10.0)


def test_the_executor_is_the_events_one_unless_the_environment_names_the_single_one(request, monkeypatch):
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from omni_ros.ros_env import make_executor

    rclpy.init()
    request.addfinalizer(rclpy.try_shutdown)
    monkeypatch.delenv("OMNI_ROS_EXECUTOR", raising=False)
    assert type(make_executor()).__name__ == "EventsExecutor"  # rclpy's C++ one (rclpy.experimental)
    monkeypatch.setenv("OMNI_ROS_EXECUTOR", "single")
    assert isinstance(make_executor(), SingleThreadedExecutor)
    monkeypatch.setenv("OMNI_ROS_EXECUTOR", "multi")
    with pytest.raises(ValueError, match=r"OMNI_ROS_EXECUTOR must be one of events, single, got 'multi'"):
        make_executor()


@pytest.mark.parametrize(
    "command",
    [
        ["node", "policy", "--config", "config/sim.yaml", "--sim"],
        ["up", "--sim", "--duration", "5"],
    ],
    ids=["node", "up"],
)
def test_an_unknown_executor_is_one_line_before_any_policy_loads(command):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "OMNI_ROS_EXECUTOR": "multi"}
    done = subprocess.run(
        [sys.executable, "-m", "omni_ros.cli", *command], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "$OMNI_ROS_EXECUTOR must be one of events, single, got 'multi'" in done.stderr
    assert "Traceback" not in done.stderr and "configured" not in done.stderr + done.stdout
