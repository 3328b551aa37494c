"""The OpenPI bridge hosted as a ROS node: alone in its own process, and sharing the policy node's policy."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import rclpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from omni_ros.config import load_config

CONFIG = """
name: bridge-node
policy: {preset: tiny, num_threads: 1}
robot: {joint_names: [joint_1, joint_2, joint_3]}
serve: {port: PORT, keymap: omni_sim}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sim_observation() -> dict:
    rng = np.random.default_rng(0)
    return {
        "observation/base_image": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8),
        "observation/joint_position": np.zeros(3),
        "prompt": "reach the red block",
    }


def test_bridge_node_process_serves_openpi_clients(tmp_path, root):
    port = free_port()
    config = tmp_path / "bridge.yaml"
    config.write_text(CONFIG.replace("PORT", str(port)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_ros.cli", "node", "bridge", "--config", str(config)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as reply:
                    assert reply.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "bridge node never answered /healthz"
                time.sleep(0.2)
        client = WebsocketClientPolicy(host="127.0.0.1", port=port)
        meta = client.get_server_metadata()
        assert meta["camera_names"] == ["base", "wrist"] and meta["state_dim"] == 3
        out = client.infer(sim_observation())
        assert out["actions"].shape == (8, 3) and np.all(np.isfinite(out["actions"]))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert proc.returncode in (0, -15)


def test_bridge_node_shares_the_policy_nodes_policy(tmp_path):
    from omni_ros.nodes.bridge_node import BridgeNode
    from omni_ros.nodes.policy_node import PolicyNode

    config = load_config("config/sim.yaml")
    config.policy.preset = "tiny"
    config.serve.port = free_port()
    context = rclpy.Context()
    rclpy.init(context=context)
    policy_node = PolicyNode(config, context=context)
    policy_node.trigger_configure()
    bridge = BridgeNode(config, policy=policy_node.policy, context=context)
    try:
        assert bridge.policy is policy_node.policy
        client = WebsocketClientPolicy(host="127.0.0.1", port=config.serve.port)
        expected = policy_node.policy.infer(
            {
                "images": {
                    "base": sim_observation()["observation/base_image"],
                    "wrist": sim_observation()["observation/wrist_image"],
                },
                "state": np.zeros(3),
                "prompt": "reach the red block",
            }
        )["actions"]
        assert np.allclose(client.infer(sim_observation())["actions"], expected, atol=1e-6)
    finally:
        bridge.destroy_node()
        policy_node.shutdown_now()
        policy_node.destroy_node()
        context.try_shutdown()
