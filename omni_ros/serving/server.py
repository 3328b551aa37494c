"""An OpenPI-compatible WebSocket policy server.

Wire protocol (what `openpi_client.WebsocketClientPolicy` expects):
  1. on connect the server sends one binary msgpack frame: the policy metadata;
  2. each binary observation frame gets exactly one binary reply frame: the
     policy output (`actions` (H, D) float32) plus `policy_timing` and
     `server_timing` (`prev_total_ms` from the second request on);
  3. on error the server sends the reason as a text frame (the client raises
     RuntimeError with it) and closes the connection with code 1011;
  4. `GET /healthz` answers 200 `OK`, then the model, backend and precision a line each.

Unlike openpi's reference server, inference runs on a thread pool, so the event
loop keeps answering pings, /healthz and other clients during a slow inference;
concurrent requests can be batched; messages are capped (default 16 MiB, not
websockets' 1 MiB); an optional API key is checked in constant time; with a
certificate and key configured it serves wss:// (TLS).

The protocol is `PolicyService` (service.py), spoken over a `Transport`; this
module is its listener on the `websockets` library (ray_serve.py is another).
"""

from __future__ import annotations

import asyncio
import http
import logging
import os
import signal
import ssl
import threading
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from omni_ros.policy.base import Policy
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.keymap import KeyMap

# The protocol itself lives in service.py; these names are imported from here by older code.
from omni_ros.serving.service import (  # noqa: F401
    CLIENT_ERRORS,
    PolicyService,
    RequestError,
    check_compatible,
    is_loopback,
    resolve_api_key,
    warn_if_exposed,
)
from omni_ros.serving.transport import CloseCode, TransportClosed
from omni_ros.typed_config import ConfigError

logger = logging.getLogger("omni_ros.serve")


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


class PolicyServer(PolicyService):
    """Serves one policy to any number of OpenPI clients over the `websockets` library."""

    # Set by start(): the listening server and its port (0 in the config picks one).
    _server: Server | None = None
    port: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Checked at construction: a bad certificate fails before anything listens.
        self._ssl = server_ssl_context(self.config)

    @property
    def url(self) -> str:
        return f"{'wss' if self._ssl is not None else 'ws'}://{self.config.host}:{self.port}"

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Bind and start accepting connections (port 0 picks a free port, see `.port`)."""
        self.start_inference()
        self._server = await serve(
            self._handle_websocket,
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
        warn_if_exposed(self.url, self.config.host, self._api_key, self._ssl is not None, self.config.api_key_env)

    async def stop(self) -> None:
        """Graceful shutdown: stop accepting, let in-flight requests finish, close with 1001."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close(close_connections=False)
        await self.close_idle()
        try:
            await asyncio.wait_for(server.wait_closed(), self.config.drain_timeout_s)
        except TimeoutError:
            logger.warning("in-flight requests did not finish within %.1f s; closing", self.config.drain_timeout_s)
            for conn in list(server.connections):
                conn.transport.abort()
        await self.stop_inference()
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
            return connection.respond(http.HTTPStatus.OK, self.health_text())
        if not self.authorized(request.headers):
            logger.warning("rejected %s: missing or wrong API key", connection.remote_address)
            response = connection.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong API key\n")
            response.headers["WWW-Authenticate"] = "Api-Key"
            return response
        return None

    # -- one connection ----------------------------------------------------------

    async def _handle_websocket(self, conn: ServerConnection) -> None:
        await self.handle(WebsocketsTransport(conn))


class WebsocketsTransport:
    """A `websockets` server connection as a `Transport`."""

    def __init__(self, conn: ServerConnection) -> None:
        self._conn = conn
        host, port = conn.remote_address[:2]
        self.peer = f"{host}:{port}"

    async def recv(self) -> bytes | str:
        try:
            return await self._conn.recv()
        except ConnectionClosed as exc:
            raise TransportClosed(str(exc)) from exc

    async def send(self, message: bytes | str) -> None:
        try:
            await self._conn.send(message)
        except ConnectionClosed as exc:
            raise TransportClosed(str(exc)) from exc

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        await self._conn.close(code, reason)

    async def wait_closed(self) -> None:
        await self._conn.wait_closed()


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
