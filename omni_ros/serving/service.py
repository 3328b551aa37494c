"""The OpenPI protocol for one policy, over any `Transport` (transport.py).

Per connection: the metadata frame first; then for each binary msgpack
observation exactly one binary reply (`actions`, `policy_timing`,
`server_timing`), or, when a request fails, its reason as a text frame (what
openpi-client raises RuntimeError on) and close code 1011. Inference runs on a
thread pool, so the event loop keeps serving other clients during a slow one,
and concurrent requests can be batched (`Batcher`).

What accepts connections is not here: `PolicyServer` (server.py) listens with
the `websockets` library, the Ray Serve replica (ray_serve.py) with Starlette;
both hand each connection to `PolicyService.handle`.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import os
import time
import traceback
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from omni_ros import __version__
from omni_ros.observation import ObservationError
from omni_ros.policy.base import Policy
from omni_ros.serving.batching import Batcher, BatchInfo
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.keymap import KeyMap
from omni_ros.serving.msgpack_numpy import DecodeError, packb, unpackb
from omni_ros.serving.transport import CloseCode, Transport, TransportClosed
from omni_ros.typed_config import ConfigError

logger = logging.getLogger("omni_ros.serve")

# Errors caused by what the client sent, reported without a server traceback.
CLIENT_ERRORS = (DecodeError, ObservationError)


class RequestError(ValueError):
    """The request frame itself is unusable (e.g. a text frame)."""


def resolve_api_key(config: ServeConfig) -> str | None:
    """The key clients must present: `api_key`, else the environment variable `api_key_env`."""
    if config.api_key:
        return config.api_key
    if config.api_key_env:
        return os.environ.get(config.api_key_env) or None
    return None


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


class PolicyService:
    """Serves one policy to any number of OpenPI clients, one `handle(transport)` per connection."""

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
        # ServeConfig checked itself (workers, max_message_bytes).
        self._api_key = resolve_api_key(self.config)
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
        self._connections: set[Transport] = set()  # connections whose handler runs
        self._busy: set[Transport] = set()
        self._draining = False
        self.requests_served = 0
        # Requests whose client left before the reply (their result was dropped).
        self.abandoned = 0

    @property
    def batcher(self) -> Batcher | None:
        return self._batcher

    # -- lifecycle -------------------------------------------------------------

    def start_inference(self) -> None:
        """The inference threads and the batcher; call on the event loop that will run `handle`."""
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=self.config.workers, thread_name_prefix="omni-serve-infer")
        batching = self.config.batching
        if batching.enabled:
            self._batcher = Batcher(
                self.policy.infer,
                self.policy.infer_batch,
                self._executor,
                batching.max_batch,
                batching.max_wait_ms,
                idle_clients=lambda: len(self._connections) - len(self._busy),
            )
            self._batcher.start()

    async def stop_inference(self) -> None:
        """Fail what is still queued and release the inference threads."""
        if self._batcher is not None:
            await self._batcher.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def close_idle(self) -> None:
        """Start draining: idle connections close with 1001 now, busy ones after their reply."""
        self._draining = True
        idle = [t for t in self._connections if t not in self._busy]
        await asyncio.gather(*(t.close(CloseCode.GOING_AWAY, "server shutting down") for t in idle))

    async def drain(self, timeout_s: float) -> None:
        """`close_idle`, then wait up to `timeout_s` for the busy connections to get their replies."""
        await self.close_idle()
        deadline = time.monotonic() + timeout_s
        while self._busy and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    # -- admission ---------------------------------------------------------------

    def authorized(self, headers: Mapping[str, str]) -> bool:
        """Whether `Authorization: Api-Key ...` is right (constant time) or no key is needed; `headers` must
        look names up case-insensitively (websockets' and Starlette's do)."""
        if self._api_key is None:
            return True
        given = headers.get("Authorization", "")
        expected = f"Api-Key {self._api_key}"
        return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))

    # -- one connection ----------------------------------------------------------

    async def handle(self, conn: Transport) -> None:
        """Serve one connection until it closes (either side) or a request fails."""
        peer = conn.peer
        logger.info("client %s connected", peer)
        prev_total_ms: float | None = None
        count = 0
        self._connections.add(conn)
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
                    reply = await self._serve_one(conn, message, prev_total_ms)
                except TransportClosed:
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
        except TransportClosed:
            pass
        finally:
            self._connections.discard(conn)
            logger.info("client %s disconnected after %d requests", peer, count)

    async def _serve_one(self, conn: Transport, message: str | bytes, prev_total_ms: float | None) -> bytes | None:
        if isinstance(message, str):
            raise RequestError("expected a binary msgpack frame, got a text frame")
        request = unpackb(message)
        # Explicit flow-matching noise (openpi's `Policy.infer(obs, noise=...)`), announced by `noise_shape`.
        noise = request.pop("noise", None) if isinstance(request, dict) else None
        raw = self.keymap.to_raw(request)
        start = time.monotonic()
        inference = asyncio.ensure_future(self._infer(raw, noise))
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

    async def _infer(self, raw: dict[str, Any], noise: Any = None) -> tuple[dict[str, Any], BatchInfo | None]:
        if self._batcher is not None and noise is None:
            return await self._batcher.submit(raw)
        loop = asyncio.get_running_loop()
        call = self.policy.infer if noise is None else functools.partial(self.policy.infer, noise=noise)
        return await loop.run_in_executor(self._executor, call, raw), None

    async def _send_error(self, conn: Transport, peer: str, exc: Exception) -> None:
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
        except TransportClosed:
            pass
