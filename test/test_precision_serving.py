"""int8 GEMMs (policy.precision int8) through every part of the product on a LeRobot pi0 folder: the bridge with
the real openpi-client, the policy node over DDS, and `omni-ros eval`. Each serves the int8 policy's own actions
(within 4% of float32's) and says what it runs in."""

from __future__ import annotations

import json

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

import omni_ros.policy
from helpers.lerobot_arm import ARM, configure, harness_observation, synthetic_spec
from helpers.lerobot_arm import observation as _obs
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.server import ServerThread

INT8_REL_L2 = 0.04  # the bound for int8 against float32
INT8 = "int8 (onednn): policy.precision int8, emulated: no AVX512_VNNI, AVX_VNNI or AMX_INT8"  # conftest's AVX2 CPU
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("torch_one_thread")]


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def fp32():
    return omni_ros.policy.load(ARM)


@pytest.fixture(scope="module")
def int8():
    return omni_ros.policy.load(ARM, precision="int8", int8_kernel="onednn", cpu_linear="packed")


def test_the_bridge_serves_int8_to_openpi_client(int8, fp32):
    from helpers.bridge_util import healthz

    with ServerThread(int8, ServeConfig(port=0)) as server:
        client = WebsocketClientPolicy(server.url)
        assert client.get_server_metadata()["precision"] == INT8
        status, body = healthz(server.port)
        assert status == 200 and body.splitlines()[0] == "OK" and f"precision: {INT8}" in body.splitlines()
        for seed in range(2):
            reply = client.infer(_obs(seed))
            np.testing.assert_array_equal(reply["actions"], int8.infer(_obs(seed))["actions"])
            reference = fp32.infer(_obs(seed))["actions"]
            assert 1e-5 < _rel(reply["actions"], reference) < INT8_REL_L2


def test_the_policy_node_runs_int8_over_dds_and_says_so(int8, fp32):
    from helpers.policy_harness import Harness

    def lerobot_arm(cfg) -> None:
        configure(cfg)
        cfg.policy.precision, cfg.policy.int8_kernel = "int8", "onednn"

    harness = Harness(configure=lerobot_arm).start(prompt="Pick up the RED cube")
    try:
        status = harness.wait_state("running", timeout=30)
        assert status.precision == INT8
        assert harness.wait_for(lambda: len(harness.chunks) >= 2, timeout=30)
        obs = harness_observation()
        actions = np.asarray(harness.chunks[-1].actions).reshape(10, 6)
        np.testing.assert_allclose(actions, int8.infer(obs)["actions"], rtol=0, atol=1e-5)
        assert _rel(actions, fp32.infer(obs)["actions"]) < INT8_REL_L2
    finally:
        harness.close()


def test_eval_replays_a_bag_with_int8(tmp_path):
    from omni_ros.eval.evaluate import evaluate
    from omni_ros.eval.schema import validate
    from omni_ros.eval.synthetic import write_synthetic_bag

    spec = synthetic_spec()
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    runs = {}
    for precision in ("fp32", "int8"):
        config = spec.config()
        config.policy.checkpoint, config.policy.precision, config.policy.int8_kernel = str(ARM), precision, "onednn"
        out = tmp_path / precision
        evaluation = evaluate([bag], config, out_dir=out, progress=False)
        runs[precision] = json.loads((out / "metrics.json").read_text())
        assert validate(runs[precision]) == []
        assert runs[precision]["policy"]["precision"] in evaluation.summary
    assert runs["int8"]["policy"]["precision"] == INT8
    assert runs["fp32"]["policy"]["precision"] == "fp32: policy.precision fp32"
    mae = {p: runs[p]["overall"]["mae"] for p in runs}
    assert runs["int8"]["overall"]["evaluated"] == runs["fp32"]["overall"]["evaluated"] >= 5
    # The same bag, the same noise seed: int8's error against the recording is float32's to within the bound.
    assert abs(mae["int8"] - mae["fp32"]) <= INT8_REL_L2 * mae["fp32"] + 1e-6, mae
