"""Real-time chunking over the OpenPI bridge: rtc/ keys from the real openpi-client and from RemotePolicy."""

from __future__ import annotations

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from helpers.bridge_policies import EchoPolicy
from helpers.rtc_util import demo_policy, two_observations
from omni_ros.backends.remote import RemotePolicy
from omni_ros.policy.rtc import RtcError, RtcRequest
from omni_ros.serving.config import BatchingConfig, ServeConfig
from omni_ros.serving.rtc_keys import KEYS, rtc_keys, split_rtc
from omni_ros.serving.server import ServerThread

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def demo(root):
    return demo_policy(root)


@pytest.fixture(scope="module")
def observations():
    return two_observations(1_000_005, 0.2, 10)


def test_the_real_openpi_client_round_trips_rtc_keys(demo, observations):
    first, second = observations
    plan = demo.infer(first)["actions"][5:]
    with ServerThread(demo, ServeConfig(port=0)) as server:
        client = WebsocketClientPolicy(server.url)
        meta = client.get_server_metadata()
        assert meta["rtc"]["methods"] == ["guided", "inpaint"] and set(meta["rtc"]["keys"]) == set(KEYS)
        # An unmodified request is an ordinary openpi request.
        plain = client.infer(second)["actions"]
        np.testing.assert_array_equal(plain, demo.infer(second)["actions"])
        request = RtcRequest(plan, inference_delay=5, execution_horizon=5)
        guided = client.infer({**second, **rtc_keys(request)})["actions"]
        np.testing.assert_array_equal(guided, demo.infer(second, rtc=request)["actions"])
        assert not np.array_equal(guided, plain)
        inpaint = {**second, "rtc/prev_actions": plan, "rtc/inference_delay": 4, "rtc/method": "inpaint"}
        np.testing.assert_allclose(client.infer(inpaint)["actions"][:4], plan[:4], atol=1e-5)


def test_remote_policy_sends_rtc_so_a_robot_gets_it_from_a_server(demo, observations):
    first, second = observations
    plan = demo.infer(first)["actions"][5:]
    request = RtcRequest(plan, inference_delay=5, schedule="linear", max_guidance_weight=3.0)
    config = ServeConfig(port=0, batching=BatchingConfig(True, max_batch=4, max_wait_ms=5))
    with ServerThread(demo, config) as server:  # an RTC request bypasses the batcher
        remote = RemotePolicy(server.url)
        assert remote.rtc_methods == ("guided", "inpaint")
        out = remote.infer(second, rtc=request)["actions"]
        np.testing.assert_array_equal(out, demo.infer(second, rtc=request)["actions"])
        np.testing.assert_array_equal(remote.infer(second)["actions"], demo.infer(second)["actions"])
        remote.close()


@pytest.mark.parametrize(
    "keys,match",
    [
        ({"rtc/prev_actions": np.zeros((4, 3))}, "needs rtc/inference_delay"),
        ({"rtc/prev_actions": np.zeros((4, 3)), "rtc/inference_delay": "2"}, "must be an integer"),
        ({"rtc/prev_actions": np.zeros((4, 3)), "rtc/inference_delay": 2, "rtc/delay": 1}, "unknown rtc key"),
        ({"rtc/prev_actions": np.zeros((4, 5)), "rtc/inference_delay": 2}, "joints"),
        ({"rtc/prev_actions": np.full((4, 3), np.nan), "rtc/inference_delay": 2}, "NaN"),
        ({"rtc/prev_actions": np.zeros((4, 3)), "rtc/inference_delay": 2, "rtc/method": "magic"}, "method"),
    ],
)
def test_malformed_rtc_keys_get_a_clear_error_and_the_server_keeps_serving(demo, observations, keys, match):
    _, second = observations
    with ServerThread(demo, ServeConfig(port=0)) as server:
        client = WebsocketClientPolicy(server.url)
        with pytest.raises(RuntimeError, match=match):
            client.infer({**second, **keys})
        assert WebsocketClientPolicy(server.url).infer(second)["actions"].shape == (16, 3)


def test_a_policy_without_rtc_says_so_and_refuses_rtc_keys():
    policy = EchoPolicy(camera_names=("cam",), state_dim=3, action_dim=3)
    rng = np.random.default_rng(0)
    obs = {"images": {"cam": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)}, "state": np.zeros(3)}
    with ServerThread(policy, ServeConfig(port=0)) as server:
        client = WebsocketClientPolicy(server.url)
        assert client.get_server_metadata()["rtc"] == {"methods": []}
        with pytest.raises(RuntimeError, match="does not support real-time chunking"):
            client.infer({**obs, "rtc/prev_actions": np.zeros((4, 3)), "rtc/inference_delay": 1})
        remote = RemotePolicy(server.url)
        assert remote.rtc_methods == ()
        with pytest.raises(RtcError, match="cannot serve rtc method 'guided'"):
            remote.infer(obs, rtc=RtcRequest(np.zeros((4, 3)), 1))
        remote.close()


def test_split_rtc_leaves_plain_requests_alone():
    obs = {"observation/state": np.zeros(3), "prompt": "x"}
    assert split_rtc(obs) == (obs, None)
    rest, request = split_rtc({**obs, "rtc/prev_actions": np.ones((2, 3)), "rtc/inference_delay": np.int64(1)})
    assert rest == obs and request.inference_delay == 1 and request.max_guidance_weight is None
