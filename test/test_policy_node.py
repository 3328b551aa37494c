"""The policy node over real DDS: chunks and commands flow; every unsafe input stops commands."""

from __future__ import annotations

import time

import numpy as np
import pytest

from helpers.policy_harness import JOINTS, Harness

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture
def harness():
    h = Harness().start()
    yield h
    h.close()


def test_runs_and_publishes_chunks_and_commands(harness):
    harness.wait_state("running")
    assert harness.wait_for(lambda: len(harness.commands) > 20 and len(harness.chunks) > 2)
    chunk = harness.chunks[-1]
    assert list(chunk.joint_names) == JOINTS
    assert chunk.horizon * chunk.action_dim == len(chunk.actions) and chunk.action_dim == 3
    assert chunk.header.stamp.sec > 0 and chunk.inference_time > 0
    cmd = harness.commands[-1]
    assert list(cmd.joint_names) == JOINTS and len(cmd.points[0].positions) == 3
    assert np.all(np.isfinite(cmd.points[0].positions))


@pytest.mark.parametrize(
    "breakage,detail",
    [
        ({"cameras": False}, "is stale"),
        ({"bad_encoding": True}, "unsupported image encoding '16UC1'"),
        ({"joints": ["joint_1", "joint_2"]}, "lacks joints ['joint_3']"),
        ({"nan": True}, "non-finite positions"),
    ],
)
def test_unsafe_input_stops_commands(harness, breakage, detail):
    harness.wait_state("running")
    for key, value in breakage.items():
        setattr(harness.inputs, key, value)
    status = harness.wait_state("stale-input")
    harness.wait_for(lambda: detail in harness.statuses[-1].detail, 3.0)
    assert detail in harness.statuses[-1].detail, [s.detail for s in harness.statuses[-3:]]
    assert status.state_name == "stale-input"
    harness.commands_during(0.1)  # let in-flight messages land
    assert harness.commands_during(0.6) == 0
    # Recovery: good inputs again -> running again.
    harness.inputs.__init__()
    harness.wait_state("running")
    assert harness.wait_for(lambda: harness.commands_during(0.3) > 0)


def test_estop_latches_until_release_and_resume(harness):
    from std_msgs.msg import Bool

    harness.wait_state("running")
    harness.estop_pub.publish(Bool(data=True))
    harness.wait_state("e-stopped")
    harness.commands_during(0.1)
    assert harness.commands_during(0.5) == 0
    assert not harness.call(harness.resume_client).success  # cannot resume through an engaged e-stop
    harness.estop_pub.publish(Bool(data=False))
    harness.wait_state("paused")
    assert harness.commands_during(0.4) == 0
    assert harness.call(harness.resume_client).success
    harness.wait_state("running")


def test_pause_and_resume_services(harness):
    harness.wait_state("running")
    assert harness.call(harness.pause_client).success
    harness.wait_state("paused")
    harness.commands_during(0.1)
    assert harness.commands_during(0.5) == 0
    assert harness.call(harness.resume_client).success
    harness.wait_state("running")
    assert harness.wait_for(lambda: harness.commands_during(0.3) > 0)


def test_lifecycle_deactivate_holds_and_reactivates(harness):
    harness.wait_state("running")
    harness.node.trigger_deactivate()
    status = harness.wait_state("idle")
    assert "inactive" in status.detail
    harness.commands_during(0.1)
    assert harness.commands_during(0.5) == 0
    harness.node.trigger_activate()
    harness.wait_state("running")


def test_dry_run_publishes_chunks_but_no_commands():
    h = Harness(dry_run=True).start()
    try:
        h.wait_state("running")
        assert h.wait_for(lambda: len(h.chunks) >= 3)
        assert h.commands_during(0.5) == 0 and not h.commands
        assert h.statuses[-1].dry_run
    finally:
        h.close()


def test_inactive_node_publishes_no_chunk_or_command_even_when_asked(harness):
    from omni_ros.nodes.policy_loop import Chunk

    harness.wait_state("running")
    harness.node.trigger_deactivate()
    harness.wait_state("idle")
    time.sleep(0.2)  # let in-flight messages land
    chunks, commands = len(harness.chunks), len(harness.commands)
    # Straight to the publishers, past every gate in the loop: the lifecycle publishers drop both.
    harness.node._publish_command(np.zeros(3), 1.0)
    harness.node._publish_chunk(Chunk(99, np.zeros((4, 3), np.float32), 1.0, 0.02, 0.01))
    harness.wait_state("idle")  # status still flows while inactive
    assert (len(harness.chunks), len(harness.commands)) == (chunks, commands)
    harness.node.trigger_activate()
    harness.wait_state("running")
    harness.node._publish_chunk(Chunk(99, np.zeros((4, 3), np.float32), 1.0, 0.02, 0.01))
    assert harness.wait_for(lambda: any(c.chunk_id == 99 for c in harness.chunks), 3.0)


def test_forward_position_interface_sends_float64_arrays_only():
    """robot.command_interface forward_position: a Float64MultiArray per tick on topics.forward_command, in
    robot.joint_names order, and no JointTrajectory."""
    from std_msgs.msg import Float64MultiArray

    def forward(cfg):
        cfg.robot.command_interface = "forward_position"
        cfg.topics.forward_command = "/forward_position_controller/commands"

    h = Harness(configure=forward)
    arrays: list[Float64MultiArray] = []
    h.peer.create_subscription(Float64MultiArray, "/forward_position_controller/commands", arrays.append, 100)
    h.start()
    try:
        h.wait_state("running")
        assert h.wait_for(lambda: len(arrays) > 20)
        assert all(len(a.data) == len(JOINTS) and np.all(np.isfinite(a.data)) for a in arrays)
        assert not h.commands  # nothing on control.command_topic
    finally:
        h.close()


def test_without_a_prompt_the_node_subscribes_again_while_the_topic_has_a_publisher(monkeypatch):
    """A late-joining reader can miss a latched prompt (Fast DDS), and a node without one never moves: while it
    holds none and the topic has a publisher, it subscribes again (a fresh reader is sent the latched prompt);
    without a publisher there is nothing to miss, and once a prompt came the watch is over."""
    from std_msgs.msg import String

    from omni_ros.nodes import policy_node

    monkeypatch.setattr(policy_node, "PROMPT_RESUBSCRIBE_S", 0.5)
    harness = Harness()
    try:
        harness.peer.destroy_publisher(harness._prompt)
        harness.start(prompt=None)
        assert harness.wait_for(lambda: any("no prompt yet" in s.detail for s in harness.statuses))
        time.sleep(2.5)  # the watch looks every second
        assert harness.node.prompt_resubscribes == 0  # no publisher, nothing missed
        # A publisher that has not published: to the node, the same as one whose latched prompt it missed.
        publisher = harness.peer.create_publisher(String, harness.config.topics.prompt, policy_node.LATCHED)
        assert harness.wait_for(lambda: harness.node.prompt_resubscribes >= 2, 6.0), harness.node.prompt_resubscribes
        assert harness.node.loop is not None and not harness.node.loop.assembler.has_prompt()
        publisher.publish(String(data="reach the red block"))
        harness.wait_state("running")
        settled = harness.node.prompt_resubscribes
        time.sleep(2.5)
        assert harness.node.prompt_resubscribes == settled  # a prompt came: no more subscribing
        assert harness.wait_for(lambda: harness.commands_during(0.3) > 0)
    finally:
        harness.close()
