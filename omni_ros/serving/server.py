"""An OpenPI-compatible WebSocket policy server.

Wire protocol (what `openpi_client.WebsocketClientPolicy` expects):
  1. on connect the server sends one binary msgpack frame: the policy metadata;
  2. each binary observation frame gets exactly one binary reply frame: the
     policy output (`actions` (H, D) float32) plus `policy_timing` and
     `server_timing` (`prev_total_ms` from the second request on);
  3. on error the server sends the reason as a text frame (the client raises
     RuntimeError with it) and closes the connection with code 1011;
  4. `GET /healthz` answers 200 `OK`.

Unlike openpi's reference server, inference runs on a thread pool, so the event
loop keeps answering pings, /healthz and other clients during a slow inference;
concurrent requests can be batched; messages are capped (default 16 MiB, not
websockets' 1 MiB); an optional API key is checked in constant time; with a
certificate and key configured it serves wss:// (TLS). Like openpi's policy
transforms, observation keys the key map does not name are skipped (one warning
per connection and key) unless `serve.strict_keys` is set.
"""

from __future__ import annotations

import asyncio
import hmac
import http
import ipaddress
import logging
import os
import signal
import ssl
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from omni_ros import __version__
from omni_ros.config import ConfigError
from omni_ros.observation import ObservationError
from omni_ros.policy.base import Policy
from omni_ros.serving.batching import Batcher, BatchInfo
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.keymap import KeyMap
from omni_ros.serving.msgpack_numpy import DecodeError, packb, unpackb

logger = logging.getLogger("omni_ros.serve")

# Errors caused by what the client sent, reported without a server traceback.
CLIENT_ERRORS = (DecodeError, ObservationError)
# Unknown keys named in warnings per connection; a client inventing keys cannot flood the log.
MAX_WARNED_KEYS = 32


class RequestError(ValueError):
    """The request frame itself is unusable (e.g. a text frame)."""


def resolve_api_key(config: ServeConfig) -> str | None:
    """The key clients must present: `api_key`, else the environment variable `api_key_env`."""
    if config.api_key:
        return config.api_key
    if config.api_key_env:
        return os.environ.get(config.api_key_env) or None
    return None


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine ("" and 0.0.0.0 mean every interface)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it resolves to whatever the network says
        return False


def server_ssl_context(config: ServeConfig) -> ssl.SSLContext | None:
    """The TLS context for wss:// from `tls_cert` / `tls_key`, or None for plain ws://."""
    if not config.tls_cert and not config.tls_key:
        return None
    if not (config.tls_cert and config.tls_key):
        missing = "serve.tls_key" if config.tls_cert else "serve.tls_cert"
        raise ConfigError(f"{missing}: wss:// needs both serve.tls_cert and serve.tls_key (PEM files)")
    for key, path in (("serve.tls_cert", config.tls_cert), ("serve.tls_key", config.tls_key)):
        if not os.path.isfile(path):
            raise ConfigError(f"{key}: file not found: {path}")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"serve.tls_cert / serve.tls_key: cannot load {config.tls_cert} with {config.tls_key}: {exc}"
        ) from exc
    return context


def check_compatible(policy: Policy, keymap: KeyMap) -> None:
    """Fail at start-up, not per request, when the key map cannot feed this policy."""
    spec = policy.spec
    extra = [c for c in keymap.camera_names if c not in spec.camera_names]
    if extra:
        raise ConfigError(
            f"key map '{keymap.name}' has camera(s) {extra} the policy lacks "
            f"(policy cameras: {list(spec.camera_names)})"
        )
    if keymap.state_dim != spec.state_dim:
        raise ConfigError(
            f"key map '{keymap.name}' assembles a {keymap.state_dim}-D state, the policy expects {spec.state_dim}"
        )
    if keymap.action_dim is not None and keymap.action_dim != policy.metadata.action_dim:
        raise ConfigError(
            f"key map '{keymap.name}' expects {keymap.action_dim}-D actions, "
            f"the policy produces {policy.metadata.action_dim}"
        )


class PolicyServer:
    """Serves one policy to any number of OpenPI clients."""

    def __init__(
        self,
        policy: Policy,
        config: ServeConfig | None = None,
        keymap: KeyMap | None = None,
        extra_metadata: dict[str, Any] | None = None,
    ) -> None:
        self.policy = policy
        self.config = config or ServeConfig()
        self.keymap = keymap or KeyMap.canonical(policy.spec)
        check_compatible(policy, self.keymap)
        if self.config.workers < 1:
            raise ConfigError(f"serve.workers: must be >= 1, got {self.config.workers}")
        if self.config.max_message_bytes < 1024:
            raise ConfigError(f"serve.max_message_bytes: must be >= 1024, got {self.config.max_message_bytes}")
        self._api_key = resolve_api_key(self.config)
        self._ssl = server_ssl_context(self.config)
        batching = self.config.batching
        self.metadata: dict[str, Any] = {
            **policy.metadata.to_dict(),
            "server": "omni_ros",
            "server_version": __version__,
            "keymap": self.keymap.describe(),
            "batching": {"enabled": batching.enabled, "max_batch": batching.max_batch},
            "max_message_bytes": self.config.max_message_bytes,
            **(extra_metadata or {}),
        }
        self._metadata_frame = packb(self.metadata)
        self._executor: ThreadPoolExecutor | None = None
        self._batcher: Batcher | None = None
        self._server: Server | None = None
        self._busy: set[ServerConnection] = set()
        self._open = 0  # connections whose handler runs
        self._draining = False
        self.port: int | None = None
        self.requests_served = 0
        # Requests whose client left before the reply (their result was dropped).
        self.abandoned = 0

    @property
    def url(self) -> str:
        return f"{'wss' if self._ssl is not None else 'ws'}://{self.config.host}:{self.port}"

    @property
    def batcher(self) -> Batcher | None:
        return self._batcher

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Bind and start accepting connections (port 0 picks a free port, see `.port`)."""
        self._executor = ThreadPoolExecutor(max_workers=self.config.workers, thread_name_prefix="omni-serve-infer")
        batching = self.config.batching
        if batching.enabled:
            self._batcher = Batcher(
                self.policy.infer,
                self.policy.infer_batch,
                self._executor,
                batching.max_batch,
                batching.max_wait_ms,
                clients=lambda: self._open,
            )
            self._batcher.start()
        self._server = await serve(
            self._handle,
            self.config.host,
            self.config.port,
            process_request=self._process_request,
            ssl=self._ssl,
            compression=None,
            max_size=self.config.max_message_bytes,
            ping_interval=self.config.ping_interval_s or None,
            ping_timeout=self.config.ping_timeout_s or None,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        logger.info("serving %s on %s", self.metadata.get("model"), self.url)
        self._warn_if_exposed()

    def _warn_if_exposed(self) -> None:
        if is_loopback(self.config.host):
            return
        if self._api_key is None:
            bar = "!" * 100
            logger.warning(
                "\n%s\n!! %s listens on a non-loopback address WITHOUT AN API KEY: anyone who can reach this port "
                "can drive the robot's policy.\n!! Set serve.api_key (or $%s, or --api-key), or bind 127.0.0.1.\n%s",
                bar,
                self.url,
                self.config.api_key_env or "OMNI_ROS_API_KEY",
                bar,
            )
        elif self._ssl is None:
            logger.warning(
                "%s: the API key travels in clear text over ws:// on a non-loopback address; "
                "set serve.tls_cert and serve.tls_key for wss://",
                self.url,
            )

    async def stop(self) -> None:
        """Graceful shutdown: stop accepting, let in-flight requests finish, close with 1001."""
        if self._server is None:
            return
        server, self._server = self._server, None
        self._draining = True
        server.close(close_connections=False)
        idle = [c for c in server.connections if c not in self._busy]
        await asyncio.gather(*(c.close(CloseCode.GOING_AWAY, "server shutting down") for c in idle))
        try:
            await asyncio.wait_for(server.wait_closed(), self.config.drain_timeout_s)
        except TimeoutError:
            logger.warning("in-flight requests did not finish within %.1f s; closing", self.config.drain_timeout_s)
            for conn in list(server.connections):
                conn.transport.abort()
        if self._batcher is not None:
            await self._batcher.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        logger.info("server stopped after %d requests", self.requests_served)

    async def serve_forever(self, stop: asyncio.Event | None = None) -> None:
        """Start, run until `stop` is set (or SIGINT/SIGTERM when serving the main thread), then stop."""
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
        try:
            if self._server is None:
                await self.start()
            await stop.wait()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self.stop()

    # -- HTTP side -------------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?", 1)[0] == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if self._api_key is not None:
            given = request.headers.get("Authorization", "")
            expected = f"Api-Key {self._api_key}"
            if not hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8")):
                logger.warning("rejected %s: missing or wrong API key", connection.remote_address)
                response = connection.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong API key\n")
                response.headers["WWW-Authenticate"] = "Api-Key"
                return response
        return None

    # -- one connection ----------------------------------------------------------

    async def _handle(self, conn: ServerConnection) -> None:
        host, port = conn.remote_address[:2]
        peer = f"{host}:{port}"
        logger.info("client %s connected", peer)
        prev_total_ms: float | None = None
        count = 0
        warned: set[str] = set()
        self._open += 1
        try:
            await conn.send(self._metadata_frame)
            while True:
                message = await conn.recv()
                if self._draining:
                    await conn.close(CloseCode.GOING_AWAY, "server shutting down")
                    return
                start = time.monotonic()
                self._busy.add(conn)
                try:
                    reply = await self._serve_one(conn, peer, message, prev_total_ms, warned)
                except ConnectionClosed:
                    raise
                except Exception as exc:
                    await self._send_error(conn, peer, exc)
                    return
                finally:
                    self._busy.discard(conn)
                if reply is None:  # the client went away mid-inference
                    self.abandoned += 1
                    logger.info("client %s left during inference", peer)
                    return
                await conn.send(reply)
                count += 1
                self.requests_served += 1
                prev_total_ms = (time.monotonic() - start) * 1000.0
                logger.debug("client %s request %d: %.1f ms", peer, count, prev_total_ms)
                if self._draining:
                    await conn.close(CloseCode.GOING_AWAY, "server shutting down")
                    return
        except ConnectionClosed:
            pass
        finally:
            self._open -= 1
            logger.info("client %s disconnected after %d requests", peer, count)

    async def _serve_one(
        self, conn: ServerConnection, peer: str, message: str | bytes, prev_total_ms: float | None, warned: set[str]
    ) -> bytes | None:
        if isinstance(message, str):
            raise RequestError("expected a binary msgpack frame, got a text frame")
        ignored: list[str] = []
        raw = self.keymap.to_raw(unpackb(message), strict=self.config.strict_keys, ignored=ignored)
        if ignored:
            self._warn_ignored(peer, ignored, warned)
        start = time.monotonic()
        inference = asyncio.ensure_future(self._infer(raw))
        closed = asyncio.ensure_future(conn.wait_closed())
        try:
            await asyncio.wait({inference, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if not inference.done():
            # Nobody will read the reply: drop it (a queued request is never run).
            inference.cancel()
            return None
        result, info = inference.result()
        infer_ms = (time.monotonic() - start) * 1000.0
        if not isinstance(result, dict) or "actions" not in result:
            raise TypeError(f"policy returned {type(result).__name__} without 'actions'; expected a dict")
        reply = dict(result)
        server_timing: dict[str, Any] = {"infer_ms": infer_ms}
        if prev_total_ms is not None:
            server_timing["prev_total_ms"] = prev_total_ms
        if info is not None:
            server_timing.update(batch_size=info.batch_size, queue_ms=info.queue_ms)
        reply.setdefault("policy_timing", {"infer_ms": info.infer_ms if info is not None else infer_ms})
        reply["server_timing"] = server_timing
        return packb(reply)

    def _warn_ignored(self, peer: str, ignored: list[str], warned: set[str]) -> None:
        """One warning per connection and unknown key (at most MAX_WARNED_KEYS of them)."""
        for key in ignored:
            if key in warned or len(warned) > MAX_WARNED_KEYS:
                continue
            warned.add(key)
            if len(warned) > MAX_WARNED_KEYS:
                logger.warning("client %s: more unknown observation keys; not naming them", peer)
                continue
            shown = key if len(key) <= 120 else key[:117] + "..."
            logger.warning(
                "client %s: ignoring observation key '%s', which key map '%s' does not read "
                "(serve.strict_keys: true refuses such requests)",
                peer,
                shown,
                self.keymap.name,
            )

    async def _infer(self, raw: dict[str, Any]) -> tuple[dict[str, Any], BatchInfo | None]:
        if self._batcher is not None:
            return await self._batcher.submit(raw)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.policy.infer, raw), None

    async def _send_error(self, conn: ServerConnection, peer: str, exc: Exception) -> None:
        if isinstance(exc, (*CLIENT_ERRORS, RequestError)):
            text = f"invalid request: {exc}"
            logger.warning("client %s: %s", peer, text)
        else:
            tb = "".join(traceback.format_exception(exc))
            text = f"policy error: {type(exc).__name__}: {exc}\n\n{tb}"
            logger.error("client %s: inference failed\n%s", peer, tb)
        try:
            await conn.send(text)
            await conn.close(CloseCode.INTERNAL_ERROR, "request failed; reason in the previous frame")
        except ConnectionClosed:
            pass


class ServerThread:
    """A PolicyServer on its own event loop thread (tests, benchmarks, embedding in a node).

    with ServerThread(policy, ServeConfig(port=0)) as server:
        client = WebsocketClientPolicy(server.url)
    """

    def __init__(self, policy: Policy, config: ServeConfig | None = None, keymap: KeyMap | None = None) -> None:
        self.server = PolicyServer(policy, config, keymap)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port

    def start(self, timeout: float = 10.0) -> ServerThread:
        self._thread = threading.Thread(target=self._main, name="omni-serve-loop", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("server did not start")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                await self.server.start()
            except BaseException as exc:
                self._error = exc
                raise
            finally:
                self._ready.set()
            await self.server.serve_forever(self._stop)

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported through start()
            if self._error is None:
                logger.exception("server thread failed")
            del exc

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
