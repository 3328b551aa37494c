"""A LeRobot pi0 folder run by every part of the product: the bridge (real openpi-client), the policy node
over DDS, and `omni-ros eval` on a recorded bag. Each gives the actions `omni_ros.policy.load` gives."""

from __future__ import annotations

import json

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

import omni_ros.policy
from helpers.lerobot_arm import ARM, JOINTS, configure, harness_observation, synthetic_spec
from helpers.lerobot_arm import observation as _obs
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.server import ServerThread

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("torch_one_thread")]


@pytest.fixture(scope="module")
def arm():
    return omni_ros.policy.load(ARM)


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

    harness = Harness(configure=configure).start(prompt="Pick up the RED cube")
    try:
        harness.wait_state("running", timeout=30)
        assert harness.wait_for(lambda: len(harness.chunks) >= 2, timeout=30)
        chunk = harness.chunks[-1]
        assert list(chunk.joint_names) == JOINTS and (chunk.horizon, chunk.action_dim) == (10, 6)
        expected = arm.infer(harness_observation())["actions"]
        np.testing.assert_allclose(np.asarray(chunk.actions).reshape(10, 6), expected, rtol=0, atol=1e-5)
        assert harness.wait_for(lambda: len(harness.commands) > 5, timeout=20)
        assert list(harness.commands[-1].joint_names) == JOINTS
    finally:
        harness.close()


def test_eval_replays_a_bag_through_a_lerobot_checkpoint(tmp_path):
    from omni_ros.eval.evaluate import evaluate
    from omni_ros.eval.schema import validate
    from omni_ros.eval.synthetic import write_synthetic_bag

    spec = synthetic_spec()
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    config = spec.config()
    config.policy.checkpoint = str(ARM)
    evaluation = evaluate([bag], config, out_dir=tmp_path / "out", progress=False)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert validate(metrics) == []
    assert metrics["policy"]["model"] == "pi0_arm" and metrics["policy"]["backend"] == "torch-cpu"
    assert metrics["overall"]["evaluated"] >= 5 and np.isfinite(metrics["overall"]["mae"])
    assert "pi0_arm" in evaluation.summary
