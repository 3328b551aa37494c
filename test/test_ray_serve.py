"""The OpenPI endpoint on Ray Serve (fused and two-hop), a replica killed under load, and `eval --ray`.

One in-process Ray cluster on 127.0.0.1, with Serve's direct ingress on, serves every test of this module
(starting one costs seconds):
  /         fused, 2 replicas of the tiny torch policy (seed 0), DROID key map, API key; reached through
            our TCP balancer on the replicas' own ports, as `omni-ros serve --ray` serves it (and through
            Serve's proxy once, which `serve run` users get)
  /libero   fused, 1 replica of the echo policy, LIBERO key map, a 1 MiB message cap
  /two-hop  two-hop, an ingress and 2 echo policy replicas, DROID key map
Serve's proxy is first offered a port something else holds (it must move to another). The real openpi-client
drives them; actions must equal those of the single-process server. Last, the same cluster runs `eval --ray` on
three bags, whose report must be the serial run's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from openpi_client import msgpack_numpy as openpi_codec
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed, InvalidStatus

import omni_ros.cluster
from helpers.bridge_policies import EchoPolicy, expected_actions
from helpers.bridge_util import droid_obs, healthz, libero_obs, raw_client, wait_for
from helpers.listening import listeners
from omni_ros.backends.remote import RemotePolicy
from omni_ros.cluster import DIRECT_INGRESS_ENV, LocalCluster, processes_under
from omni_ros.config import PolicyConfig
from omni_ros.cpu_idle import LatencyRequest
from omni_ros.eval.evaluate import evaluate
from omni_ros.eval.schema import validate
from omni_ros.eval.synthetic import SyntheticSpec, write_synthetic_bag
from omni_ros.observation import make_observation
from omni_ros.serving.balancer import TcpBalancer
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.keymap import load_keymap
from omni_ros.serving.policies import load_served_policy
from omni_ros.serving.server import ServerThread

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("torch_one_thread")]

KEY = "fleet-key"
TINY = PolicyConfig(preset="tiny", num_threads=1, seed=0)
ECHO = "helpers.bridge_policies:make_policy"


class Endpoints(NamedTuple):
    cluster: LocalCluster
    url: str  # the balancer in front of the "/" application's replicas
    proxy: str  # Serve's proxy: every application under its route prefix
    balancer: TcpBalancer
    taken_port: int  # the port the proxy was first offered, which something else held


@pytest.fixture(scope="module")
def cluster():
    from ray import serve

    from omni_ros.serving.ray_serve import RaySpec, application, replica_targets

    # The replicas import the test helpers (the echo policy factory).
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)
    cluster = LocalCluster(num_cpus=4, env={"PYTHONPATH": path, **DIRECT_INGRESS_ENV}).start()
    # The first free port the proxy is offered gets taken before it binds (what the cluster's own processes
    # once did in CI): start_serve must move on to another one.
    squatter = socket.create_server(("127.0.0.1", 0))
    taken = squatter.getsockname()[1]
    offers = iter([taken])
    real_free_port = omni_ros.cluster.free_port
    omni_ros.cluster.free_port = lambda host="127.0.0.1": next(offers, None) or real_free_port(host)
    try:
        port = cluster.start_serve()
    finally:
        omni_ros.cluster.free_port = real_free_port
        squatter.close()
    balancer = None
    apps = {
        "/": RaySpec(serve=ServeConfig(keymap="droid", api_key=KEY), policy=TINY, replicas=2),
        "/libero": RaySpec(
            serve=ServeConfig(keymap="libero", max_message_bytes=1 << 20), policy_factory=ECHO, num_cpus=0
        ),
        "/two-hop": RaySpec(serve=ServeConfig(keymap="droid"), policy_factory=ECHO, design="two-hop", num_cpus=0),
    }
    try:
        for route, spec in apps.items():
            spec.graceful_shutdown_s = 1.0
            serve.run(application(spec), name=route.strip("/") or "droid", route_prefix=route)
        balancer = TcpBalancer("127.0.0.1", 0, replica_targets("droid")).start(wait_for_targets_s=30)
        yield Endpoints(cluster, f"ws://127.0.0.1:{balancer.port}", f"ws://127.0.0.1:{port}", balancer, taken)
    finally:
        if balancer is not None:
            balancer.stop()
        cluster.stop()
    assert cluster.leftovers == [], "processes were left after ray.shutdown()"


@pytest.fixture(scope="module")
def reference():
    """The same tiny policy behind the single-process server."""
    keymap = load_keymap("droid")
    with ServerThread(load_served_policy(TINY, keymap), ServeConfig(port=0), keymap) as server:
        yield WebsocketClientPolicy(server.url), server.server.metadata


def _replica(client: WebsocketClientPolicy) -> dict:
    return client.get_server_metadata()["replica"]


def _client_on(url: str, wanted) -> WebsocketClientPolicy:
    """A connection that landed on a replica for which `wanted(replica)` holds (routing is random)."""
    for _ in range(30):
        client = WebsocketClientPolicy(url, api_key=KEY)
        if wanted(_replica(client)):
            return client
        client._ws.close()
    raise AssertionError("no connection landed on the wanted replica")


def test_openpi_client_gets_the_single_process_servers_actions_from_both_replicas(cluster, reference):
    url = cluster.url
    local, local_meta = reference
    clients = [WebsocketClientPolicy(url, api_key=KEY) for _ in range(6)]
    meta = clients[0].get_server_metadata()
    assert meta["design"] == "fused" and meta["keymap"]["name"] == "droid"
    assert {k: v for k, v in meta.items() if k not in ("design", "replica")} == local_meta
    # Connections spread over the replicas, and each keeps its replica for life.
    assert len({_replica(c)["id"] for c in clients}) == 2
    # Each replica process runs the policy's thread settings: policy.num_threads, idle workers asleep, and idle
    # cores polling while inferring as policy.cpu_idle_poll auto makes them on this machine (a fresh request's
    # status: the replica opens the same device under the same mode).
    threads = {json.dumps(_replica(c)["threads"], sort_keys=True) for c in clients}
    idle_poll = LatencyRequest(mode="auto").status().describe()
    assert [json.loads(t) for t in threads] == [
        {"wait_policy": "passive", "num_threads": 1, "torch_imported": True, "cpu_idle_poll": idle_poll}
    ]
    rng = np.random.default_rng(0)
    for i in range(3):
        obs = droid_obs(rng, prompt=f"task {i}")
        expected = local.infer(obs)["actions"]
        for client in clients:
            result = client.infer(obs)
            np.testing.assert_array_equal(result["actions"], expected)
            assert ("prev_total_ms" in result["server_timing"]) == (i > 0)
    # The balancer put the six connections three and three on the replicas' own ports.
    assert sorted(n for n in cluster.balancer.open_connections.values() if n) == [3, 3]
    # Serve's proxy (what `serve run` users connect to) serves the same application.
    np.testing.assert_array_equal(WebsocketClientPolicy(cluster.proxy, api_key=KEY).infer(obs)["actions"], expected)


def test_every_cluster_process_listens_on_loopback_only(cluster):
    ports = listeners(processes_under(cluster.cluster.temp_dir))
    assert len(ports) >= 6  # GCS, raylet, proxy, and each replica's own servers
    # Serve would open each replica's inter-deployment gRPC port on every interface; see
    # bind_replica_grpc_to_node_ip. The replicas' direct-ingress ports are 127.0.0.1 too.
    assert [p for p in ports if not p.loopback] == []
    assert {port for _host, port in cluster.balancer.targets} <= {p.port for p in ports}


def test_the_proxy_moved_off_a_port_taken_before_it_bound(cluster):
    proxy_port = int(cluster.proxy.rsplit(":", 1)[1])
    assert proxy_port != cluster.taken_port
    assert proxy_port in {p.port for p in listeners(processes_under(cluster.cluster.temp_dir))}
    status, body = healthz(proxy_port, path="/-/healthz")
    assert status == 200, body


def test_api_key_is_checked_by_the_replica(cluster):
    url = cluster.url
    for key in (None, "wrong"):
        with pytest.raises(InvalidStatus) as info:
            WebsocketClientPolicy(url, api_key=key)
        assert info.value.response.status_code == 403
    status, body = healthz(int(url.rsplit(":", 1)[1]))
    assert (status, body.splitlines()[0]) == (200, "OK")


def test_libero_layout_and_bad_requests(cluster):
    url = cluster.proxy
    keymap = load_keymap("libero")
    policy = EchoPolicy(keymap.camera_names, keymap.state_dim, keymap.action_dim)
    client = WebsocketClientPolicy(f"{url}/libero/")
    assert client.get_server_metadata()["keymap"]["name"] == "libero"
    obs = libero_obs(np.random.default_rng(1))
    expected = expected_actions(policy, make_observation(policy.spec, keymap.to_raw(obs)))
    np.testing.assert_array_equal(client.infer(obs)["actions"], expected)
    # A missing key: the reason as a text frame (openpi-client raises it), then 1011.
    bad = dict(obs)
    del bad["observation/state"]
    with pytest.raises(RuntimeError, match="missing state key 'observation/state'"):
        client.infer(bad)
    with pytest.raises(ConnectionClosed) as info:
        client._ws.recv(timeout=10)
    assert info.value.rcvd.code == 1011
    # The policy itself failing, and a text frame: the same error path as the plain server.
    with pytest.raises(RuntimeError, match="policy error: RuntimeError: policy exploded on purpose"):
        WebsocketClientPolicy(f"{url}/libero/").infer(libero_obs(np.random.default_rng(2), "raise"))
    ws, _ = raw_client(f"{url}/libero/")
    ws.send("hello")
    assert "expected a binary msgpack frame" in ws.recv(timeout=10)
    # Above the replica's 1 MiB cap (and below the proxy's 16 MiB): 1009.
    ws, _ = raw_client(f"{url}/libero/")
    with pytest.raises(ConnectionClosed) as info:
        ws.send(openpi_codec.packb({"observation/image": np.zeros(2 << 20, np.uint8)}))
        ws.recv(timeout=10)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009
    np.testing.assert_array_equal(WebsocketClientPolicy(f"{url}/libero/").infer(obs)["actions"], expected)


def test_two_hop_serves_the_same_protocol(cluster):
    url = cluster.proxy
    keymap = load_keymap("droid")
    policy = EchoPolicy(keymap.camera_names, keymap.state_dim, keymap.action_dim)
    client = WebsocketClientPolicy(f"{url}/two-hop/")
    assert client.get_server_metadata()["design"] == "two-hop"
    rng = np.random.default_rng(3)
    for _ in range(3):
        obs = droid_obs(rng)
        expected = expected_actions(policy, make_observation(policy.spec, keymap.to_raw(obs)))
        np.testing.assert_array_equal(client.infer(obs)["actions"], expected)
    # An exception inside the policy replica reaches the client as the policy's own error.
    with pytest.raises(RuntimeError, match="policy error: RuntimeError: policy exploded on purpose"):
        client.infer(droid_obs(rng, "raise"))


def test_a_killed_replica_is_replaced_and_remote_policies_carry_on(cluster, reference):
    from ray import serve

    url = cluster.url
    local, _meta = reference
    rng = np.random.default_rng(4)
    observations = [droid_obs(rng, prompt=f"robot {i}") for i in range(4)]
    expected = [local.infer(obs)["actions"] for obs in observations]
    remotes = [RemotePolicy(url, api_key=KEY, deadline_s=30.0, retries=5, backoff_s=0.1) for _ in observations]
    victim = remotes[0].server_metadata["replica"]
    on_victim = [r.server_metadata["replica"]["id"] == victim["id"] for r in remotes]
    bystander = _client_on(url, lambda r: r != victim)
    survivor = _replica(bystander)
    # openpi-client itself does not reconnect: one of its connections on the victim must just close.
    doomed = _client_on(url, lambda r: r == victim)

    stop = threading.Event()
    counts = [0] * len(remotes)
    failures: list[BaseException] = []

    def drive(i: int) -> None:
        raw = remotes[i].keymap.to_raw(observations[i])
        try:
            while not stop.is_set() and counts[i] < 200:
                np.testing.assert_array_equal(remotes[i].infer(raw)["actions"], expected[i])
                counts[i] += 1
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(remotes))]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: min(counts) >= 2, timeout=60, what="every client to be served")
        os.kill(victim["pid"], signal.SIGKILL)
        served = list(counts)
        # Everyone keeps being answered, those on the dead replica after reconnecting.
        wait_for(
            lambda: all(c >= s + 3 for c, s in zip(counts, served, strict=True)) or failures,
            timeout=60,
            what="progress",
        )
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not failures, failures
    assert [r.reconnects > 0 for r in remotes] == on_victim
    with pytest.raises(ConnectionClosed):
        doomed._ws.send(openpi_codec.packb(observations[0]))
        doomed._ws.recv(timeout=30)
    # A connection on the surviving replica never noticed.
    np.testing.assert_array_equal(bystander.infer(observations[1])["actions"], expected[1])

    def replaced() -> bool:
        try:
            return _replica(WebsocketClientPolicy(url, api_key=KEY))["pid"] not in (victim["pid"], survivor["pid"])
        except (OSError, InvalidStatus, ConnectionClosed):
            return False

    wait_for(replaced, timeout=90, what="Serve to replace the replica")
    deployment = serve.status().applications["droid"].deployments["PolicyReplica"]
    assert deployment.replica_states.get("RUNNING") == 2
    for r in remotes:
        r.close()


def _unmeasured(doc: Any) -> Any:
    """The document without its creation time and measured times (those differ between any two runs)."""
    if isinstance(doc, dict):
        return {k: _unmeasured(v) for k, v in doc.items() if k not in ("created", "timing", "latency_ms")}
    if isinstance(doc, list):
        return [_unmeasured(v) for v in doc]
    return doc


def test_eval_ray_on_three_bags_equals_the_serial_eval(cluster, tmp_path):
    from omni_ros.eval.distributed import evaluate_ray

    bags = [
        str(write_synthetic_bag(tmp_path / f"bag{i}", SyntheticSpec(duration_s=1.0 + 0.4 * i, prompt=f"task {i}")))
        for i in range(3)
    ]
    config = SyntheticSpec().config(every_k_frames=5)
    config.policy = TINY
    serial = evaluate(bags, config, out_dir=tmp_path / "serial", progress=False)
    fanned = evaluate_ray(bags, config, out_dir=tmp_path / "ray", progress=False)
    doc = json.loads((tmp_path / "ray" / "metrics.json").read_text())
    assert validate(doc) == []
    assert [e["bag"] for e in doc["episodes"]] == bags and [e["index"] for e in doc["episodes"]] == [0, 1, 2]
    assert doc["overall"]["evaluated"] > 15 and doc["policy"]["model"].startswith("tiny")
    assert _unmeasured(doc) == _unmeasured(json.loads((tmp_path / "serial" / "metrics.json").read_text()))
    assert _unmeasured(fanned.document) == _unmeasured(serial.document)
    assert (tmp_path / "ray" / "report.html").stat().st_size > 10_000
