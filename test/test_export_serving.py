"""Exported policies served end to end: policy node over real DDS (separate processes) and the OpenPI bridge (real
client), for an ExecuTorch `.pte` (XNNPACK) and an ONNX export on Qualcomm's HTP (the emulator of onnxruntime-qnn)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import rclpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from rclpy.executors import SingleThreadedExecutor
from trajectory_msgs.msg import JointTrajectory

from helpers.pte_cache import exported_tiny
from omni_ros.msg import ActionChunk, PolicyStatus

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
# The HTP export is 16a8w: its actions stay within this of eager float32 (test_onnx_qnn.py bounds it the same way).
HTP_16A8W_TOLERANCE = 0.02
JOINTS = ["joint_1", "joint_2", "joint_3"]


# name -> (exported variant, policy section, the backend name it reports, control section)
SERVED = {
    "pte": ("fp32", "{{backend: executorch, pte: {path}, num_threads: 1}}", "executorch-xnnpack", "{}"),
    # The x86 HTP emulator takes about a second per chunk (seconds on a busy machine), longer than tiny's 0.16 s
    # horizon: with latency compensation every action of a chunk would already be in the past when it arrives.
    "qnn": (
        "qnn16",
        "{{backend: onnxruntime, onnx: {path}, providers: [qnn-htp]}}",
        "onnxruntime-qnn-htp-16a8w",
        "{latency_compensation: false}",
    ),
}


@pytest.fixture(scope="session", params=list(SERVED))
def served(request, tmp_path_factory):
    """tiny for the simulated arm (cameras base + wrist, 3 joints): (path, policy section, backend, control)."""
    variant, section, backend, control = SERVED[request.param]
    path = exported_tiny(tmp_path_factory.getbasetemp(), variant)
    return path, section.format(path=path), backend, control


def _config(tmp_path, served) -> str:
    config = tmp_path / "pte.yaml"
    config.write_text(
        f"""
name: pte-e2e
policy: {served[1]}
control: {served[3]}
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


def _children(pid: int, module: str) -> list[int]:
    """Processes whose parent is `pid` and whose command line names `module`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if ppid == pid and module.encode() in cmdline:
            found.append(int(stat.parent.name))
    return found


def test_policy_node_serves_an_export_over_dds(served, tmp_path, root, ros_context):
    config = _config(tmp_path, served)
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
        # The node runs an ExecuTorch program in a child process (policy.program_process auto): its control loop
        # never waits behind the program's hold on the GIL.
        programs = _children(procs[1].pid, "omni_ros.backends.program_process")
        assert len(programs) == (1 if served[2].startswith("executorch") else 0), programs
    finally:
        executor.shutdown()
        node.destroy_node()
        _stop(procs)
    for msg in chunks:
        assert msg.backend == served[2]
        assert (msg.horizon, msg.action_dim) == (8, 3) and list(msg.joint_names) == JOINTS
        assert np.all(np.isfinite(msg.actions)) and msg.inference_time > 0
    assert any(s.backend == served[2] and s.state_name == "running" for s in statuses)


def test_openpi_bridge_serves_an_export(served, tmp_path, root):
    from omni_ros.backends.factory import load_policy
    from omni_ros.config import load_config
    from omni_ros.policy.loading import from_preset
    from omni_ros.serving.keymap import load_keymap

    config = _config(tmp_path, served)
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_ros.cli", "serve", "--port", "0", "--config", config],
        cwd=root,
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("}"):
                break
        text = "".join(lines)
        match = re.search(r"listening on (ws://127\.0\.0\.1:\d+)", text)
        assert match, text + proc.stderr.read()
        metadata = json.loads(text[text.index("{") :])
        assert metadata["backend"] == served[2] and metadata["action_dim"] == 3
        client = WebsocketClientPolicy(match.group(1))
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
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    raw = load_keymap("omni_sim").to_raw(obs)
    local = load_policy(load_config(config).policy).infer(raw)["actions"]
    eager = from_preset("tiny", state_dim=3, action_dim=3).infer(raw)["actions"]
    # The .pte is float32; the HTP export is quantized (its own test bounds how far that takes it).
    tolerance = 1e-4 if served[2].startswith("executorch") else HTP_16A8W_TOLERANCE
    for result in results:
        assert result["actions"].shape == (8, 3)
        np.testing.assert_array_equal(result["actions"], local)  # what the server ran is the exported model
        np.testing.assert_allclose(result["actions"], eager, rtol=0, atol=tolerance)  # and it is the model


def test_an_exported_program_plays_at_the_configured_action_period(tmp_path_factory):
    # The program's sidecar records the period it was exported with; policy.action_dt is the robot's to set, and
    # the metadata every reader takes it from says so.
    from omni_ros.backends.factory import load_policy
    from omni_ros.config import PolicyConfig

    path = exported_tiny(tmp_path_factory.getbasetemp(), "fp32")
    recorded = load_policy(PolicyConfig(backend="executorch", pte=str(path), num_threads=1))
    configured = load_policy(PolicyConfig(backend="executorch", pte=str(path), num_threads=1, action_dt=0.04))
    try:
        assert recorded.metadata.action_dt != pytest.approx(0.04)
        assert configured.metadata.action_dt == pytest.approx(0.04, abs=1e-12)
    finally:
        recorded.close()
        configured.close()
