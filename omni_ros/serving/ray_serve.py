"""The OpenPI endpoint as a Ray Serve application: replicas, placement, restarts and scaling from Ray.

    serve run omni_ros.serving.ray_serve:build replicas=2 config=config/default.yaml keymap=droid
    omni-ros serve --ray --replicas 2          # the same, on a local cluster it starts and stops

Two designs (DESIGN.md section 12 has the measurements):

- "fused" (default): the policy lives in the WebSocket replica. Each connection goes to one replica for
  its whole life (through our TCP balancer on the replicas' own ports with Serve's direct ingress, as
  `omni-ros serve --ray` runs it, or through Serve's proxy), where `PolicyService` (the same code as
  `omni-ros serve`: key maps, codec, error frames, size cap, API key, `Batcher`) speaks the protocol over
  Starlette's WebSocket.
  Per-robot state can live in the replica; when a replica dies, its connections close and the clients
  reconnect (RemotePolicy does so by itself) to another one. Replicas = GPUs.
- "two-hop": an ingress deployment speaks the protocol and batches, and sends each batch through a
  DeploymentHandle to a policy deployment, retrying on another replica when one dies, so a stateless
  policy gets per-request failover at the price of one more hop.

Every WebSocket holds one of its replica's `max_ongoing_requests` slots for its life, hence
`max_connections`. The size cap is checked here on each message; Serve's proxy (uvicorn) refuses
messages above 16 MiB before they reach a replica.

No `from __future__ import annotations` in this module: FastAPI reads the route signatures' annotations
at import, and with string annotations it does not see `WebSocket` and closes every connection (1008).
"""

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from fastapi import FastAPI, WebSocket
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.responses import PlainTextResponse

from omni_ros import cpu_threads
from omni_ros.config import ConfigError, OmniConfig, PolicyConfig, load_config
from omni_ros.observation import ObservationSpec
from omni_ros.policy.base import BasePolicy, PolicyMetadata
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.keymap import CANONICAL, KeyMap, load_keymap
from omni_ros.serving.policies import load_served_policy
from omni_ros.serving.service import PolicyService
from omni_ros.serving.transport import CloseCode, TransportClosed

logger = logging.getLogger("omni_ros.serve")

DESIGNS = ("fused", "two-hop")
APP_NAME = "omni_ros"


@dataclass
class RaySpec:
    """What every replica needs to build its part, and how many of them to run where."""

    serve: ServeConfig = field(default_factory=ServeConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # MODULE:CALLABLE returning the policy (camera_names=, state_dim=, action_dim= from the key map).
    policy_factory: str | None = None
    design: str = "fused"
    replicas: int = 1
    # Per replica: CPUs and GPUs Ray reserves (fractions allowed), and connections it takes at once.
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_connections: int = 256
    # Two-hop: ingress replicas, and how often a request is retried on another policy replica.
    ingress_replicas: int = 1
    retries: int = 3
    # On shutdown, how long Serve lets open connections finish before it stops a replica.
    graceful_shutdown_s: float = 5.0

    def __post_init__(self) -> None:
        if self.design not in DESIGNS:
            raise ConfigError(f"design: expected one of {list(DESIGNS)}, got {self.design!r}")
        if self.replicas < 1 or self.ingress_replicas < 1:
            raise ConfigError(f"replicas: must be >= 1, got {self.replicas} / {self.ingress_replicas}")
        if self.max_connections < 1:
            raise ConfigError(f"max_connections: must be >= 1, got {self.max_connections}")
        if self.num_cpus < 0 or self.num_gpus < 0 or self.retries < 0 or self.graceful_shutdown_s < 0:
            raise ConfigError("num_cpus, num_gpus, retries and graceful_shutdown_s must be >= 0")

    def keymap(self) -> KeyMap | None:
        return None if self.serve.keymap == CANONICAL else load_keymap(self.serve.keymap)


# -- the WebSocket side --------------------------------------------------------------------------------------


class StarletteTransport:
    """Starlette's WebSocket as a `Transport`, with the size cap and a reader that notices a departure.

    A background task reads the ASGI messages, so `wait_closed` returns when the client leaves even while
    no `recv` is pending (as the websockets library does), which lets an abandoned inference be dropped.
    """

    _CLOSED = object()

    def __init__(self, websocket: WebSocket, max_message_bytes: int) -> None:
        self._ws = websocket
        self._max = max_message_bytes
        client = websocket.client
        self.peer = f"{client.host}:{client.port}" if client else "unknown"
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._closed = asyncio.Event()
        self._reader: asyncio.Task | None = None

    async def accept(self) -> None:
        await self._ws.accept()
        self._reader = asyncio.get_running_loop().create_task(self._read(), name=f"omni-ws-read {self.peer}")

    async def _read(self) -> None:
        try:
            while True:
                message = await self._ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                data = message.get("bytes")
                if data is None:
                    data = message.get("text")
                if data is None:
                    continue
                if len(data) > self._max:
                    logger.warning("client %s: %d-byte message above the %d-byte cap", self.peer, len(data), self._max)
                    await self.close(CloseCode.MESSAGE_TOO_BIG, f"message above {self._max} bytes")
                    break
                self._inbox.put_nowait(data)
        except Exception as exc:  # the connection broke under the read
            logger.debug("client %s: read ended: %s", self.peer, exc)
        finally:
            self._closed.set()
            self._inbox.put_nowait(self._CLOSED)

    async def recv(self) -> bytes | str:
        item = await self._inbox.get()
        if item is self._CLOSED:
            self._inbox.put_nowait(item)  # every later recv sees the close too
            raise TransportClosed(f"client {self.peer} closed the connection")
        return item

    async def send(self, message: bytes | str) -> None:
        if self._closed.is_set():
            raise TransportClosed(f"client {self.peer} closed the connection")
        try:
            if isinstance(message, bytes):
                await self._ws.send_bytes(message)
            else:
                await self._ws.send_text(message)
        except Exception as exc:  # Starlette raises RuntimeError / WebSocketDisconnect on a closed socket
            raise TransportClosed(str(exc)) from exc

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(Exception):
            await self._ws.close(int(code), reason)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def release(self) -> None:
        """Stop the reader (the handler is done with this connection)."""
        await self.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


async def serve_websocket(service: PolicyService, websocket: WebSocket) -> None:
    """One OpenPI connection: the API key before the handshake, then `service.handle` until it closes."""
    if not service.authorized(websocket.headers):
        client = websocket.client
        logger.warning("rejected %s: missing or wrong API key", f"{client.host}:{client.port}" if client else "?")
        # Closing before accepting refuses the handshake (HTTP 403), which openpi-client raises on.
        await websocket.close(CloseCode.POLICY_VIOLATION, "missing or wrong API key")
        return
    service.start_inference()
    transport = StarletteTransport(websocket, service.config.max_message_bytes)
    await transport.accept()
    try:
        await service.handle(transport)
    finally:
        await transport.release()


def _healthz() -> PlainTextResponse:
    return PlainTextResponse("OK\n")


def _replica_metadata(design: str) -> dict[str, Any]:
    """Which replica a connection landed on (logs and tests; per-robot state lives there), and its torch threads."""
    context = serve.get_replica_context()
    threads = cpu_threads.current().to_dict()
    return {"design": design, "replica": {"id": context.replica_tag, "pid": os.getpid(), "threads": threads}}


async def _shutdown(service: PolicyService | None) -> None:
    if service is not None:
        await service.drain(service.config.drain_timeout_s)
        await service.stop_inference()


def bind_replica_grpc_to_node_ip() -> None:
    """Make this replica's inter-deployment gRPC server listen on the node's IP instead of every interface.

    Ray Serve 2.60 starts that server in each replica, after the deployment's constructor, on `[::]:0`
    (hard-coded in `ray/serve/_private/replica.py`), so a cluster on 127.0.0.1 would still open a port on
    all interfaces. Routers reach it at the replica's node IP (what Serve records for the replica), so
    binding exactly there changes nothing for Ray and keeps a local cluster on loopback. Called first in
    every deployment's constructor, which runs in the replica process before that server starts; a Ray
    without the hook point is left alone (and `test_ray_serve` fails on the open port).
    """
    import ray
    from ray.serve._private import replica as serve_replica

    add_port = getattr(serve_replica, "add_port_to_grpc_server", None)
    if add_port is None or getattr(add_port, "omni_ros_node_ip", None):
        return
    node_ip = ray.util.get_node_ip_address()
    host = f"[{node_ip}]" if ":" in node_ip else node_ip

    def add_port_on_node_ip(server: Any, address: str) -> int:
        if address.startswith("[::]:"):
            address = f"{host}:{address.rsplit(':', 1)[1]}"
        return add_port(server, address)

    add_port_on_node_ip.omni_ros_node_ip = node_ip  # type: ignore[attr-defined]
    serve_replica.add_port_to_grpc_server = add_port_on_node_ip


# -- fused: the policy in the WebSocket replica ---------------------------------------------------------------

fused_app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


@serve.deployment(name="PolicyReplica")
@serve.ingress(fused_app)
class PolicyReplica:
    """A WebSocket replica that holds the policy."""

    def __init__(self, spec: RaySpec) -> None:
        bind_replica_grpc_to_node_ip()
        # A replica is a process of its own: the policy's thread settings, before it loads torch.
        cpu_threads.configure(spec.policy)
        keymap = spec.keymap()
        policy = load_served_policy(spec.policy, keymap, spec.policy_factory)
        self.service = PolicyService(policy, spec.serve, keymap, extra_metadata=_replica_metadata("fused"))
        logger.info("replica %s serves %s", self.service.metadata["replica"]["id"], policy.metadata.model)

    @fused_app.get("/healthz")
    def healthz(self) -> PlainTextResponse:
        return PlainTextResponse(self.service.health_text())

    @fused_app.websocket("/")
    async def connect(self, websocket: WebSocket) -> None:
        await serve_websocket(self.service, websocket)

    def metadata(self) -> dict[str, Any]:
        return self.service.metadata

    async def __del__(self) -> None:
        await _shutdown(getattr(self, "service", None))


# -- two-hop: ingress -> policy deployment --------------------------------------------------------------------


@serve.deployment(name="PolicyWorker")
class PolicyWorker:
    """The policy behind the two-hop ingress: plain method calls, no protocol."""

    def __init__(self, spec: RaySpec) -> None:
        bind_replica_grpc_to_node_ip()
        cpu_threads.configure(spec.policy)
        self.policy = load_served_policy(spec.policy, spec.keymap(), spec.policy_factory)

    def describe(self) -> tuple[ObservationSpec, PolicyMetadata]:
        return self.policy.spec, self.policy.metadata

    def infer(self, raw: dict[str, Any], noise: Any = None) -> dict[str, Any]:
        return self.policy.infer(raw, noise=noise)

    def infer_batch(self, observations: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.policy.infer_batch(observations)


class DeploymentPolicy(BasePolicy):
    """A Policy whose calls go through a DeploymentHandle, retried on another replica when one dies.

    Called from the service's inference threads (never its event loop), so `.result()` may block.
    """

    def __init__(self, handle: DeploymentHandle, spec: ObservationSpec, metadata: PolicyMetadata, retries: int):
        self.handle, self.spec, self.metadata, self.retries = handle, spec, metadata, retries
        self.retried = 0

    def infer(self, obs: Mapping[str, Any], *, noise: Any = None) -> dict[str, Any]:
        return self._call("infer", dict(obs), noise)

    def infer_batch(self, observations: Sequence[Mapping[str, Any]], *, noise: Any = None) -> list[dict[str, Any]]:
        if noise is not None:
            return super().infer_batch(observations, noise=noise)
        return self._call("infer_batch", [dict(o) for o in observations])

    def _call(self, method: str, *args: Any) -> Any:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

        attempt = 0
        while True:
            try:
                return getattr(self.handle, method).remote(*args).result()
            except RayTaskError as exc:
                # The policy itself raised: its own exception, so a bad observation is the client's error.
                raise (exc.cause if isinstance(exc.cause, Exception) else exc) from None
            except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
                attempt += 1
                if attempt > self.retries:
                    raise
                self.retried += 1
                logger.warning("policy replica lost (%s); retry %d of %d", type(exc).__name__, attempt, self.retries)


two_hop_app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


@serve.deployment(name="OpenPIIngress")
@serve.ingress(two_hop_app)
class OpenPIIngress:
    """Speaks the protocol (and batches) for the PolicyWorker replicas behind it."""

    def __init__(self, spec: RaySpec, worker: DeploymentHandle) -> None:
        bind_replica_grpc_to_node_ip()
        self.spec, self.worker = spec, worker
        self.service: PolicyService | None = None
        self._lock = asyncio.Lock()

    async def _service(self) -> PolicyService:
        async with self._lock:
            if self.service is None:
                policy_spec, metadata = await self.worker.describe.remote()
                policy = DeploymentPolicy(self.worker, policy_spec, metadata, self.spec.retries)
                extra = _replica_metadata("two-hop")
                self.service = PolicyService(policy, self.spec.serve, self.spec.keymap(), extra_metadata=extra)
            return self.service

    @two_hop_app.get("/healthz")
    def healthz(self) -> PlainTextResponse:
        return _healthz()

    @two_hop_app.websocket("/")
    async def connect(self, websocket: WebSocket) -> None:
        await serve_websocket(await self._service(), websocket)

    async def metadata(self) -> dict[str, Any]:
        return (await self._service()).metadata

    async def __del__(self) -> None:
        await _shutdown(self.service)


# -- the application -----------------------------------------------------------------------------------------


def application(spec: RaySpec) -> serve.Application:
    """The Serve application for `spec` (bind it with `serve.run(..., route_prefix="/")`)."""
    options: dict[str, Any] = {
        "logging_config": {"log_level": "WARNING", "enable_access_log": False},
        "max_ongoing_requests": spec.max_connections,
        "graceful_shutdown_timeout_s": spec.graceful_shutdown_s,
        "graceful_shutdown_wait_loop_s": 0.2,
        "health_check_period_s": 2.0,
    }
    actor = {"num_cpus": spec.num_cpus, "num_gpus": spec.num_gpus}
    # @serve.deployment made the classes Deployments; mypy does not apply class decorators (python/mypy#3135).
    replica, worker_deployment, ingress_deployment = (
        cast(serve.Deployment, c) for c in (PolicyReplica, PolicyWorker, OpenPIIngress)
    )
    if spec.design == "fused":
        return replica.options(num_replicas=spec.replicas, ray_actor_options=actor, **options).bind(spec)
    worker = worker_deployment.options(num_replicas=spec.replicas, ray_actor_options=actor, **options).bind(spec)
    ingress = ingress_deployment.options(
        num_replicas=spec.ingress_replicas, ray_actor_options={"num_cpus": 0}, **options
    ).bind(spec, worker)
    return ingress


# `serve run omni_ros.serving.ray_serve:build key=value ...` (or `args:` of a Serve YAML config).
BUILD_ARGS = {
    "config": "omni_ros YAML config (serve: and policy: sections; default config/default.yaml)",
    "replicas": "replicas of the policy (fused: WebSocket replicas; two-hop: policy replicas)",
    "design": "fused (default) or two-hop",
    "keymap": "openpi key layout: droid, libero, aloha, canonical, or a YAML path",
    "api_key": "require Authorization: Api-Key KEY (default: serve.api_key / $OMNI_ROS_API_KEY on the replicas)",
    "batching": "true/false: dynamic batching in each replica",
    "max_batch": "largest batch when batching",
    "policy_factory": "MODULE:CALLABLE returning the policy instead of config.policy",
    "num_cpus": "CPUs reserved per replica",
    "num_gpus": "GPUs reserved per replica (1: one replica per GPU)",
    "max_connections": "WebSocket connections one replica takes at once",
    "ingress_replicas": "two-hop: ingress replicas",
    "retries": "two-hop: retries of a request on another policy replica",
}


def spec_from_args(args: Mapping[str, Any]) -> RaySpec:
    """A RaySpec from `serve run` key=value arguments (strings) or a YAML config's `args:` (any types)."""
    unknown = sorted(set(args) - set(BUILD_ARGS))
    if unknown:
        known = ", ".join(sorted(BUILD_ARGS))
        raise ConfigError(f"unknown argument(s) {unknown} for omni_ros.serving.ray_serve:build; known: {known}")
    config = load_config(args["config"]) if args.get("config") else load_config(None)
    return spec_from_config(config, args)


def spec_from_config(config: OmniConfig, args: Mapping[str, Any]) -> RaySpec:
    serve_cfg = replace(config.serve, batching=replace(config.serve.batching))
    if args.get("keymap") is not None:
        serve_cfg.keymap = str(args["keymap"])
    if args.get("api_key") is not None:
        serve_cfg.api_key = str(args["api_key"])
    if args.get("batching") is not None:
        serve_cfg.batching.enabled = _bool(args["batching"], "batching")
    if args.get("max_batch") is not None:
        serve_cfg.batching.max_batch = int(args["max_batch"])
    numbers = {"replicas": int, "num_cpus": float, "num_gpus": float, "max_connections": int}
    numbers.update(ingress_replicas=int, retries=int)
    kwargs: dict[str, Any] = {k: cast(args[k]) for k, cast in numbers.items() if args.get(k) is not None}
    if args.get("design") is not None:
        kwargs["design"] = str(args["design"])
    return RaySpec(serve=serve_cfg, policy=config.policy, policy_factory=args.get("policy_factory") or None, **kwargs)


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def deploy(spec: RaySpec, url: str) -> dict[str, Any]:
    """Run the application on the connected cluster's Serve at route "/", then read its metadata frame from
    `url` as a client would (which checks the endpoint end to end)."""
    from websockets.sync.client import connect

    from omni_ros.serving.msgpack_numpy import unpackb
    from omni_ros.serving.service import resolve_api_key

    serve.run(application(spec), name=APP_NAME, route_prefix="/")
    key = resolve_api_key(spec.serve)
    headers = {"Authorization": f"Api-Key {key}"} if key else None
    with connect(url, additional_headers=headers, compression=None, max_size=None, proxy=None) as ws:
        return unpackb(cast(bytes, ws.recv(timeout=60)))  # the metadata frame is binary (msgpack)


def replica_targets(app_name: str = APP_NAME, route_prefix: str = "/") -> Callable[[], list[tuple[str, int]]]:
    """Where `app_name`'s ingress replicas serve their own HTTP/WebSocket port (Serve's direct ingress).

    Read from the Serve controller's target groups (what an L4 balancer in front of Serve is meant to
    follow). While the application has no running replica, or direct ingress is off, Serve lists its proxy
    instead, so a balancer fed by this keeps working, over the proxy's slower path.
    """
    import ray
    from ray.serve._private.common import RequestProtocol
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)

    def read() -> list[tuple[str, int]]:
        groups: list[Any] = ray.get(controller.get_target_groups.remote(app_name), timeout=5.0)
        http = [g for g in groups if g.protocol == RequestProtocol.HTTP]
        mine = [g for g in http if g.app_name == app_name and g.route_prefix == route_prefix]
        return [(t.ip, t.port) for g in (mine or http) for t in g.targets]

    return read


def build(args: dict[str, Any]) -> serve.Application:
    """Serve's application builder: `serve run omni_ros.serving.ray_serve:build replicas=2 keymap=droid`."""
    return application(spec_from_args(args))
