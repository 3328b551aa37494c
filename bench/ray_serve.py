"""Benchmark of the OpenPI endpoint on Ray Serve against the single-process server; prints one JSON document.

    nice -n 10 .venv/bin/python bench/ray_serve.py [--out bench/results/ray_serve.json] [--requests 300]
        [--duration 15] [--small-duration 40] [--presets tiny small] [--device cpu]

Everything in one run, one local Ray cluster on 127.0.0.1, the same client (the real openpi-client) for
every server, DROID observations (2 x 224x224x3 uint8):
  - overhead: one client's round trip against a trivial policy (a constant chunk) behind the plain
    server (its own process), the fused Serve design (policy in the WebSocket replica) reached as
    `omni-ros serve --ray` serves it (our TCP balancer on the replicas' own ports, Serve's direct ingress)
    and through Serve's proxy (what `serve run` gives), and the two-hop design (ingress ->
    DeploymentHandle -> policy replica) through both; p50 / p95 ms, and p50 minus the plain one;
  - throughput: 16 closed-loop clients for `--duration` s (`--small-duration` for `small`; answers
    completed in that window count) against each preset behind the plain server
    (1 and 2 torch threads) and fused Serve with 1 and 2 replicas (1 thread each) through the balancer,
    batching on everywhere; requests/s, p50 latency and the mean batch size the server reports;
  - replica replacement: one of 2 fused replicas SIGKILLed under load (through the balancer): how long its
    RemotePolicy client waits for its next answer, and how long until Serve's replacement replica answers.
Absolute numbers depend on the machine and its load; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SpawnedServer, emit

from omni_ros.observation import ObservationSpec
from omni_ros.policy.base import BasePolicy, PolicyMetadata

BENCH = Path(__file__).resolve().parent

CAMERAS = ("exterior_1_left", "wrist_left")  # the DROID key map's cameras
TRIVIAL = "ray_serve:trivial_policy"  # imported by the replicas (bench/ is on their PYTHONPATH)


class TrivialPolicy(BasePolicy):
    """A constant (10, 8) chunk, no validation: leaves only the transport's cost."""

    def __init__(self) -> None:
        self.spec = ObservationSpec(camera_names=CAMERAS, state_dim=8)
        self.metadata = PolicyMetadata("trivial", "none", CAMERAS, 224, 8, 8, 10)
        self._actions = np.zeros((10, 8), np.float32)

    def infer(self, obs: dict[str, Any], *, noise: Any = None) -> dict[str, Any]:
        return {"actions": self._actions}


def trivial_policy(**_dims: Any) -> TrivialPolicy:
    return TrivialPolicy()


def _policy_config(preset: str, threads: int, device: str) -> Any:
    from omni_ros.config import PolicyConfig

    return PolicyConfig(preset=preset, num_threads=threads, seed=0, device=device)


# -- the plain server in its own process ----------------------------------------------------------------------


def _plain_main(preset: str | None, threads: int, device: str, pipe, stop) -> None:
    from omni_ros.serving.config import BatchingConfig, ServeConfig
    from omni_ros.serving.keymap import load_keymap
    from omni_ros.serving.policies import load_served_policy
    from omni_ros.serving.server import ServerThread

    keymap = load_keymap("droid")
    policy = trivial_policy() if preset is None else load_served_policy(_policy_config(preset, threads, device), keymap)
    config = ServeConfig(port=0, keymap="droid", batching=BatchingConfig(preset is not None, max_batch=16))
    with ServerThread(policy, config, keymap) as server:
        pipe.send(server.port)
        stop.wait()


def plain_server(preset: str | None = None, threads: int = 1, device: str = "cpu") -> SpawnedServer:
    """The single-process server in its own process (the trivial policy when `preset` is None)."""
    return SpawnedServer(_plain_main, preset, threads, device)


# -- clients ------------------------------------------------------------------------------------------------


def _client(url: str):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return WebsocketClientPolicy(url)


def _obs(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/joint_position": rng.normal(size=7),
        "observation/gripper_position": rng.uniform(size=1),
        "prompt": "pick up the cup",
    }


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values), q)), 3)


def overhead(url: str, requests: int, warmup: int = 30) -> dict[str, Any]:
    client = _client(url)
    obs = _obs()
    for _ in range(warmup):
        client.infer(obs)
    times = []
    for _ in range(requests):
        start = time.perf_counter()
        client.infer(obs)
        times.append((time.perf_counter() - start) * 1e3)
    return {"requests": requests, "p50_ms": _pct(times, 50), "p95_ms": _pct(times, 95)}


def throughput(url: str, clients: int, duration_s: float, warmup_s: float = 3.0) -> dict[str, Any]:
    connections = [_client(url) for _ in range(clients)]
    stop_at = time.monotonic() + warmup_s + duration_s
    measure_from = time.monotonic() + warmup_s
    latencies: list[float] = []
    batches: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        obs = _obs(i)
        while time.monotonic() < stop_at:
            start = time.monotonic()
            try:
                result = connections[i].infer(obs)
            except Exception as exc:  # counted, and the client stops
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            # Answers completed inside the window count (a slow batch may have started before it).
            if measure_from <= time.monotonic() <= stop_at:
                with lock:
                    latencies.append((time.monotonic() - start) * 1e3)
                    batches.append(int(result["server_timing"].get("batch_size", 1)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        "clients": clients,
        "requests_per_s": round(len(latencies) / duration_s, 2),
        "p50_ms": _pct(latencies, 50) if latencies else None,
        "mean_batch": round(statistics.fmean(batches), 2) if batches else None,
        "errors": len(errors),
    }


# -- Serve ---------------------------------------------------------------------------------------------------


def _deploy(name: str, spec: Any) -> Any:
    """Deploy `spec` at /`name` and start a balancer on its replicas' own ports (stop it after use)."""
    from ray import serve

    from omni_ros.serving.balancer import TcpBalancer
    from omni_ros.serving.ray_serve import application, replica_targets

    start = time.monotonic()
    serve.run(application(spec), name=name, route_prefix=f"/{name}")
    balancer = TcpBalancer("127.0.0.1", 0, replica_targets(name, f"/{name}")).start(wait_for_targets_s=30)
    print(f"[bench] {name}: deployed in {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)
    return balancer


def replacement(url: str) -> dict[str, Any]:
    """SIGKILL the replica a RemotePolicy client is on, while it runs; time its outage and the replacement."""
    from omni_ros.backends.remote import RemotePolicy

    remote = RemotePolicy(url, deadline_s=60.0, retries=10, backoff_s=0.05)
    victim = remote.server_metadata["replica"]["pid"]
    before = {victim}
    for _ in range(30):  # the other replica's pid, so the replacement can be told from it
        before.add(_client(url).get_server_metadata()["replica"]["pid"])
        if len(before) == 2:
            break
    raw = remote.keymap.to_raw(_obs())
    for _ in range(3):
        remote.infer(raw)
    answers: list[float] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            remote.infer(raw)
            answers.append(time.monotonic())

    worker = threading.Thread(target=loop)
    worker.start()
    time.sleep(0.5)
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    new_pid = None
    while new_pid is None and time.monotonic() - killed < 120:
        try:
            pid = _client(url).get_server_metadata()["replica"]["pid"]
        except Exception:
            pid = None
        if pid is not None and pid not in before:
            new_pid = pid
        else:
            time.sleep(0.2)
    replaced = time.monotonic()
    stop.set()
    worker.join(60)
    after = [t for t in answers if t > killed]
    return {
        "client_outage_s": round(after[0] - killed, 3) if after else None,
        "client_reconnects": remote.reconnects,
        "replacement_answers_s": round(replaced - killed, 3) if new_pid else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the JSON here (e.g. bench/results/ray_serve.json)")
    parser.add_argument("--requests", type=int, default=300, help="overhead: requests per server")
    parser.add_argument("--duration", type=float, default=15.0, help="throughput: seconds per configuration")
    parser.add_argument("--small-duration", type=float, default=40.0, help="the same for the slow `small` preset")
    parser.add_argument("--clients", type=int, default=16, help="throughput: concurrent clients")
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"], help="policies for throughput")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (one GPU per replica with cuda)")
    args = parser.parse_args()

    from omni_ros.cluster import DIRECT_INGRESS_ENV, LocalCluster, free_port
    from omni_ros.serving.config import BatchingConfig, ServeConfig
    from omni_ros.serving.ray_serve import RaySpec

    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_1min_at_start": round(os.getloadavg()[0], 2),
        },
        "observation": "DROID, 2 x 224x224x3 uint8 + 8 floats + prompt",
    }
    gpu = 1.0 if args.device.startswith("cuda") else 0.0
    path = os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path, **DIRECT_INGRESS_ENV}
    cluster = LocalCluster(num_cpus=max(4, os.cpu_count() or 1), env=env, log_to_driver=False)
    cluster.start()
    try:
        port = free_port()
        cluster.start_serve(port)
        base = f"ws://127.0.0.1:{port}"
        from ray import serve

        # 1. Per-request overhead, trivial policy, one client, the three servers side by side.
        trivial = {"serve": ServeConfig(keymap="droid"), "policy_factory": TRIVIAL, "num_cpus": 0}
        fused = _deploy("fused", RaySpec(**trivial))
        two_hop = _deploy("two-hop", RaySpec(**trivial, design="two-hop"))
        with plain_server() as plain_url:
            rows = {
                "plain": overhead(plain_url, args.requests),
                "fused": overhead(f"ws://127.0.0.1:{fused.port}/fused/", args.requests),
                "fused_via_proxy": overhead(f"{base}/fused/", args.requests),
                "two_hop": overhead(f"ws://127.0.0.1:{two_hop.port}/two-hop/", args.requests),
                "two_hop_via_proxy": overhead(f"{base}/two-hop/", args.requests),
            }
        for name in rows:
            if name != "plain":
                rows[name]["over_plain_p50_ms"] = round(rows[name]["p50_ms"] - rows["plain"]["p50_ms"], 3)
        report["overhead"] = rows
        for name, balancer in (("fused", fused), ("two-hop", two_hop)):
            balancer.stop()
            serve.delete(name)
        print(f"[bench] overhead: {rows}", file=sys.stderr, flush=True)

        # 2. Throughput with 16 clients: presets x (plain 1/2 threads, fused 1/2 replicas), batching on.
        report["throughput"] = {}
        for preset in args.presets:
            rows = {}
            duration = args.small_duration if preset == "small" else args.duration
            warmup = duration / 3
            for threads in (1, 2):
                with plain_server(preset, threads, args.device) as plain_url:
                    rows[f"plain_{threads}_thread"] = throughput(plain_url, args.clients, duration, warmup)
            for replicas in (1, 2):
                spec = RaySpec(
                    serve=ServeConfig(keymap="droid", batching=BatchingConfig(True, max_batch=16)),
                    policy=_policy_config(preset, 1, args.device),
                    replicas=replicas,
                    num_cpus=1,
                    num_gpus=gpu,
                )
                name = f"{preset}-{replicas}"
                balancer = _deploy(name, spec)
                url = f"ws://127.0.0.1:{balancer.port}/{name}/"
                rows[f"fused_{replicas}_replica"] = throughput(url, args.clients, duration, warmup)
                if preset == args.presets[0] and replicas == 2:
                    report["replacement"] = replacement(url)
                balancer.stop()
                serve.delete(name)
            report["throughput"][preset] = rows
            print(f"[bench] {preset}: {rows}", file=sys.stderr, flush=True)
    finally:
        cluster.stop()
    report["machine"]["load_1min_at_end"] = round(os.getloadavg()[0], 2)
    report["leftover_processes"] = len(cluster.leftovers)
    emit(report, args.out)


if __name__ == "__main__":
    main()
