"""RemotePolicy against our own server: layouts, reconnects, restarts, deadlines, errors."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from helpers.bridge_policies import EchoPolicy, expected_actions
from helpers.bridge_util import echo_server, wait_for
from omni_ros.backends.remote import DeadlineExceeded, RemotePolicy, RemotePolicyError, RemoteServerError
from omni_ros.observation import ObservationError, make_observation
from omni_ros.policy.base import Policy
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.keymap import load_keymap
from omni_ros.serving.server import ServerThread

# openpi_client opens its connection the way websockets >= 16 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _raw(policy: EchoPolicy, rng: np.random.Generator, prompt: str = "stack the blocks", size=(224, 224)) -> dict:
    return {
        "images": {c: rng.integers(0, 256, (*size, 3), dtype=np.uint8) for c in policy.spec.camera_names},
        "state": rng.normal(size=policy.spec.state_dim),
        "prompt": prompt,
    }


def _alone(policy: EchoPolicy, raw: dict) -> np.ndarray:
    return expected_actions(policy, make_observation(policy.spec, raw))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("layout", ["droid", "libero", "aloha"])
def test_remote_policy_uses_the_layout_the_server_announces(layout):
    server, policy, keymap = echo_server(layout)
    with server:
        remote = RemotePolicy(server.url)
        assert isinstance(remote, Policy)
        assert remote.keymap.describe() == keymap.describe()
        assert remote.metadata.action_dim == policy.metadata.action_dim
        assert remote.metadata.backend == "remote" and remote.spec.camera_names == keymap.camera_names
        rng = np.random.default_rng(0)
        for _ in range(2):
            raw = _raw(policy, rng)
            out = remote.infer(raw)
            assert out["actions"].flags.writeable and out["actions"].dtype == np.float32
            np.testing.assert_array_equal(out["actions"], _alone(policy, raw))
            assert out["client_timing"]["round_trip_ms"] > 0 and "server_timing" in out
        remote.close()


def test_explicit_keymap_and_large_frames_are_tiled_before_sending():
    server, policy, keymap = echo_server("libero")
    with server:
        remote = RemotePolicy(server.url, keymap="libero")
        raw = _raw(policy, np.random.default_rng(1), size=(480, 640))
        np.testing.assert_array_equal(remote.infer(raw)["actions"], _alone(policy, raw))
        # What crossed the wire was one 224x224 tile per camera.
        assert all(policy.observations[-1].images[c].shape == (224, 224, 3) for c in keymap.camera_names)


def test_canonical_layout_when_the_server_has_no_keymap():
    policy = EchoPolicy(("front", "side"), state_dim=5, action_dim=3)
    with ServerThread(policy, ServeConfig(port=0)) as server:
        remote = RemotePolicy(server.url)
        raw = _raw(policy, np.random.default_rng(2))
        np.testing.assert_array_equal(remote.infer(raw)["actions"], _alone(policy, raw))


def test_server_restart_mid_session():
    port = _free_port()
    keymap = load_keymap("droid")
    first = EchoPolicy(keymap.camera_names, 8, 8, seed=0)
    second = EchoPolicy(keymap.camera_names, 8, 8, seed=1)
    server = ServerThread(first, ServeConfig(port=port), keymap).start()
    remote = RemotePolicy(server.url, deadline_s=5.0, retries=20, backoff_s=0.02, backoff_max_s=0.2)
    rng = np.random.default_rng(3)
    raw = _raw(first, rng)
    np.testing.assert_array_equal(remote.infer(raw)["actions"], _alone(first, raw))
    server.stop()
    # Down: the request retries with backoff until the new server is up, within its deadline.
    replacement = {}
    restarter = threading.Timer(
        0.3, lambda: replacement.update(s=ServerThread(second, ServeConfig(port=port), keymap).start())
    )
    restarter.start()
    try:
        raw = _raw(first, rng)
        out = remote.infer(raw)
        np.testing.assert_array_equal(out["actions"], _alone(second, raw))  # answered by the new server
        assert remote.reconnects == 1
        raw = _raw(first, rng)
        np.testing.assert_array_equal(remote.infer(raw)["actions"], _alone(second, raw))
    finally:
        restarter.join()
        replacement["s"].stop()


def test_a_restarted_server_with_another_layout_is_refused():
    port = _free_port()
    keymap = load_keymap("droid")
    first = EchoPolicy(keymap.camera_names, 8, 8)
    server = ServerThread(first, ServeConfig(port=port), keymap).start()
    remote = RemotePolicy(server.url, deadline_s=5.0, retries=20, backoff_s=0.02, backoff_max_s=0.2)
    rng = np.random.default_rng(8)
    remote.infer(_raw(first, rng))
    server.stop()
    # Same key map, but chunks of another length: its answers must not reach this robot.
    other = EchoPolicy(keymap.camera_names, 8, 8, horizon=20)
    with ServerThread(other, ServeConfig(port=port), keymap), pytest.raises(RemotePolicyError, match="another"):
        remote.infer(_raw(first, rng))
    assert other.calls == 0


def test_deadline_overrun_raises_and_the_late_reply_is_never_returned():
    server, policy, _keymap = echo_server("droid")
    with server:
        remote = RemotePolicy(server.url, deadline_s=0.3)
        rng = np.random.default_rng(4)
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            remote.infer(_raw(policy, rng, prompt="gate"))
        assert time.monotonic() - start < 5.0
        # The client hung up on the overrun request: the server will drop its reply.
        wait_for(lambda: server.server.abandoned == 1, what="the server to see the client leave")
        policy.gate.set()  # the stale reply is produced now, and goes nowhere
        remote.deadline_s = 5.0
        raw = _raw(policy, rng, prompt="fresh")
        out = remote.infer(raw)
        np.testing.assert_array_equal(out["actions"], _alone(policy, raw))
        assert [o.prompt for o in policy.observations] == ["gate", "fresh"]


def test_server_error_is_raised_and_the_next_request_reconnects():
    server, policy, _keymap = echo_server("droid")
    with server:
        remote = RemotePolicy(server.url)
        rng = np.random.default_rng(5)
        with pytest.raises(RemoteServerError, match="policy exploded on purpose"):
            remote.infer(_raw(policy, rng, prompt="raise"))
        raw = _raw(policy, rng)
        np.testing.assert_array_equal(remote.infer(raw)["actions"], _alone(policy, raw))


def test_bad_observation_is_caught_before_the_network():
    server, policy, _keymap = echo_server("droid")
    with server:
        remote = RemotePolicy(server.url)
        raw = _raw(policy, np.random.default_rng(6))
        raw["state"] = raw["state"][:5]
        with pytest.raises(ObservationError, match="state has length 5"):
            remote.infer(raw)
        assert policy.calls == 0


def test_nothing_listening_gives_up_after_bounded_retries():
    port = _free_port()
    start = time.monotonic()
    with pytest.raises(RemotePolicyError, match="after 3 attempts"):
        RemotePolicy(f"127.0.0.1:{port}", retries=2, backoff_s=0.01, connect_timeout_s=1.0)
    assert time.monotonic() - start < 10


def test_wrong_api_key_is_not_retried():
    server, policy, _keymap = echo_server("droid", api_key="right")
    with server:
        with pytest.raises(RemotePolicyError, match="refused the API key"):
            RemotePolicy(server.url, api_key="wrong", retries=5)
        remote = RemotePolicy(server.url, api_key="right")
        raw = _raw(policy, np.random.default_rng(7))
        np.testing.assert_array_equal(remote.infer(raw)["actions"], _alone(policy, raw))
