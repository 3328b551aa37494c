"""Dynamic batching: concurrent clients get exactly what they would get alone, and one bad request fails alone."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from helpers.bridge_policies import expected_actions
from helpers.bridge_util import droid_obs, echo_server, wait_for
from omni_ros.observation import make_observation
from omni_ros.serving.config import BatchingConfig

# openpi_client opens its connection the way websockets >= 16 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _run_concurrently(clients, observations) -> dict[int, object]:
    results: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            results[i] = clients[i].infer(observations[i])
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    return results, threads


@pytest.mark.parametrize("n", [4, 9])
def test_queued_requests_form_one_batch_with_unbatched_results(n):
    # max_batch 8: nine queued requests become a batch of 8 and one of 1.
    server, policy, keymap = echo_server("droid", batching=BatchingConfig(True, max_batch=8, max_wait_ms=5))
    with server:
        gatekeeper = WebsocketClientPolicy(server.url)
        clients = [WebsocketClientPolicy(server.url) for _ in range(n)]
        observations = [droid_obs(np.random.default_rng(i), prompt=f"client {i}") for i in range(n)]
        # The gated request occupies the policy while the others queue up behind it.
        gate_result = {}
        gate_thread = threading.Thread(
            target=lambda: gate_result.update(r=gatekeeper.infer(droid_obs(np.random.default_rng(99), "gate")))
        )
        gate_thread.start()
        assert policy.entered.wait(10)
        results, threads = _run_concurrently(clients, observations)
        wait_for(lambda: server.server.batcher.pending == n, what="all requests to queue")
        policy.gate.set()
        for t in [gate_thread, *threads]:
            t.join(30)
    assert sorted(policy.batch_sizes) == sorted([1, *([min(n, 8)] if n <= 8 else [8, n - 8])])
    for i, obs in enumerate(observations):
        alone = expected_actions(policy, make_observation(policy.spec, keymap.to_raw(obs)))
        np.testing.assert_array_equal(results[i]["actions"], alone)
        timing = results[i]["server_timing"]
        assert timing["batch_size"] in (8, n, n - 8)
        assert timing["queue_ms"] >= 0


def test_batched_equals_unbatched_server():
    observations = [droid_obs(np.random.default_rng(i), prompt=f"p{i % 3}") for i in range(6)]
    outputs = {}
    for enabled in (False, True):
        server, policy, _keymap = echo_server(
            "droid", batching=BatchingConfig(enabled, max_batch=6, max_wait_ms=20_000)
        )
        with server:
            clients = [WebsocketClientPolicy(server.url) for _ in observations]
            results, threads = _run_concurrently(clients, observations)
            for t in threads:
                t.join(30)
        outputs[enabled] = [results[i]["actions"] for i in range(len(observations))]
        if enabled:
            # Six connected clients, six requests: one batch, dispatched when the last one queued.
            assert policy.batch_sizes == [6], policy.batch_sizes
    for unbatched, batched in zip(outputs[False], outputs[True], strict=True):
        np.testing.assert_array_equal(unbatched, batched)


def test_one_bad_request_fails_alone():
    server, policy, keymap = echo_server("droid", batching=BatchingConfig(True, max_batch=8, max_wait_ms=5))
    with server:
        gatekeeper = WebsocketClientPolicy(server.url)
        clients = [WebsocketClientPolicy(server.url) for _ in range(4)]
        observations = [droid_obs(np.random.default_rng(i), prompt=f"client {i}") for i in range(4)]
        # Passes the key map, fails make_observation inside infer_batch.
        observations[2]["observation/joint_position"] = np.full(7, np.inf)
        observations[3]["prompt"] = "raise"
        gate_thread = threading.Thread(target=lambda: gatekeeper.infer(droid_obs(np.random.default_rng(9), "gate")))
        gate_thread.start()
        assert policy.entered.wait(10)
        results, threads = _run_concurrently(clients, observations)
        wait_for(lambda: server.server.batcher.pending == 4, what="all requests to queue")
        policy.gate.set()
        for t in [gate_thread, *threads]:
            t.join(30)
        assert isinstance(results[2], RuntimeError) and "non-finite" in str(results[2])
        assert isinstance(results[3], RuntimeError) and "policy exploded" in str(results[3])
        for i in (0, 1):
            alone = expected_actions(policy, make_observation(policy.spec, keymap.to_raw(observations[i])))
            np.testing.assert_array_equal(results[i]["actions"], alone)
        # The server still batches for everyone else afterwards.
        assert WebsocketClientPolicy(server.url).infer(droid_obs(np.random.default_rng(5)))["actions"].shape == (10, 8)


def test_batching_config_is_checked():
    from omni_ros.serving.batching import Batcher

    with pytest.raises(ValueError, match="max_batch"):
        Batcher(lambda o: o, lambda b: b, None, max_batch=0)


def test_a_lone_client_does_not_wait_for_company():
    from omni_ros.backends.remote import RemotePolicy

    # A minute-long max wait would blow the 10 s deadline if the batcher waited with nobody else connected.
    server, policy, keymap = echo_server("droid", batching=BatchingConfig(True, max_batch=8, max_wait_ms=60_000))
    with server:
        remote = RemotePolicy(server.url, deadline_s=10.0)
        raw = keymap.to_raw(droid_obs(np.random.default_rng(0)))
        for _ in range(3):
            np.testing.assert_array_equal(
                remote.infer(raw)["actions"], expected_actions(policy, make_observation(policy.spec, raw))
            )
        assert policy.batch_sizes == [1, 1, 1]


def test_a_batch_waits_for_a_client_whose_reply_is_still_on_its_way():
    # Two clients. The gated request runs while the other one queues; once the gate opens, the gated client's
    # next request is on its way. "Everyone connected has a request queued" must be judged on the queue itself:
    # counting the answered client as busy (its handler has not finished sending) dispatched the queued request
    # alone, one step before its companion arrived.
    server, policy, _keymap = echo_server("droid", batching=BatchingConfig(True, max_batch=8, max_wait_ms=20_000))
    with server:
        gated = WebsocketClientPolicy(server.url)
        results: dict[str, object] = {}

        def gated_client() -> None:
            results["gate"] = gated.infer(droid_obs(np.random.default_rng(1), "gate"))
            results["next"] = gated.infer(droid_obs(np.random.default_rng(2), "next"))

        thread = threading.Thread(target=gated_client)
        thread.start()
        assert policy.entered.wait(10)  # alone on the server, so dispatched at once
        other = WebsocketClientPolicy(server.url)
        queued = threading.Thread(target=lambda: results.update(other=other.infer(droid_obs(np.random.default_rng(3)))))
        queued.start()
        wait_for(lambda: server.server.batcher.pending == 1, what="the second request to queue")
        policy.gate.set()
        for t in (thread, queued):
            t.join(30)
    assert policy.batch_sizes == [1, 2]
    assert results["other"]["server_timing"]["batch_size"] == 2 and results["next"]["server_timing"]["batch_size"] == 2


def test_clients_in_lockstep_are_always_served_in_full_batches():
    # Eight clients, each sending its next request as soon as it has its reply: after the first batch every
    # batch must hold all eight (a long max wait, so only a premature dispatch can split them).
    n, rounds = 8, 6
    server, policy, keymap = echo_server("droid", batching=BatchingConfig(True, max_batch=n, max_wait_ms=20_000))
    with server:
        clients = [WebsocketClientPolicy(server.url) for _ in range(n)]
        observations = [droid_obs(np.random.default_rng(i), prompt=f"client {i}") for i in range(n)]
        failures: list[BaseException] = []
        barrier = threading.Barrier(n)

        def run(i: int) -> None:
            try:
                barrier.wait(10)
                for _ in range(rounds):
                    result = clients[i].infer(observations[i])
                    alone = expected_actions(policy, make_observation(policy.spec, keymap.to_raw(observations[i])))
                    np.testing.assert_array_equal(result["actions"], alone)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not failures, failures
    assert sum(policy.batch_sizes) == n * rounds
    # The very first requests may straggle in; from then on the clients move together.
    assert policy.batch_sizes[-(rounds - 1) :] == [n] * (rounds - 1), policy.batch_sizes
