"""The TCP balancer `omni-ros serve --ray` puts in front of its replicas, here in front of two plain servers.

The real openpi-client talks through it; the servers tell themselves apart by their action horizon.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed, InvalidMessage

from helpers.bridge_policies import EchoPolicy, expected_actions
from helpers.bridge_util import healthz, raw_client, wait_for
from omni_ros.cluster import free_port
from omni_ros.observation import make_observation
from omni_ros.serving.balancer import TcpBalancer
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.server import ServerThread

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
HORIZONS = (10, 12)


def _obs(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    return {"images": {"cam": image}, "state": rng.normal(size=8), "prompt": "stack the cups"}


@pytest.fixture
def servers():
    threads = [ServerThread(EchoPolicy(horizon=h), ServeConfig(port=0)).start() for h in HORIZONS]
    try:
        yield threads
    finally:
        for t in threads:
            t.stop()


def _addresses(servers) -> list[tuple[str, int]]:
    return [("127.0.0.1", s.port) for s in servers]


def test_connections_spread_over_the_targets_and_bytes_pass_unchanged(servers):
    with TcpBalancer("127.0.0.1", 0, lambda: _addresses(servers)) as balancer:
        url = f"ws://127.0.0.1:{balancer.port}"
        clients = [WebsocketClientPolicy(url) for _ in range(4)]
        horizons = [c.get_server_metadata()["action_horizon"] for c in clients]
        assert sorted(horizons) == [10, 10, 12, 12]
        assert sorted(balancer.open_connections.values()) == [2, 2]
        for client, horizon in zip(clients, horizons, strict=True):
            policy = EchoPolicy(horizon=horizon)
            obs = _obs(horizon)
            expected = expected_actions(policy, make_observation(policy.spec, obs))
            np.testing.assert_array_equal(client.infer(obs)["actions"], expected)
        # Plain HTTP passes too.
        status, body = healthz(balancer.port)  # the target's own answer, passed through
        assert (status, body.splitlines()[0]) == (200, "OK")
        for client in clients:
            client._ws.close()
        wait_for(lambda: sum(balancer.open_connections.values()) == 0, what="the closed connections to be let go")
        # Ties are taken in turn: one after another, new connections alternate between the targets.
        alternating = []
        for _ in range(4):
            client = WebsocketClientPolicy(url)
            alternating.append(client.get_server_metadata()["action_horizon"])
            client._ws.close()
            wait_for(lambda: sum(balancer.open_connections.values()) == 0, what="the connection to be let go")
        assert sorted(alternating) == [10, 10, 12, 12]


def test_a_refusing_target_is_skipped_and_no_target_closes_the_connection(servers):
    dead = ("127.0.0.1", free_port())
    targets = [dead, ("127.0.0.1", servers[1].port)]
    with TcpBalancer("127.0.0.1", 0, lambda: list(targets), refresh_s=0.1) as balancer:
        url = f"ws://127.0.0.1:{balancer.port}"
        for _ in range(3):
            assert WebsocketClientPolicy(url).get_server_metadata()["action_horizon"] == 12
        # Nothing to send a connection to: the client sees it closed, and the balancer keeps listening.
        targets[:] = []
        wait_for(lambda: balancer.targets == (), what="the refresh")
        with pytest.raises((ConnectionClosed, InvalidMessage, OSError, EOFError)):
            raw_client(url)
        targets[:] = [("127.0.0.1", servers[0].port)]
        wait_for(lambda: bool(balancer.targets), what="the refresh")
        assert WebsocketClientPolicy(url).get_server_metadata()["action_horizon"] == 10


def test_a_failing_target_source_keeps_the_last_answer(servers):
    calls = []

    def targets() -> list[tuple[str, int]]:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("controller unreachable")
        return _addresses(servers)[:1]

    with TcpBalancer("127.0.0.1", 0, targets, refresh_s=0.05) as balancer:
        wait_for(lambda: len(calls) > 3, what="a few refreshes")
        assert balancer.targets == (("127.0.0.1", servers[0].port),)
        client = WebsocketClientPolicy(f"ws://127.0.0.1:{balancer.port}")
        assert client.get_server_metadata()["action_horizon"] == 10


def test_a_target_that_dies_closes_its_clients_connection(servers):
    with TcpBalancer("127.0.0.1", 0, lambda: _addresses(servers)[:1]) as balancer:
        ws, metadata = raw_client(f"ws://127.0.0.1:{balancer.port}")
        assert metadata["action_horizon"] == 10
        servers[0].stop()
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        wait_for(lambda: sum(balancer.open_connections.values()) == 0, what="the connection to be let go")


def test_stop_closes_the_port_and_a_taken_port_is_an_error(servers):
    balancer = TcpBalancer("127.0.0.1", 0, lambda: _addresses(servers)).start()
    port = balancer.port
    with pytest.raises(OSError):
        TcpBalancer("127.0.0.1", port, lambda: []).start()
    balancer.stop()
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))
