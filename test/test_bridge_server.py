"""The real openpi-client against our server on 127.0.0.1: protocol, concurrency, bad input, API key, shutdown."""

from __future__ import annotations

import threading
import time
import types

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy as openpi_codec
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed, InvalidStatus

from helpers.bridge_policies import EchoPolicy, expected_actions
from helpers.bridge_util import ACTION_DIMS, OBS_MAKERS, droid_obs, echo_server, healthz, raw_client, wait_for
from omni_ros.config import ConfigError
from omni_ros.observation import make_observation
from omni_ros.serving import service
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.keymap import load_keymap
from omni_ros.serving.server import PolicyServer, ServerThread
from omni_ros.serving.service import INLINE_AFTER, INLINE_BLOCKING_MS

# openpi_client opens its connection the way websockets >= 16 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _expected(policy: EchoPolicy, keymap, obs) -> np.ndarray:
    return expected_actions(policy, make_observation(policy.spec, keymap.to_raw(obs)))


@pytest.fixture
def droid_server():
    server, policy, keymap = echo_server("droid")
    with server:
        yield server, policy, keymap


@pytest.mark.parametrize("layout", ["droid", "libero", "aloha"])
def test_openpi_client_metadata_and_infer(layout):
    server, policy, keymap = echo_server(layout)
    rng = np.random.default_rng(0)
    with server:
        client = WebsocketClientPolicy(server.url)
        meta = client.get_server_metadata()
        assert meta["camera_names"] == list(keymap.camera_names)
        assert (meta["state_dim"], meta["action_dim"]) == (keymap.state_dim, ACTION_DIMS[layout])
        assert meta["action_horizon"] == policy.metadata.action_horizon
        assert meta["keymap"]["name"] == layout and meta["server"] == "omni_ros"
        for i in range(3):
            obs = OBS_MAKERS[layout](rng, prompt=f"task {i}")
            result = client.infer(obs)
            assert result["actions"].shape == (policy.metadata.action_horizon, ACTION_DIMS[layout])
            assert result["actions"].dtype == np.float32
            np.testing.assert_array_equal(result["actions"], _expected(policy, keymap, obs))
            assert result["policy_timing"]["infer_ms"] >= 0
            assert result["server_timing"]["infer_ms"] >= 0
            # openpi's convention: the previous round trip, from the second request on.
            assert ("prev_total_ms" in result["server_timing"]) == (i > 0)
        assert policy.calls == 3


def test_raw_frames_on_the_wire(droid_server):
    server, _policy, _keymap = droid_server
    ws, meta = raw_client(server.url)
    assert meta == server.server.metadata
    obs = droid_obs(np.random.default_rng(1))
    ws.send(openpi_codec.packb(obs))
    reply = ws.recv(timeout=10)
    assert isinstance(reply, bytes)
    decoded = msgpack.unpackb(reply, raw=True)
    assert decoded[b"actions"][b"__ndarray__"] is True and decoded[b"actions"][b"dtype"] == b"<f4"
    ws.close()


def test_healthz_and_pings_answer_during_a_slow_inference(droid_server):
    server, policy, _keymap = droid_server
    slow = WebsocketClientPolicy(server.url)
    results = {}
    worker = threading.Thread(target=lambda: results.update(r=slow.infer(droid_obs(np.random.default_rng(2), "gate"))))
    worker.start()
    try:
        assert policy.entered.wait(10)
        status, body = healthz(server.port, timeout=5)
        assert (status, body.splitlines()[0]) == (200, "OK")
        # Another client connects and gets its metadata while the inference runs.
        other = WebsocketClientPolicy(server.url)
        assert other.get_server_metadata()["model"] == "echo-test"
        # Keepalive pings of the busy connection are answered too.
        assert slow._ws.ping().wait(5)
        assert worker.is_alive() and "r" not in results
    finally:
        policy.gate.set()
        worker.join(10)
    assert results["r"]["actions"].shape == (10, 8)


def test_malformed_observation_raises_in_the_client_and_server_keeps_serving(droid_server):
    server, policy, keymap = droid_server
    client = WebsocketClientPolicy(server.url)
    obs = droid_obs(np.random.default_rng(3))
    del obs["observation/joint_position"]
    with pytest.raises(RuntimeError, match="missing state key 'observation/joint_position'"):
        client.infer(obs)
    # The failed connection was closed with 1011.
    with pytest.raises(ConnectionClosed) as info:
        client._ws.recv(timeout=5)
    assert info.value.rcvd.code == 1011
    fresh = WebsocketClientPolicy(server.url)
    good = droid_obs(np.random.default_rng(4))
    np.testing.assert_array_equal(fresh.infer(good)["actions"], _expected(policy, keymap, good))


def test_policy_exception_sends_traceback_then_1011(droid_server):
    server, _policy, _keymap = droid_server
    client = WebsocketClientPolicy(server.url)
    with pytest.raises(RuntimeError) as info:
        client.infer(droid_obs(np.random.default_rng(5), "raise"))
    assert "policy error: RuntimeError: policy exploded on purpose" in str(info.value)
    assert "Traceback (most recent call last)" in str(info.value)
    assert WebsocketClientPolicy(server.url).infer(droid_obs(np.random.default_rng(6)))["actions"].shape == (10, 8)


def _array_frame(dtype: str, data: bytes, shape: list) -> bytes:
    obs = droid_obs(np.random.default_rng(7))
    frame = msgpack.unpackb(openpi_codec.packb(obs), raw=False, strict_map_key=False)
    frame["observation/joint_position"] = {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}
    return msgpack.packb(frame)


def _droid_with(key: str, value) -> bytes:
    return openpi_codec.packb({**droid_obs(np.random.default_rng(9)), key: value})


BAD_FRAMES = {
    "truncated msgpack": (openpi_codec.packb(droid_obs(np.random.default_rng(8)))[:-100], "incomplete input"),
    "non-dict payload": (openpi_codec.packb([1, 2, 3]), "observation must be a dict"),
    "object dtype": (_array_frame("|O", b"\x00" * 56, [7]), "refused array dtype '|O'"),
    "size mismatch": (_array_frame("<f8", b"\x00" * 8, [7]), "needs 56 bytes, got 8"),
    "wrong image shape": (
        _droid_with("observation/wrist_image_left", np.zeros((224, 224, 5), np.uint8)),
        "no channel axis",
    ),
    "image too small": (
        _droid_with("observation/wrist_image_left", np.zeros((1, 9, 3), np.uint8)),
        "too small",
    ),
    "nan state": (
        _droid_with("observation/joint_position", np.full(7, np.nan)),
        "non-finite",
    ),
    "text frame": ("hello", "expected a binary msgpack frame"),
}  # fmt: skip


def test_bad_input_gets_a_clear_error_and_others_are_unaffected(droid_server):
    server, policy, keymap = droid_server
    bystander = WebsocketClientPolicy(server.url)
    rng = np.random.default_rng(10)
    for name, (frame, reason) in BAD_FRAMES.items():
        ws, _ = raw_client(server.url)
        ws.send(frame)
        reply = ws.recv(timeout=10)
        assert isinstance(reply, str) and reason in reply, (name, reply)
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=5)
        assert info.value.rcvd.code == 1011, name
        obs = droid_obs(rng)
        np.testing.assert_array_equal(bystander.infer(obs)["actions"], _expected(policy, keymap, obs))
    assert healthz(server.port)[0] == 200


def test_frame_above_the_cap_is_refused_with_1009(droid_server):
    server, policy, keymap = droid_server
    assert server.server.config.max_message_bytes < 50_000_000
    bystander = WebsocketClientPolicy(server.url)
    ws, _ = raw_client(server.url)
    big = openpi_codec.packb({"observation/exterior_image_1_left": np.zeros((50_000_000,), np.uint8)})
    with pytest.raises(ConnectionClosed) as info:
        ws.send(big)
        ws.recv(timeout=10)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009
    obs = droid_obs(np.random.default_rng(11))
    np.testing.assert_array_equal(bystander.infer(obs)["actions"], _expected(policy, keymap, obs))
    assert WebsocketClientPolicy(server.url).infer(obs)["actions"].shape == (10, 8)


def test_default_cap_takes_four_raw_640x480_cameras():
    server, policy, keymap = echo_server("aloha")
    rng = np.random.default_rng(12)
    obs = {
        "images": {c: rng.integers(0, 256, (3, 480, 640), dtype=np.uint8) for c in keymap.camera_names},
        "state": rng.normal(size=14),
        "prompt": "raw frames",
    }
    with server:
        result = WebsocketClientPolicy(server.url).infer(obs)
    np.testing.assert_array_equal(result["actions"], _expected(policy, keymap, obs))


def test_client_leaving_mid_inference(droid_server):
    server, policy, keymap = droid_server
    busy = WebsocketClientPolicy(server.url)
    results = {}
    worker = threading.Thread(target=lambda: results.update(r=busy.infer(droid_obs(np.random.default_rng(13), "gate"))))
    worker.start()
    try:
        assert policy.entered.wait(10)
        # This client's request waits behind the gated one; it leaves before it runs.
        quitter, _ = raw_client(server.url)
        quitter.send(openpi_codec.packb(droid_obs(np.random.default_rng(14), "never run")))
        quitter.close()
        wait_for(lambda: server.server.abandoned == 1, what="the server to notice the departure")
    finally:
        policy.gate.set()
        worker.join(10)
    assert results["r"]["actions"].shape == (10, 8)
    assert [o.prompt for o in policy.observations] == ["gate"]  # the abandoned request never ran
    # The gated client itself leaving mid-inference is just as harmless.
    policy.gate.clear()
    policy.entered.clear()
    leaver, _ = raw_client(server.url)
    leaver.send(openpi_codec.packb(droid_obs(np.random.default_rng(15), "gate")))
    assert policy.entered.wait(10)
    leaver.close()
    wait_for(lambda: server.server.abandoned == 2, what="the second departure")
    policy.gate.set()
    obs = droid_obs(np.random.default_rng(16))
    np.testing.assert_array_equal(busy.infer(obs)["actions"], _expected(policy, keymap, obs))


def test_concurrent_clients_each_get_their_own_answer(droid_server):
    server, policy, keymap = droid_server
    observations = [droid_obs(np.random.default_rng(100 + i), prompt=f"client {i}") for i in range(6)]
    clients = [WebsocketClientPolicy(server.url) for _ in observations]
    results: dict[int, np.ndarray] = {}

    def run(i: int) -> None:
        for _ in range(3):
            results[i] = clients[i].infer(observations[i])["actions"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for i, obs in enumerate(observations):
        np.testing.assert_array_equal(results[i], _expected(policy, keymap, obs))
    assert policy.calls == 18


def test_api_key():
    server, _policy, _keymap = echo_server("droid", api_key="s3cret")
    with server:
        with pytest.raises(InvalidStatus) as info:
            WebsocketClientPolicy(server.url)
        assert info.value.response.status_code == 401
        with pytest.raises(InvalidStatus):
            WebsocketClientPolicy(server.url, api_key="s3cres")
        client = WebsocketClientPolicy(server.url, api_key="s3cret")
        assert client.infer(droid_obs(np.random.default_rng(17)))["actions"].shape == (10, 8)
        status, body = healthz(server.port)
        assert (status, body.splitlines()[0]) == (200, "OK")


def test_api_key_from_environment(monkeypatch):
    monkeypatch.setenv("OMNI_ROS_TEST_KEY", "from-env")
    server, _policy, _keymap = echo_server("droid", api_key_env="OMNI_ROS_TEST_KEY")
    with server:
        with pytest.raises(InvalidStatus):
            WebsocketClientPolicy(server.url)
        assert WebsocketClientPolicy(server.url, api_key="from-env").get_server_metadata()["model"] == "echo-test"


def test_binds_loopback_by_default():
    assert ServeConfig().host == "127.0.0.1"
    server, _policy, _keymap = echo_server("droid")
    with server:
        assert server.server._server.sockets[0].getsockname()[0] == "127.0.0.1"


def test_graceful_shutdown_finishes_in_flight_requests():
    server, policy, _keymap = echo_server("droid")
    server.start()
    busy = WebsocketClientPolicy(server.url)
    idle = WebsocketClientPolicy(server.url)
    results = {}
    worker = threading.Thread(target=lambda: results.update(r=busy.infer(droid_obs(np.random.default_rng(18), "gate"))))
    worker.start()
    assert policy.entered.wait(10)
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    # The idle connection is closed with 1001 (going away) right away.
    with pytest.raises(ConnectionClosed) as info:
        idle._ws.recv(timeout=10)
    assert info.value.rcvd.code == 1001
    assert stopper.is_alive()  # still draining the gated request
    policy.gate.set()
    worker.join(10)
    stopper.join(10)
    assert not stopper.is_alive()
    assert results["r"]["actions"].shape == (10, 8)  # the in-flight request got its answer
    with pytest.raises(ConnectionClosed) as info:
        busy._ws.recv(timeout=10)
    assert info.value.rcvd.code == 1001
    with pytest.raises(OSError):
        WebsocketClientPolicy(server.url)


def test_keymap_policy_mismatch_fails_at_start():
    policy = EchoPolicy(("cam",), state_dim=8)
    with pytest.raises(ConfigError, match="camera"):
        PolicyServer(policy, ServeConfig(port=0), load_keymap("droid"))
    policy = EchoPolicy(("base", "wrist"), state_dim=9, action_dim=7)
    with pytest.raises(ConfigError, match="8-D state"):
        PolicyServer(policy, ServeConfig(port=0), load_keymap("libero"))
    policy = EchoPolicy(("base", "wrist"), state_dim=8, action_dim=8)
    with pytest.raises(ConfigError, match="7-D actions"):
        PolicyServer(policy, ServeConfig(port=0), load_keymap("libero"))


class _ThreadRecordingPolicy(EchoPolicy):
    """A constant chunk, recording which thread ran each call; each call advances the service's clock by
    `delay_ms` (and nothing else does), so the durations the service sees are exactly the ones set here."""

    def __init__(self, monkeypatch) -> None:
        keymap = load_keymap("droid")
        super().__init__(keymap.camera_names, keymap.state_dim, 8)
        self.threads: list[str] = []
        self.delay_ms = 0.0
        self.clock = [0.0]
        fake = types.SimpleNamespace(perf_counter=lambda: self.clock[0], monotonic=time.monotonic)
        monkeypatch.setattr(service, "time", fake)

    def infer(self, obs, *, noise=None):
        self.threads.append(threading.current_thread().name)
        self.clock[0] += self.delay_ms / 1e3
        return {"actions": np.zeros((10, 8), np.float32)}

    def run(self, client, obs, delay_ms: float, calls: int) -> list[str]:
        self.delay_ms = delay_ms
        start = len(self.threads)
        for _ in range(calls):
            result = client.infer(obs)
            # infer_ms is the policy's own time (as openpi reports it), wherever it ran.
            assert result["server_timing"]["infer_ms"] == pytest.approx(delay_ms)
        return ["loop" if t == "omni-serve-loop" else "thread" for t in self.threads[start:]]


def test_a_policy_faster_than_a_thread_hand_off_runs_on_the_event_loop(monkeypatch):
    policy = _ThreadRecordingPolicy(monkeypatch)
    obs = droid_obs(np.random.default_rng(0))
    n = INLINE_AFTER
    with ServerThread(policy, ServeConfig(port=0, inline_below_ms=1.0), load_keymap("droid")) as server:
        client = WebsocketClientPolicy(server.url)
        # Nothing known yet: on the thread; then, the last n calls all short, on the loop.
        assert policy.run(client, obs, 0.1, n + 2) == ["thread"] * n + ["loop"] * 2
        # A call above the limit (the machine was busy) runs where it was sent, the next n go to the thread.
        assert policy.run(client, obs, 5.0, n + 1) == ["loop"] + ["thread"] * n
        assert policy.run(client, obs, 0.1, n + 1) == ["thread"] * n + ["loop"]
        # A call that held the loop up (INLINE_BLOCKING_MS): never on the loop again.
        assert policy.run(client, obs, INLINE_BLOCKING_MS, 1) == ["loop"]
        assert policy.run(client, obs, 0.1, 2 * n) == ["thread"] * (2 * n)


def test_inline_below_ms_zero_keeps_every_call_on_the_threads(monkeypatch):
    policy = _ThreadRecordingPolicy(monkeypatch)
    obs = droid_obs(np.random.default_rng(0))
    with ServerThread(policy, ServeConfig(port=0, inline_below_ms=0.0), load_keymap("droid")) as server:
        assert policy.run(WebsocketClientPolicy(server.url), obs, 0.0, INLINE_AFTER + 4) == ["thread"] * (
            INLINE_AFTER + 4
        )
