"""The OpenPI protocol for one policy, over any `Transport` (transport.py).

Per connection: the metadata frame first; then for each binary msgpack
observation exactly one binary reply (`actions`, `policy_timing`,
`server_timing`), or, when a request fails, its reason as a text frame (what
openpi-client raises RuntimeError on) and close code 1011. Inference runs on a
thread pool, so the event loop keeps serving other clients during a slow one,
and concurrent requests can be batched (`Batcher`).

Optional `rtc/...` keys beside the observation ask for real-time chunking
(`omni_ros.serving.rtc_keys`); the metadata frame's `rtc` entry says which
methods the policy serves. Requests without them are plain openpi requests.

What accepts connections is not here: `PolicyServer` (server.py) listens with
the `websockets` library, the Ray Serve replica (ray_serve.py) with Starlette;
both hand each connection to `PolicyService.handle`.

Like openpi's policy transforms, observation keys the key map does not name are
skipped (one warning per connection and key) unless `serve.strict_keys` is set;
float [0, 1] and CHW images are converted as openpi does (keymap.py).
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import ipaddress
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
from omni_ros.policy.rtc_request import RtcError, supported_rtc_methods
from omni_ros.serving.batching import Batcher, BatchInfo
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.keymap import KeyMap
from omni_ros.serving.msgpack_numpy import DecodeError, packb, unpackb
from omni_ros.serving.rtc_keys import rtc_metadata, split_rtc
from omni_ros.serving.transport import CloseCode, Transport, TransportClosed
from omni_ros.typed_config import ConfigError

logger = logging.getLogger("omni_ros.serve")

# Errors caused by what the client sent, reported without a server traceback.
CLIENT_ERRORS = (DecodeError, ObservationError, RtcError)
# Unknown keys named in warnings per connection; a client inventing keys cannot flood the log.
MAX_WARNED_KEYS = 32
# How many recent policy calls must each be under `serve.inline_below_ms` before calls run on the event loop.
INLINE_AFTER = 8
# A call this long on the event loop held up every other client: calls never run there again (a policy that is
# only sometimes fast, e.g. one replaying a cached chunk between inferences). A shorter slow call (the machine
# was busy) only sends the next INLINE_AFTER calls back to the threads.
INLINE_BLOCKING_MS = 20.0


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


def warn_if_exposed(url: str, host: str, api_key: str | None, tls: bool, api_key_env: str = "") -> None:
    """A loud warning when a server beyond loopback has no API key, a quieter one when its key is sent in clear."""
    if is_loopback(host):
        return
    if api_key is None:
        bar = "!" * 100
        logger.warning(
            "\n%s\n!! %s listens on a non-loopback address WITHOUT AN API KEY: anyone who can reach this port "
            "can drive the robot's policy.\n!! Set serve.api_key (or $%s, or --api-key), or bind 127.0.0.1.\n%s",
            bar,
            url,
            api_key_env or "OMNI_ROS_API_KEY",
            bar,
        )
    elif not tls:
        logger.warning(
            "%s: the API key travels in clear text over ws:// on a non-loopback address; "
            "set serve.tls_cert and serve.tls_key for wss://",
            url,
        )


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
            "rtc": rtc_metadata(supported_rtc_methods(policy)),
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
        # Durations (ms) of the latest policy calls: all short means the next one runs on the event loop (until
        # one call there takes INLINE_BLOCKING_MS: the loop is blocked that long once, at most).
        self._recent_ms: collections.deque[float] = collections.deque(maxlen=INLINE_AFTER)
        self._inline_off = False

    def health_text(self) -> str:
        """The body of `GET /healthz`: "OK" first (what probes read), then the model and what its GEMMs run in."""
        meta = self.metadata
        lines = ["OK", *(f"{key}: {meta.get(key, '')}" for key in ("model", "backend", "precision"))]
        return "\n".join(lines) + "\n"

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
                clients=lambda: len(self._connections),
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
        warned: set[str] = set()  # unknown keys already reported for this connection
        # One waiter per connection, not per request: a request raced against it learns the client left.
        closed: asyncio.Future[None] | None = None
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
                if closed is None:
                    closed = asyncio.ensure_future(conn.wait_closed())
                try:
                    reply = await self._serve_one(conn, closed, message, prev_total_ms, warned)
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
            if closed is not None:
                closed.cancel()
            self._connections.discard(conn)
            logger.info("client %s disconnected after %d requests", peer, count)

    async def _serve_one(
        self,
        conn: Transport,
        closed: asyncio.Future[None],
        message: str | bytes,
        prev_total_ms: float | None,
        warned: set[str],
    ) -> bytes | None:
        if isinstance(message, str):
            raise RequestError("expected a binary msgpack frame, got a text frame")
        request, rtc = split_rtc(unpackb(message))
        if rtc is not None:
            methods = supported_rtc_methods(self.policy)
            if rtc.method not in methods:
                offer = f"it serves {', '.join(methods)}" if methods else "it does not support real-time chunking"
                raise RtcError(
                    f"rtc method '{rtc.method}' requested, but this server's policy cannot serve it ({offer})"
                )
        # Explicit flow-matching noise (openpi's `Policy.infer(obs, noise=...)`), announced by `noise_shape`.
        noise = request.pop("noise", None) if isinstance(request, dict) else None
        ignored: list[str] = []
        raw = self.keymap.to_raw(request, strict=self.config.strict_keys, ignored=ignored)
        if ignored:
            self._warn_ignored(conn.peer, ignored, warned)
        options: dict[str, Any] = {k: v for k, v in (("noise", noise), ("rtc", rtc)) if v is not None}
        info: BatchInfo | None = None
        if self._runs_inline(options):
            # Shorter than the hand-off to a thread would be (see ServeConfig.inline_below_ms); nothing to race.
            result, infer_ms = self._call_policy(raw, options)
            if infer_ms >= INLINE_BLOCKING_MS:
                self._inline_off = True
                logger.info(
                    "a policy call took %.1f ms on the event loop; calls run on the inference threads from now on",
                    infer_ms,
                )
        else:
            inference = asyncio.ensure_future(self._infer(raw, options))
            racing: set[asyncio.Future[Any]] = {inference, closed}
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            if not inference.done():
                # Nobody will read the reply: drop it (a queued request is never run).
                inference.cancel()
                return None
            result, infer_ms, info = inference.result()
        if not isinstance(result, dict) or "actions" not in result:
            raise TypeError(f"policy returned {type(result).__name__} without 'actions'; expected a dict")
        reply = dict(result)
        # infer_ms is the policy's own time, as openpi's server reports it (hand-offs and queueing are not in it).
        server_timing: dict[str, Any] = {"infer_ms": infer_ms}
        if prev_total_ms is not None:
            server_timing["prev_total_ms"] = prev_total_ms
        if info is not None:
            server_timing.update(batch_size=info.batch_size, queue_ms=info.queue_ms)
        reply.setdefault("policy_timing", {"infer_ms": infer_ms})
        reply["server_timing"] = server_timing
        return packb(reply)

    def _runs_inline(self, options: dict[str, Any]) -> bool:
        """Whether this call runs on the event loop: no batching to join, and the latest calls were all short."""
        limit = self.config.inline_below_ms
        if limit <= 0 or self._inline_off or (self._batcher is not None and not options):
            return False
        recent = self._recent_ms
        return len(recent) == recent.maxlen and max(recent) < limit

    def _call_policy(self, raw: dict[str, Any], options: dict[str, Any]) -> tuple[Any, float]:
        """One policy call and its duration in ms (on whichever thread runs it)."""
        start = time.perf_counter()
        result = self.policy.infer(raw, **options)
        infer_ms = (time.perf_counter() - start) * 1000.0
        self._recent_ms.append(infer_ms)  # deque.append is atomic: worker threads may append concurrently
        return result, infer_ms

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

    async def _infer(
        self, raw: dict[str, Any], options: dict[str, Any]
    ) -> tuple[dict[str, Any], float, BatchInfo | None]:
        """(result, the policy's ms, the batch it ran in) off the event loop: on the batcher or a worker thread."""
        # A request with noise or continuing its own robot's plan runs alone: a batch shares one noise and loop.
        if self._batcher is not None and not options:
            result, info = await self._batcher.submit(raw)
            return result, info.infer_ms, info
        loop = asyncio.get_running_loop()
        result, infer_ms = await loop.run_in_executor(self._executor, self._call_policy, raw, options)
        return result, infer_ms, None

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
