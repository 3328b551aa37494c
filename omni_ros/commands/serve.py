"""`omni-ros serve`: the configured policy behind an OpenPI-compatible WebSocket server."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from omni_ros.commands.common import add_config_args, config_from_args
from omni_ros.config import ConfigError


def _load_policy(args: argparse.Namespace, config: Any, keymap: Any) -> Any:
    dims: dict[str, Any] = {}
    if keymap is not None:
        dims = {"camera_names": keymap.camera_names, "state_dim": keymap.state_dim, "action_dim": keymap.action_dim}
    if args.policy_factory:
        module_name, _, attr = args.policy_factory.partition(":")
        if not attr:
            raise ConfigError(f"--policy-factory: expected MODULE:CALLABLE, got {args.policy_factory!r}")
        factory = getattr(importlib.import_module(module_name), attr)
        return factory(**dims)
    from omni_ros.policy.factory import load_policy

    return load_policy(config.policy, **dims)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from omni_ros.serving.keymap import CANONICAL, load_keymap
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

    keymap = None if serve.keymap == CANONICAL else load_keymap(serve.keymap)
    policy = _load_policy(args, config, keymap)
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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the policy over an OpenPI-compatible WebSocket (openpi-client can drive it)",
        description="Serve the configured policy to OpenPI clients; `-vv` logs one line per request.",
    )
    add_config_args(p, sim=False)
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
    p.set_defaults(func=run)
