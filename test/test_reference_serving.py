"""A LeRobot pi0 folder run by every part of the product: the bridge (real openpi-client), the policy node
over DDS, and `omni-ros eval` on a recorded bag. Each gives the actions `omni_ros.policy.load` gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

import omni_ros.policy
from omni_ros.config import CameraTopic
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.server import ServerThread

ARM = Path(__file__).parent / "fixtures" / "reference" / "pi0_arm"  # LeRobot pi0: cameras top, left_wrist; 6 joints
JOINTS = [f"joint_{i}" for i in range(1, 7)]
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("torch_one_thread")]


@pytest.fixture(scope="module")
def arm():
    return omni_ros.policy.load(ARM)


def _obs(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    top, wrist = rng.integers(0, 256, (48, 64, 3), np.uint8), rng.integers(0, 256, (40, 30, 3), np.uint8)
    return {"images": {"top": top, "left_wrist": wrist}, "state": rng.normal(size=6), "prompt": "Pick up the RED cube"}


def test_the_bridge_serves_a_lerobot_checkpoint_to_openpi_client(arm):
    with ServerThread(arm, ServeConfig(port=0)) as server:
        client = WebsocketClientPolicy(server.url)
        metadata = client.get_server_metadata()
        assert metadata["camera_names"] == ["top", "left_wrist"] and metadata["noise_shape"] == [10, 32]
        for seed in range(2):
            reply = client.infer(_obs(seed))
            np.testing.assert_array_equal(reply["actions"], arm.infer(_obs(seed))["actions"])


def test_the_policy_node_runs_a_lerobot_checkpoint_over_dds(arm):
    from helpers.policy_harness import Harness

    def lerobot_arm(cfg) -> None:
        cfg.policy.checkpoint, cfg.policy.preset = str(ARM), "tiny"
        cfg.robot.joint_names = list(JOINTS)
        cfg.topics.cameras = [CameraTopic("top", "/camera/top/image_raw"), CameraTopic("left_wrist", "/camera/lw")]

    harness = Harness(configure=lerobot_arm).start(prompt="Pick up the RED cube")
    try:
        harness.wait_state("running", timeout=30)
        assert harness.wait_for(lambda: len(harness.chunks) >= 2, timeout=30)
        chunk = harness.chunks[-1]
        assert list(chunk.joint_names) == JOINTS and (chunk.horizon, chunk.action_dim) == (10, 6)
        # What the harness publishes, as the node assembled it: black 48 px frames, joints at 0.1 * i.
        frame = np.zeros((48, 48, 3), np.uint8)
        obs = {
            "images": {"top": frame, "left_wrist": frame},
            "state": 0.1 * np.arange(6),
            "prompt": "Pick up the RED cube",
        }
        expected = arm.infer(obs)["actions"]
        np.testing.assert_allclose(np.asarray(chunk.actions).reshape(10, 6), expected, rtol=0, atol=1e-5)
        assert harness.wait_for(lambda: len(harness.commands) > 5, timeout=20)
        assert list(harness.commands[-1].joint_names) == JOINTS
    finally:
        harness.close()


def test_eval_replays_a_bag_through_a_lerobot_checkpoint(tmp_path):
    from omni_ros.eval.evaluate import evaluate
    from omni_ros.eval.schema import validate
    from omni_ros.eval.synthetic import SyntheticSpec, write_synthetic_bag

    spec = SyntheticSpec(
        duration_s=1.0,
        joint_names=list(JOINTS),
        cameras={"top": ("/cam/top", 10.0), "left_wrist": ("/cam/left_wrist", 10.0)},
        offset=[0.1, -0.3, 0.5, 0.0, 0.2, -0.1],
        slope=[0.5, 0.2, -0.1, 0.0, 0.1, 0.0],
        amplitude=[0.0, 0.4, 0.3, 0.1, 0.0, 0.2],
        omega=[0.0, 2.0, 3.0, 1.0, 0.0, 4.0],
    )
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    config = spec.config()
    config.policy.checkpoint = str(ARM)
    evaluation = evaluate([bag], config, out_dir=tmp_path / "out", progress=False)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert validate(metrics) == []
    assert metrics["policy"]["model"] == "pi0_arm" and metrics["policy"]["backend"] == "torch-cpu"
    assert metrics["overall"]["evaluated"] >= 5 and np.isfinite(metrics["overall"]["mae"])
    assert "pi0_arm" in evaluation.summary
