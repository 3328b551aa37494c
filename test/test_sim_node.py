"""The simulated robot node over real DDS: the sim in one process, this test process listening and commanding."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
import yaml

from omni_ros.config import load_config
from omni_ros.sim.env import SimEnv

SEED = 4


@pytest.fixture
def sim_process(tmp_path, python, root):
    prefix = f"/simtest{os.getpid()}"
    config = {
        "name": "sim-test",
        "sim": {
            "image_width": 160,
            "image_height": 120,
            "auto_reset_s": 0.0,
            "camera_topic": prefix + "/camera/{camera}/image_raw",
            "joint_state_topic": prefix + "/joint_states",
            "prompt_topic": prefix + "/prompt",
            "episode_topic": prefix + "/episode",
            "reset_service": prefix + "/reset",
        },
        "control": {"command_topic": prefix + "/joint_trajectory"},
    }
    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(tmp_path / "sim.log", "w+")  # noqa: SIM115 - read back after the process ends
    proc = subprocess.Popen(
        [python, "-m", "omni_ros.nodes.sim_robot_node", "--config", str(path), "--seed", str(SEED), "--duration", "90"],
        cwd=root,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield load_config(path), proc, log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def test_sim_node_publishes_cameras_and_joint_states_and_follows_commands(sim_process, ros_context):
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import String
    from std_srvs.srv import Trigger
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    config, proc, log = sim_process
    sim = config.sim
    node = rclpy.create_node("sim_listener", context=ros_context)
    executor = SingleThreadedExecutor(context=ros_context)
    executor.add_node(node)
    images: dict[str, list] = {cam: [] for cam in sim.cameras}
    states: list = []
    prompts: list[str] = []
    episodes: list[dict] = []
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    for cam in sim.cameras:
        node.create_subscription(
            Image, sim.camera_topic.format(camera=cam), lambda m, c=cam: images[c].append(m), qos_profile_sensor_data
        )
    node.create_subscription(JointState, sim.joint_state_topic, states.append, qos_profile_sensor_data)
    node.create_subscription(String, sim.prompt_topic, lambda m: prompts.append(m.data), latched)
    node.create_subscription(String, sim.episode_topic, lambda m: episodes.append(json.loads(m.data)), latched)
    commands = node.create_publisher(JointTrajectory, config.control.command_topic, 10)
    reset = node.create_client(Trigger, sim.reset_service)

    def spin_until(condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"sim node exited with {proc.returncode} while waiting for {what}:\n{log.read()}")
            if time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"timed out waiting for {what}; sim log:\n{log.read()}")
            executor.spin_once(timeout_sec=0.05)

    spin_until(lambda: all(len(v) >= 5 for v in images.values()) and len(states) >= 5, 60, "images and joint states")
    spin_until(lambda: prompts and episodes, 10, "the latched prompt and episode")

    # The same seed rendered here: the node publishes exactly what the simulator shows.
    local = SimEnv(sim)
    obs = local.reset(SEED)
    assert prompts[-1] == obs["prompt"] and episodes[-1]["seed"] == SEED and episodes[-1]["success"] is False
    now = node.get_clock().now().nanoseconds * 1e-9
    for cam, msgs in images.items():
        msg = msgs[-1]
        assert msg.encoding == "rgb8" and (msg.height, msg.width) == (120, 160) and msg.step == 160 * 3
        assert msg.header.frame_id == f"{cam}_camera"
        frame = np.frombuffer(msg.data, np.uint8).reshape(msg.height, msg.width, 3)
        np.testing.assert_array_equal(frame, obs["images"][cam])
        stamps = [m.header.stamp.sec + m.header.stamp.nanosec * 1e-9 for m in msgs]
        assert all(b > a for a, b in itertools.pairwise(stamps))
        assert abs(now - stamps[-1]) < 5.0  # real (wall-clock) stamps, not zero or sim time
    state = states[-1]
    assert list(state.name) == ["joint_1", "joint_2", "joint_3"]
    np.testing.assert_allclose(state.position, obs["state"], atol=1e-6)
    assert len(state.velocity) == 3

    # Bad commands are refused (the arm stays put); a good one, joints in any order, is followed.
    start = np.array(state.position)
    target = start + np.array([0.4, -0.3, 0.2])

    def command(names, positions) -> None:
        msg = JointTrajectory()
        msg.joint_names = names
        msg.points = [JointTrajectoryPoint(positions=[float(p) for p in positions])]
        commands.publish(msg)

    spin_until(lambda: commands.get_subscription_count() > 0, 30, "the sim to subscribe to commands")
    command(["joint_1", "joint_2", "joint_3"], [float("nan"), 0.0, 0.0])
    command(["joint_1", "joint_2"], target[:2])
    seen = len(states)
    spin_until(lambda: len(states) >= seen + 25, 10, "joint states after bad commands")
    np.testing.assert_allclose(states[-1].position, start, atol=1e-6)
    command(["joint_3", "joint_1", "joint_2", "gripper"], [target[2], target[0], target[1], 0.7])

    def arrived() -> bool:
        return np.abs(np.array(states[-1].position) - target).max() < 0.01

    spin_until(arrived, 15, f"the arm to reach {target.tolist()}")
    assert np.abs(np.array(states[-1].velocity)).max() < 0.5

    # The reset service starts the next seed: new prompt, new start pose.
    spin_until(lambda: reset.service_is_ready(), 30, "the reset service")
    future = reset.call_async(Trigger.Request())
    spin_until(future.done, 15, "the reset response")
    response = future.result()
    assert response.success and json.loads(response.message)["seed"] == SEED + 1
    local.reset(SEED + 1)
    spin_until(lambda: episodes[-1]["seed"] == SEED + 1, 10, "the new episode")
    assert prompts[-1] == local.task.prompt
    spin_until(lambda: np.abs(np.array(states[-1].position) - local.arm.q).max() < 1e-6, 10, "the new start pose")

    node.destroy_node()
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=15)
    log.seek(0)
    text = log.read()
    assert code == 0, text[-3000:]
    assert "rejected joint command: non-finite" in text and "missing joints ['joint_3']" in text
