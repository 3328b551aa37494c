"""`omni-ros serve`: the configured policy behind an OpenPI-compatible WebSocket server.

With `--ray` the same endpoint runs as a Ray Serve application (omni_ros/serving/ray_serve.py), on a local
cluster this command starts and stops, or on a running cluster given by `--ray-address`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from omni_ros.commands.common import add_config_args, config_from_args
from omni_ros.config import OmniConfig
from omni_ros.typed_config import ConfigError


def run(args: argparse.Namespace) -> int:
    import asyncio

    from omni_ros.serving.keymap import CANONICAL, load_keymap
    from omni_ros.serving.policies import load_served_policy
    from omni_ros.serving.server import PolicyServer

    config = config_from_args(args)
    serve = config.serve
    if args.host is not None:
        serve.host = args.host
    if args.port is not None:
        serve.port = args.port
    if args.keymap is not None:
        serve.keymap = args.keymap
    if args.api_key is not None:
        serve.api_key = args.api_key
    if args.strict_keys is not None:
        serve.strict_keys = args.strict_keys
    if args.tls_cert is not None:
        serve.tls_cert = args.tls_cert
    if args.tls_key is not None:
        serve.tls_key = args.tls_key
    if args.batching is not None:
        serve.batching.enabled = args.batching
    if args.max_batch is not None:
        serve.batching.max_batch = args.max_batch
    if args.max_wait_ms is not None:
        serve.batching.max_wait_ms = args.max_wait_ms

    if args.ray:
        return run_on_ray(args, config)

    keymap = None if serve.keymap == CANONICAL else load_keymap(serve.keymap)
    policy = load_served_policy(config.policy, keymap, args.policy_factory)
    server = PolicyServer(policy, serve, keymap)

    async def main() -> None:
        await server.start()
        http = "https" if server.url.startswith("wss") else "http"
        print(f"omni-ros serve: listening on {server.url} (health: {http}://{serve.host}:{server.port}/healthz)")
        print(json.dumps(server.metadata, indent=2, default=str))
        sys.stdout.flush()
        await server.serve_forever()

    asyncio.run(main())
    print(f"omni-ros serve: stopped after {server.requests_served} requests")
    return 0


def run_on_ray(args: argparse.Namespace, config: OmniConfig) -> int:
    from omni_ros.cluster import DIRECT_INGRESS_ENV, LocalCluster, RemoteCluster, check_ray, free_port

    check_ray("omni-ros serve --ray")
    if args.replicas < 1:
        raise ConfigError(f"--replicas: must be >= 1, got {args.replicas}")
    if config.serve.keymap != "canonical":
        from omni_ros.serving.keymap import load_keymap

        load_keymap(config.serve.keymap)  # a bad name fails here, not in every replica
    serve = config.serve
    if serve.tls_cert or serve.tls_key:
        raise ConfigError(
            "serve.tls_cert / serve.tls_key: wss:// is served by `omni-ros serve` itself; with --ray, terminate TLS "
            "in front of Serve's proxy (a reverse proxy on the same host)"
        )
    if args.ray_address:
        cluster: Any = RemoteCluster(args.ray_address)
    else:
        cpus = max(os.cpu_count() or 1, int(args.replicas * args.num_cpus + 0.999))
        cluster = LocalCluster(num_cpus=cpus, env=DIRECT_INGRESS_ENV)
    # On a local cluster clients connect to our balancer, which splices each connection to a replica's own
    # port (Serve's direct ingress); Serve's proxy listens on a port of its own beside it. On a running
    # cluster (--ray-address) clients connect to Serve's proxy.
    balancer: Any = None

    stop = threading.Event()
    start = time.monotonic()
    try:
        cluster.start()
        # After ray.init, which installs a SIGTERM handler of its own.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        # A local cluster's proxy takes a free port (clients use the balancer); a running cluster's, --port.
        remote_port = (serve.port or free_port(serve.host)) if args.ray_address else None
        proxy_port = cluster.start_serve(remote_port, host=serve.host)
        from omni_ros.serving.ray_serve import RaySpec, deploy, replica_targets

        spec = RaySpec(
            serve=serve,
            policy=config.policy,
            policy_factory=args.policy_factory,
            design=args.design,
            replicas=args.replicas,
            num_cpus=args.num_cpus,
            num_gpus=args.num_gpus,
        )
        proxy_url = f"ws://{serve.host}:{proxy_port}"
        from omni_ros.serving.service import resolve_api_key, warn_if_exposed

        warn_if_exposed(proxy_url, serve.host, resolve_api_key(serve), False, serve.api_key_env)
        metadata = deploy(spec, proxy_url)
        port = proxy_port
        if not args.ray_address:
            from omni_ros.serving.balancer import TcpBalancer

            balancer = TcpBalancer(serve.host, serve.port, replica_targets()).start(wait_for_targets_s=30)
            port = balancer.port
        url = f"ws://{serve.host}:{port}"
        via = f"balanced over the replicas' own ports; Serve's proxy on {proxy_port}" if balancer else "Serve's proxy"
        print(
            f"omni-ros serve: listening on {url} (health: http://{serve.host}:{port}/healthz); Ray Serve, "
            f"{args.replicas} {args.design} replica(s) ({via}), up in {time.monotonic() - start:.1f} s"
        )
        print(json.dumps(metadata, indent=2, default=str))
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the teardown short
        if balancer is not None:
            balancer.stop()
        cluster.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    print("omni-ros serve: stopped (Ray Serve application and cluster shut down)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the policy over an OpenPI-compatible WebSocket (openpi-client can drive it)",
        description="Serve the configured policy to OpenPI clients; `-vv` logs one line per request.",
    )
    add_config_args(p, sim=False, policy=True)
    p.add_argument("--host", help="interface to bind (default from config: 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default from config: 8000; 0 picks a free one)")
    p.add_argument("--keymap", help="openpi key layout: droid, libero, aloha, canonical, or a YAML path")
    p.add_argument(
        "--api-key", help="require `Authorization: Api-Key KEY` (default: serve.api_key / $OMNI_ROS_API_KEY)"
    )
    p.add_argument("--tls-cert", metavar="PEM", help="serve wss:// with this certificate chain (serve.tls_cert)")
    p.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert (serve.tls_key)")
    p.add_argument(
        "--strict-keys",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="refuse observations with keys the key map does not name (default: skip them with one warning, "
        "as openpi does; serve.strict_keys)",
    )
    p.add_argument("--batching", action=argparse.BooleanOptionalAction, default=None, help="dynamic batching")
    p.add_argument("--max-batch", type=int, help="largest batch when batching")
    p.add_argument("--max-wait-ms", type=float, help="how long a request waits for a batch to fill")
    p.add_argument(
        "--policy-factory",
        metavar="MODULE:CALLABLE",
        help="serve the policy returned by CALLABLE(camera_names=, state_dim=, action_dim=) instead of config.policy",
    )
    ray = p.add_argument_group(
        "Ray Serve",
        "With --ray the same endpoint runs as a Ray Serve application (replicas, restarts, placement on a "
        "cluster); without --ray-address on a local Ray cluster on 127.0.0.1 that this command starts and stops, "
        "where --port is a balancer that hands each connection to a replica's own port (Serve's direct ingress; "
        "Serve's proxy listens beside it). Needs the 'ray' extra (pip install 'ray[serve]').",
    )
    ray.add_argument("--ray", action="store_true", help="serve through Ray Serve")
    ray.add_argument("--replicas", type=int, default=1, help="policy replicas (default 1; fused: one per GPU)")
    ray.add_argument(
        "--design",
        choices=("fused", "two-hop"),
        default="fused",
        help="fused: the policy in the WebSocket replica, a connection keeps its replica (default); "
        "two-hop: an ingress replica forwards each request to a policy replica, retried on failure",
    )
    ray.add_argument("--num-cpus", type=float, default=1.0, help="CPUs reserved per replica (default 1)")
    ray.add_argument("--num-gpus", type=float, default=0.0, help="GPUs reserved per replica (default 0)")
    ray.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="deploy on this running Ray cluster (e.g. 10.0.0.5:6379) instead of a local one; "
        "the application is deleted again on exit",
    )
    p.set_defaults(func=run)
