"""A `.pte` served end to end: policy node over real DDS (separate processes) and the OpenPI bridge (real client)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import rclpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from rclpy.executors import SingleThreadedExecutor
from trajectory_msgs.msg import JointTrajectory

from helpers.bridge_util import start_serve, stop_serve
from helpers.pte_cache import exported_tiny
from omni_ros.msg import ActionChunk, PolicyStatus

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
JOINTS = ["joint_1", "joint_2", "joint_3"]


@pytest.fixture(scope="session")
def sim_pte(tmp_path_factory):
    """tiny for the simulated arm: cameras base + wrist, 3 joints."""
    return exported_tiny(tmp_path_factory.getbasetemp(), "fp32")


def _config(tmp_path, pte) -> str:
    config = tmp_path / "pte.yaml"
    config.write_text(
        f"""
name: pte-e2e
policy: {{backend: executorch, pte: {pte}, num_threads: 1}}
robot: {{joint_names: {JOINTS}, dry_run: false}}
status: {{rate_hz: 5.0}}
sim: {{camera_rate_hz: 15.0}}
serve: {{keymap: omni_sim}}
"""
    )
    return str(config)


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def test_policy_node_serves_a_pte_over_dds(sim_pte, tmp_path, root, ros_context):
    config = _config(tmp_path, sim_pte)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "omni_ros.cli", "node", name, "--config", config],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("sim", "policy")
    ]
    node = rclpy.create_node("pte_listener", context=ros_context)
    chunks: list[ActionChunk] = []
    commands: list[JointTrajectory] = []
    statuses: list[PolicyStatus] = []
    node.create_subscription(ActionChunk, "/omni_ros/action_chunk", chunks.append, 50)
    node.create_subscription(JointTrajectory, "/arm_controller/joint_trajectory", commands.append, 100)
    node.create_subscription(PolicyStatus, "/omni_ros/status", statuses.append, 10)
    executor = SingleThreadedExecutor(context=ros_context)
    executor.add_node(node)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (len(chunks) < 3 or len(commands) < 20):
            executor.spin_once(timeout_sec=0.1)
            for p in procs:
                assert p.poll() is None, p.stdout.read()
        assert len(chunks) >= 3 and len(commands) >= 20, (len(chunks), [s.detail for s in statuses[-3:]])
    finally:
        executor.shutdown()
        node.destroy_node()
        _stop(procs)
    for msg in chunks:
        assert msg.backend == "executorch-xnnpack"
        assert (msg.horizon, msg.action_dim) == (8, 3) and list(msg.joint_names) == JOINTS
        assert np.all(np.isfinite(msg.actions)) and msg.inference_time > 0
    assert any(s.backend == "executorch-xnnpack" and s.state_name == "running" for s in statuses)


def test_openpi_bridge_serves_a_pte(sim_pte, tmp_path, root):
    from omni_ros.backends.executorch_runner import load_pte
    from omni_ros.policy.loading import from_preset
    from omni_ros.serving.keymap import load_keymap

    proc, url, metadata = start_serve(root, "--config", _config(tmp_path, sim_pte))
    try:
        assert metadata["backend"] == "executorch-xnnpack" and metadata["action_dim"] == 3
        client = WebsocketClientPolicy(url)
        assert client.get_server_metadata()["camera_names"] == ["base", "wrist"]
        rng = np.random.default_rng(0)
        obs = {
            "observation/base_image": rng.integers(0, 256, (96, 128, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
            "observation/joint_position": rng.normal(size=3),
            "prompt": "push the block left",
        }
        results = [client.infer(obs) for _ in range(2)]
    finally:
        stop_serve(proc)
    raw = load_keymap("omni_sim").to_raw(obs)
    local = load_pte(sim_pte, num_threads=1).infer(raw)["actions"]
    eager = from_preset("tiny", state_dim=3, action_dim=3).infer(raw)["actions"]
    for result in results:
        assert result["actions"].shape == (8, 3)
        np.testing.assert_array_equal(result["actions"], local)  # what the server ran is the .pte
        np.testing.assert_allclose(result["actions"], eager, rtol=0, atol=1e-4)  # and it is the model
