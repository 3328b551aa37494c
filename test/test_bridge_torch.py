"""The bridge in front of the real tiny torch policy: openpi layouts in, pi0-style action chunks out, batching too."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from helpers.bridge_util import ACTION_DIMS, OBS_MAKERS
from omni_ros.policy.loading import from_preset
from omni_ros.serving.config import BatchingConfig, ServeConfig
from omni_ros.serving.keymap import load_keymap
from omni_ros.serving.server import ServerThread

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("torch_one_thread")]


def _tiny(keymap):
    return from_preset(
        "tiny", camera_names=keymap.camera_names, state_dim=keymap.state_dim, action_dim=keymap.action_dim, seed=0
    )


@pytest.mark.parametrize("layout", ["droid", "libero", "aloha"])
def test_tiny_torch_policy_behind_the_bridge(layout):
    keymap = load_keymap(layout)
    policy = _tiny(keymap)
    rng = np.random.default_rng(0)
    with ServerThread(policy, ServeConfig(port=0), keymap) as server:
        client = WebsocketClientPolicy(server.url)
        meta = client.get_server_metadata()
        assert meta["backend"].startswith("torch") and meta["action_dim"] == ACTION_DIMS[layout]
        obs = OBS_MAKERS[layout](rng)
        result = client.infer(obs)
    assert result["actions"].shape == (policy.metadata.action_horizon, ACTION_DIMS[layout])
    # What the server computed is what the policy computes on the mapped observation.
    np.testing.assert_array_equal(result["actions"], policy.infer(keymap.to_raw(obs))["actions"])
    assert result["policy_timing"]["infer_ms"] > 0


def test_batched_torch_results_match_unbatched():
    keymap = load_keymap("droid")
    policy = _tiny(keymap)
    n = 4
    observations = [OBS_MAKERS["droid"](np.random.default_rng(10 + i), prompt=f"task {i}") for i in range(n)]
    alone = [policy.infer(keymap.to_raw(obs))["actions"] for obs in observations]
    config = ServeConfig(port=0, batching=BatchingConfig(True, max_batch=n, max_wait_ms=5000))
    with ServerThread(policy, config, keymap) as server:
        clients = [WebsocketClientPolicy(server.url) for _ in range(n)]
        results: dict[int, dict] = {}
        threads = [
            threading.Thread(target=lambda i=i: results.update({i: clients[i].infer(observations[i])}))
            for i in range(n)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        batch_sizes = dict(server.server.batcher.batch_sizes)
    # One full batch, dispatched as soon as every connected client had its request queued.
    assert batch_sizes == {n: 1}, batch_sizes
    for i in range(n):
        assert results[i]["server_timing"]["batch_size"] == n
        # Same seed, same noise per request; a batched matmul may round differently in the last bit.
        np.testing.assert_allclose(results[i]["actions"], alone[i], rtol=0, atol=1e-5)
