"""`policy.backend: remote` from YAML: the factory, a relay (`omni-ros serve`), `omni-ros eval`, the node.

An upstream server runs the real tiny torch policy; every path through the remote backend must give the
actions that policy gives locally, explicit noise included.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from helpers.bridge_util import droid_obs, start_serve, stop_serve
from omni_ros.backends.factory import load_policy
from omni_ros.config import ConfigError, PolicyConfig, load_config
from omni_ros.policy.loading import from_preset
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.keymap import load_keymap
from omni_ros.serving.server import ServerThread

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("torch_one_thread")]
DROID = load_keymap("droid")


def _tiny(**dims):
    # The kernels `policy: {preset: tiny}` gets (PolicyConfig.cpu_linear), so local and remote runs agree exactly.
    return from_preset("tiny", seed=0, cpu_linear=PolicyConfig().cpu_linear, **dims)


@pytest.fixture(scope="module")
def upstream():
    """The tiny policy shaped like a DROID robot, behind our server in the canonical layout."""
    policy = _tiny(camera_names=DROID.camera_names, state_dim=DROID.state_dim, action_dim=DROID.action_dim)
    with ServerThread(policy, ServeConfig(port=0)) as server:
        yield server, policy


def _yaml(tmp_path, url: str, extra: str = "") -> str:
    path = tmp_path / "remote.yaml"
    path.write_text(f"policy:\n  backend: remote\n  remote: {{url: '{url}', deadline_s: 10.0}}\n{extra}")
    return str(path)


def _raw(seed: int = 0) -> dict:
    return DROID.to_raw(droid_obs(np.random.default_rng(seed)))


def test_remote_backend_from_yaml_gives_the_upstream_actions(upstream, tmp_path):
    server, policy = upstream
    config = load_config(_yaml(tmp_path, server.url))
    remote = load_policy(config.policy, camera_names=DROID.camera_names, state_dim=DROID.state_dim)
    try:
        assert remote.metadata.backend == "remote" and remote.metadata.noise_shape == policy.metadata.noise_shape
        # The server's precision and why, as its own metadata says them.
        assert policy.metadata.precision and remote.metadata.precision == policy.metadata.precision
        raw = _raw()
        np.testing.assert_array_equal(remote.infer(raw)["actions"], policy.infer(raw)["actions"])
        # Explicit noise travels with the request (openpi's `infer(obs, noise=...)`).
        noise = np.random.default_rng(5).normal(size=policy.metadata.noise_shape).astype(np.float32)
        out = remote.infer(raw, noise=noise)["actions"]
        np.testing.assert_allclose(out, policy.infer(raw, noise=noise)["actions"], rtol=0, atol=1e-6)
        assert np.abs(out - policy.infer(raw)["actions"]).max() > 1e-3
    finally:
        remote.close()
    with pytest.raises(ConfigError, match="checkpoint cameras"):
        load_policy(config.policy, camera_names=["front"])


def test_remote_backend_needs_a_url(tmp_path):
    with pytest.raises(ConfigError, match=r"policy\.remote\.url is needed"):
        load_config(_yaml(tmp_path, ""))


def test_serve_relays_to_a_remote_backend(upstream, tmp_path, root):
    server, policy = upstream
    config = _yaml(tmp_path, server.url, "serve: {keymap: droid}\n")
    proc, url, metadata = start_serve(root, "--config", config)
    try:
        assert metadata["backend"] == "remote" and metadata["noise_shape"] == list(policy.metadata.noise_shape)
        client = WebsocketClientPolicy(url)
        for seed in range(2):
            obs = droid_obs(np.random.default_rng(seed))
            np.testing.assert_array_equal(client.infer(obs)["actions"], policy.infer(DROID.to_raw(obs))["actions"])
    finally:
        code, _, err = stop_serve(proc)
    assert code == 0, err


SIM = """
name: remote_eval
policy: {preset: tiny, num_threads: 1}
robot: {joint_names: [joint_1, joint_2, joint_3], dry_run: false}
sim: {image_width: 64, image_height: 64, episode_time_s: 1.0, camera_rate_hz: 15.0}
eval:
  cameras: [{name: base, topic: /camera/base/image_raw}, {name: wrist, topic: /camera/wrist/image_raw}]
  ground_truth: {topic: /arm_controller/joint_trajectory}
  every_k_frames: 3
"""


def test_eval_with_a_remote_backend_equals_the_local_policy(tmp_path):
    from omni_ros.cli import main

    local_yaml = tmp_path / "local.yaml"
    local_yaml.write_text(SIM)
    bag = tmp_path / "bag"
    assert main(["bag", "record-sim", "--episodes", "1", "--out", str(bag), "--config", str(local_yaml), "-q"]) == 0
    local = _tiny(camera_names=["base", "wrist"], state_dim=3, action_dim=3)
    with ServerThread(local, ServeConfig(port=0)) as server:
        remote_yaml = tmp_path / "remote.yaml"
        remote_policy = f"policy: {{backend: remote, remote: {{url: '{server.url}'}}}}"
        remote_yaml.write_text(SIM.replace("policy: {preset: tiny, num_threads: 1}", remote_policy))
        for name, config in (("local", local_yaml), ("remote", remote_yaml)):
            assert main(["eval", str(bag), "--config", str(config), "--out", str(tmp_path / name), "-q"]) == 0
    metrics = {n: json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("local", "remote")}
    assert metrics["remote"]["policy"]["backend"] == "remote"
    local_m, remote_m = metrics["local"]["overall"], metrics["remote"]["overall"]
    # Everything but the latency (one more hop) is the same: same instants, same predictions, same scores.
    local_m.pop("latency_ms"), remote_m.pop("latency_ms")
    assert local_m["episodes"] == 1 and local_m == remote_m


def test_policy_node_runs_a_remote_backend():
    from helpers.policy_harness import Harness

    policy = _tiny(camera_names=["base", "wrist"], state_dim=3, action_dim=3)
    with ServerThread(policy, ServeConfig(port=0)) as server:

        def remote(cfg) -> None:
            cfg.policy.backend, cfg.policy.remote.url = "remote", server.url

        harness = Harness(configure=remote).start()
        try:
            harness.wait_state("running")
            assert harness.wait_for(lambda: len(harness.chunks) > 2 and len(harness.commands) > 10)
            assert harness.chunks[-1].backend == "remote"
            deadline = time.monotonic() + 10
            while server.server.requests_served < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.server.requests_served >= 2
        finally:
            harness.close()
