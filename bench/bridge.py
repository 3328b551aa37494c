"""Benchmark of the OpenPI WebSocket bridge; prints one JSON document.

    .venv/bin/python bench/bridge.py [--out bench/results/bridge.json] [--openpi OPENPI_CHECKOUT] [--skip-torch]

The server runs in its own process, the clients (the real openpi-client, one
thread each) in this one, over 127.0.0.1. Measured:
  - overhead: a DROID observation (two 224x224x3 uint8 cameras, 7 + 1 state, a
    prompt) through `omni-ros serve`'s server and the droid key map to a
    trivial policy (a constant chunk): round trip, and round trip minus the
    server's reported infer_ms (what the bridge adds around the policy), p50;
  - side by side, when `--openpi` names an openpi checkout: openpi's own
    `src/openpi/serving/websocket_policy_server.py` (loaded from that checkout,
    with its `packages/openpi-client`) serving a zero policy, the same client,
    in rounds that alternate between the two servers so both see the same load;
  - throughput (requests/s) with 1, 4 and 16 concurrent clients, batching off
    and on, trivial policy;
  - with the real `small` preset (random weights): one client vs
    16 clients with batching on (and off), side by side in this run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import SpawnedServer, emit

from omni_ros.observation import ObservationSpec
from omni_ros.policy.base import BasePolicy, PolicyMetadata

CAMERAS = ("base", "left_wrist", "right_wrist")
STATE_DIM = 8
ACTION_DIM = 8
# The droid key map's cameras, and the reply both servers send: a (10, 8) chunk.
DROID_CAMERAS = ("exterior_1_left", "wrist_left")
DROID_CHUNK = (10, 8)


class TrivialPolicy(BasePolicy):
    """A constant (50, 8) chunk, no validation: leaves only the bridge's own cost."""

    def __init__(self) -> None:
        self.spec = ObservationSpec(camera_names=CAMERAS, state_dim=STATE_DIM)
        self.metadata = PolicyMetadata("trivial", "none", CAMERAS, 224, STATE_DIM, ACTION_DIM, 50)
        self._actions = np.zeros((50, ACTION_DIM), np.float32)

    def infer(self, obs: dict[str, Any], *, noise: Any = None) -> dict[str, Any]:
        return {"actions": self._actions}


class DroidZeroPolicy(BasePolicy):
    """A constant chunk for the droid key map's observation: the policy costs nothing, the server is measured."""

    def __init__(self) -> None:
        self.spec = ObservationSpec(camera_names=DROID_CAMERAS, state_dim=8)
        self.metadata = PolicyMetadata("zero", "none", DROID_CAMERAS, 224, 8, DROID_CHUNK[1], DROID_CHUNK[0])
        self._actions = np.zeros(DROID_CHUNK, np.float32)

    def infer(self, obs: dict[str, Any], *, noise: Any = None) -> dict[str, Any]:
        return {"actions": self._actions}


def _droid_server_main(pipe, stop) -> None:
    """What `omni-ros serve --keymap droid` runs once its policy is loaded: PolicyServer on its event loop."""
    import asyncio

    from omni_ros.serving.config import ServeConfig
    from omni_ros.serving.keymap import load_keymap
    from omni_ros.serving.server import PolicyServer

    async def main() -> None:
        server = PolicyServer(DroidZeroPolicy(), ServeConfig(host="127.0.0.1", port=0), load_keymap("droid"))
        await server.start()
        pipe.send(server.port)
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        threading.Thread(target=lambda: (stop.wait(), loop.call_soon_threadsafe(done.set)), daemon=True).start()
        await server.serve_forever(done)

    asyncio.run(main())


def _openpi_server_main(checkout: str, pipe, stop) -> None:
    """openpi's own WebsocketPolicyServer from `checkout` (and its openpi-client), serving a zero policy."""
    import importlib.util
    import socket

    sys.path.insert(0, str(Path(checkout) / "packages" / "openpi-client" / "src"))
    source = Path(checkout) / "src" / "openpi" / "serving" / "websocket_policy_server.py"
    spec = importlib.util.spec_from_file_location("openpi_websocket_policy_server", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    actions = np.zeros(DROID_CHUNK, np.float32)

    class Zero:
        def infer(self, obs: dict) -> dict:
            return {"actions": actions}

    # openpi's server takes a port number; pick a free one (the race with other processes is harmless here).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = module.WebsocketPolicyServer(Zero(), host="127.0.0.1", port=port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _wait_for_port(port)
    pipe.send(port)
    stop.wait()


def _wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"openpi's server did not listen on {port}")


def _droid_observation(rng: np.random.Generator) -> dict[str, Any]:
    return {
        "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/joint_position": rng.normal(size=7),
        "observation/gripper_position": rng.normal(size=1),
        "prompt": "pick up the cup",
    }


def _round(client: Any, obs: dict[str, Any], requests: int) -> dict[str, float]:
    """p50 of the round trip and of the round trip minus the server's infer_ms over `requests` requests."""
    round_trip, overhead = [], []
    for _ in range(requests):
        start = time.perf_counter()
        result = client.infer(obs)
        ms = (time.perf_counter() - start) * 1e3
        round_trip.append(ms)
        overhead.append(ms - result["server_timing"]["infer_ms"])
    return {"round_trip_ms_p50": _pct(round_trip, 50), "overhead_ms_p50": _pct(overhead, 50)}


def side_by_side(openpi: str | None, rounds: int, requests: int) -> dict[str, Any]:
    """The bridge's DROID overhead, and openpi's own server's beside it when a checkout is given."""
    import contextlib

    obs = _droid_observation(np.random.default_rng(0))
    servers = {"omni_ros": SpawnedServer(_droid_server_main, start_timeout_s=120)}
    if openpi:
        servers["openpi"] = SpawnedServer(_openpi_server_main, openpi, start_timeout_s=120)
    per_round: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
    with contextlib.ExitStack() as stack:
        clients = {name: _client(stack.enter_context(server)) for name, server in servers.items()}
        for client in clients.values():
            _round(client, obs, 50)  # warm-up: connection, allocator, branch caches
        names = list(clients)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:  # alternate who goes first
                per_round[name].append(_round(clients[name], obs, requests))
    report: dict[str, Any] = {
        "observation": "droid: 2 x 224x224x3 uint8, joint_position (7), gripper_position (1), prompt",
        "rounds": rounds,
        "requests_per_round": requests,
    }
    for name, results in per_round.items():
        report[name] = {
            key: statistics.median(r[key] for r in results) for key in ("round_trip_ms_p50", "overhead_ms_p50")
        } | {"per_round": results}
    if openpi:
        pairs = zip(per_round["omni_ros"], per_round["openpi"], strict=True)
        ratios = [ours["overhead_ms_p50"] / theirs["overhead_ms_p50"] for ours, theirs in pairs]
        report["overhead_ratio_vs_openpi"] = {"median": statistics.median(ratios), "per_round": ratios}
        report["openpi_checkout"] = str(Path(openpi).resolve())
    else:
        report["openpi"] = {"skipped": "no --openpi checkout given (an openpi clone: src/openpi/serving/...)"}
        print("bench/bridge.py: openpi side by side skipped: pass --openpi PATH_TO_OPENPI_CHECKOUT", file=sys.stderr)
    return report


def _server_main(kind: str, batching: bool, max_batch: int, max_wait_ms: float, threads: int, pipe, stop) -> None:
    from omni_ros.serving.config import BatchingConfig, ServeConfig
    from omni_ros.serving.server import ServerThread

    if kind == "trivial":
        policy = TrivialPolicy()
    else:
        import torch

        torch.set_num_threads(threads)
        from omni_ros.policy.loading import from_preset

        policy = from_preset(kind, camera_names=CAMERAS, state_dim=STATE_DIM, action_dim=ACTION_DIM, seed=0)
    config = ServeConfig(port=0, batching=BatchingConfig(batching, max_batch=max_batch, max_wait_ms=max_wait_ms))
    with ServerThread(policy, config) as server:
        pipe.send(server.port)
        stop.wait()


def server_process(
    kind: str, batching: bool, max_batch: int = 16, max_wait_ms: float = 2.0, threads: int = 2
) -> SpawnedServer:
    return SpawnedServer(_server_main, kind, batching, max_batch, max_wait_ms, threads, start_timeout_s=300)


def _observation(rng: np.random.Generator, prompt: str = "pick up the cup") -> dict[str, Any]:
    return {
        "images": {c: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for c in CAMERAS},
        "state": rng.normal(size=STATE_DIM).astype(np.float32),
        "prompt": prompt,
    }


def _client(url: str):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return WebsocketClientPolicy(url)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def latency(url: str, requests: int, warmup: int = 20) -> dict[str, Any]:
    from openpi_client import msgpack_numpy

    client = _client(url)
    obs = _observation(np.random.default_rng(0))
    for _ in range(warmup):
        client.infer(obs)
    round_trip, server = [], []
    for _ in range(requests):
        start = time.perf_counter()
        result = client.infer(obs)
        round_trip.append((time.perf_counter() - start) * 1e3)
        server.append(result["server_timing"]["infer_ms"])
    return {
        "requests": requests,
        "request_bytes": len(msgpack_numpy.packb(obs)),
        "round_trip_ms": {
            "p50": _pct(round_trip, 50),
            "p95": _pct(round_trip, 95),
            "mean": statistics.fmean(round_trip),
        },
        "server_infer_ms_p50": _pct(server, 50),
    }


def throughput(url: str, clients: int, duration: float, warmup: float = 0.5) -> dict[str, Any]:
    connections = [_client(url) for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)
    counts = [0] * clients
    latencies: list[list[float]] = [[] for _ in range(clients)]
    batch_sizes: list[int] = []
    window = {}

    def run(i: int) -> None:
        obs = _observation(np.random.default_rng(i), prompt=f"client {i}")
        barrier.wait()
        while time.perf_counter() < window["end"]:
            start = time.perf_counter()
            result = connections[i].infer(obs)
            done = time.perf_counter()
            if done > window["start"] and done <= window["end"]:
                counts[i] += 1
                latencies[i].append((done - start) * 1e3)
                batch_sizes.append(int(result["server_timing"].get("batch_size", 1)))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    window["start"] = time.perf_counter() + warmup
    window["end"] = window["start"] + duration
    barrier.wait()
    for t in threads:
        t.join()
    flat = [x for per in latencies for x in per]
    return {
        "clients": clients,
        "requests": sum(counts),
        "requests_per_s": sum(counts) / duration,
        "latency_ms_p50": _pct(flat, 50) if flat else None,
        "mean_batch_size": statistics.fmean(batch_sizes) if batch_sizes else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--requests", type=int, default=300, help="latency samples")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per throughput point (trivial policy)")
    parser.add_argument("--torch-duration", type=float, default=20.0, help="seconds per throughput point (torch)")
    parser.add_argument("--torch-preset", default="small")
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--openpi", help="an openpi checkout: its own server runs side by side with ours")
    parser.add_argument("--rounds", type=int, default=6, help="alternating side-by-side rounds")
    parser.add_argument("--round-requests", type=int, default=300, help="requests per side-by-side round")
    parser.add_argument("--skip-throughput", action="store_true", help="only the side-by-side overhead")
    args = parser.parse_args(argv)

    report: dict[str, Any] = {
        "benchmark": "openpi_bridge",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
    }
    report["droid_overhead"] = side_by_side(args.openpi, args.rounds, args.round_requests)
    if args.skip_throughput:
        emit(report, args.out)
        return 0
    report["observation"] = {"cameras": len(CAMERAS), "image": [224, 224, 3], "state_dim": STATE_DIM}
    with server_process("trivial", batching=False) as url:
        report["overhead"] = latency(url, args.requests)
    report["throughput_trivial"] = []
    for batching in (False, True):
        with server_process("trivial", batching=batching, max_batch=16, max_wait_ms=2.0) as url:
            for clients in (1, 4, 16):
                point = throughput(url, clients, args.duration)
                report["throughput_trivial"].append({"batching": batching, **point})
    if not args.skip_torch:
        preset = args.torch_preset
        torch_report: dict[str, Any] = {"preset": preset, "threads": args.torch_threads, "points": []}
        for batching, clients in ((True, 1), (True, 16), (False, 16)):
            with server_process(preset, batching, max_batch=16, max_wait_ms=10.0, threads=args.torch_threads) as url:
                throughput(url, 1, 1.0, warmup=0.0)  # first inference warms the allocator
                point = throughput(url, clients, args.torch_duration, warmup=1.0)
                torch_report["points"].append({"batching": batching, **point})
        one, sixteen = torch_report["points"][0], torch_report["points"][1]
        torch_report["speedup_16_batched_vs_1"] = sixteen["requests_per_s"] / max(one["requests_per_s"], 1e-9)
        report["throughput_torch"] = torch_report
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
