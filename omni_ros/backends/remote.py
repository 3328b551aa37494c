"""A Policy that runs on another machine: any OpenPI WebSocket server (ours or openpi's).

    policy = RemotePolicy("ws://gpu-box:8000", keymap="droid", deadline_s=0.5)
    out = policy.infer({"images": {...}, "state": ..., "prompt": "..."})

It is the one inference path (`InferencePipeline`) with a remote runner: each
observation is validated locally with `make_observation` (so the robot side
catches bad input before the network does), reduced to one tile per camera, put
into the openpi key layout of the key map and sent; the reply's `actions` come
back as a writable float32 array, checked like every other backend's. Explicit
noise is sent as the request's `noise` key to servers that announce they take
it (`noise_shape` in their metadata, as ours does).

Key layout: with `keymap` given (a name in config/keymaps/ or a KeyMap) the
request uses that openpi layout, which drives openpi's own servers. Without
one, the layout our server announces in its metadata is used, and failing that
our canonical `{"images": {...}, "state", "prompt"}`.

Real-time chunking: `infer(obs, rtc=RtcRequest(...))` sends the request as the
optional `rtc/...` keys (omni_ros.serving.rtc_keys), so a robot gets RTC from a
GPU server; `rtc_methods` is what the server's metadata announces (nothing for
openpi's own servers, and then an RTC request is refused here, before sending).

Safety: every request has a deadline. When it passes, `infer` raises
DeadlineExceeded and the connection is dropped, because the protocol has no
request ids: a reply still in flight would otherwise be read as the answer to
the next observation. Connection failures are retried (bounded, with
exponential backoff) and a dropped connection is re-opened, all within the
same deadline; the robot never gets a reply computed for an older request.
When the connection closes under a request (the server restarted, or the Ray
Serve replica holding it died) the request is sent again on a new connection,
the first time at once, then after pauses that double; the new server must
announce the same observation layout and action shape as the old one.
"""

from __future__ import annotations

import inspect
import logging
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.sync.client import ClientConnection, connect

from omni_ros.observation import Observation, ObservationSpec, make_observation
from omni_ros.policy.base import PolicyMetadata
from omni_ros.policy.pipeline import InferencePipeline, Sampled
from omni_ros.policy.rtc import RtcPlan, RtcRequest
from omni_ros.serving.keymap import KeyMap, load_keymap
from omni_ros.serving.msgpack_numpy import DecodeError, packb, unpackb
from omni_ros.serving.rtc_keys import methods_of, rtc_keys

logger = logging.getLogger("omni_ros.remote")

# websockets >= 16 warns unless a long-lived connection is asked for explicitly.
_LEGACY: dict[str, Any] = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}


class RemotePolicyError(RuntimeError):
    """The remote policy could not produce an answer."""


class DeadlineExceeded(RemotePolicyError, TimeoutError):
    """No reply within the request deadline; act on nothing from this request."""


class RemoteServerError(RemotePolicyError):
    """The server reported an error (its text frame is the message)."""


class RemoteRunner:
    """The transport: one WebSocket connection, requests one at a time, each within its deadline."""

    # One request in flight per connection (the protocol has no request ids).
    max_batch = 1
    # The server draws the noise when the request carries none.
    draws_noise = True
    backend = "remote"
    device = torch.device("cpu")
    computes_locally = False  # the server's CPU computes the chunk: this one's idle cores may sleep
    dtype = torch.float32

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        connect_timeout_s: float = 5.0,
        deadline_s: float = 2.0,
        retries: int = 3,
        backoff_s: float = 0.05,
        backoff_max_s: float = 1.0,
        max_message_bytes: int | None = None,
        ping_interval_s: float | None = 20.0,
        ca_file: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url if url.startswith(("ws://", "wss://")) else f"ws://{url}"
        # wss://: the server's certificate is checked against the system's CAs, or `ca_file` (a self-signed
        # certificate, or a private CA), or a context of your own.
        if (ca_file or ssl_context) and not self.url.startswith("wss://"):
            raise RemotePolicyError(f"ca_file / ssl_context need a wss:// URL, got {self.url}")
        self._ssl = ssl_context or (ssl.create_default_context(cafile=ca_file) if ca_file else None)
        self.api_key = api_key
        self.connect_timeout_s = connect_timeout_s
        self.deadline_s = deadline_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.max_message_bytes = max_message_bytes
        self.ping_interval_s = ping_interval_s
        self._lock = threading.Lock()
        self._ws: ClientConnection | None = None
        self.server_metadata: dict[str, Any] = {}
        self.reconnects = 0
        # Connect now: the observation layout comes from the key map or the server's metadata.
        self._ws = self._connect(time.monotonic() + max(connect_timeout_s, deadline_s) * (retries + 1))

    @property
    def rtc_methods(self) -> tuple[str, ...]:
        """Real-time chunking methods the server announced in its metadata."""
        return methods_of(self.server_metadata)

    # -- connection ------------------------------------------------------------

    def _connect(self, deadline: float) -> ClientConnection:
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        delay = self.backoff_s
        attempt = 0
        while True:
            attempt += 1
            timeout = min(self.connect_timeout_s, deadline - time.monotonic())
            if timeout <= 0:
                raise DeadlineExceeded(f"no connection to {self.url} within the deadline ({attempt - 1} attempts)")
            ws = None
            try:
                ws = connect(
                    self.url,
                    open_timeout=timeout,
                    compression=None,
                    max_size=self.max_message_bytes,
                    additional_headers=headers,
                    proxy=None,
                    ping_interval=self.ping_interval_s,
                    ping_timeout=self.ping_interval_s,
                    close_timeout=1.0,
                    ssl=self._ssl,  # None: websockets makes a default context for wss://
                    **_LEGACY,
                )
                first = ws.recv(timeout=timeout)
                if isinstance(first, str):
                    raise RemoteServerError(f"server error on connect:\n{first}")
                metadata = unpackb(first)
                metadata = metadata if isinstance(metadata, dict) else {}
                if self.server_metadata and _layout(metadata) != _layout(self.server_metadata):
                    # A request in the old layout must never be read by a policy that expects another one.
                    raise RemotePolicyError(
                        f"{self.url} now serves another policy layout: {_layout(metadata)} "
                        f"instead of {_layout(self.server_metadata)}; create a new RemotePolicy"
                    )
                self.server_metadata = metadata
                logger.info("connected to %s (attempt %d)", self.url, attempt)
                return ws
            except InvalidStatus as exc:
                _close(ws)
                if exc.response.status_code in (401, 403):
                    raise RemotePolicyError(
                        f"{self.url} refused the API key (HTTP {exc.response.status_code})"
                    ) from exc
                error: Exception = exc
            except InvalidURI as exc:
                raise RemotePolicyError(f"bad server URL {self.url!r}: {exc}") from exc
            except ssl.SSLCertVerificationError as exc:
                _close(ws)
                raise RemotePolicyError(
                    f"{self.url}: the server's TLS certificate is not trusted ({exc.verify_message}); "
                    f"pass ca_file= with its certificate or CA"
                ) from exc
            except RemotePolicyError:
                _close(ws)
                raise
            except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed, DecodeError) as exc:
                _close(ws)
                error = exc
            if attempt > self.retries:
                raise RemotePolicyError(f"cannot reach {self.url} after {attempt} attempts: {error}") from error
            sleep = min(delay, deadline - time.monotonic())
            logger.warning("connecting to %s failed (%s); retry %d in %.2f s", self.url, error, attempt, sleep)
            if sleep > 0:
                time.sleep(sleep)
            delay = min(delay * 2, self.backoff_max_s)

    def _drop(self) -> None:
        """Forget the connection now; its closing handshake (up to 1 s on a dead peer) runs in the background."""
        ws, self._ws = self._ws, None
        if ws is not None:
            threading.Thread(target=_close, args=(ws,), name="omni-remote-close", daemon=True).start()

    def close(self) -> None:
        with self._lock:
            ws, self._ws = self._ws, None
            _close(ws)

    # -- inference ---------------------------------------------------------------

    def sample(
        self,
        inputs: list[dict[str, Any]],
        noise: torch.Tensor | None,
        num_steps: int | None,
        rtc: RtcPlan | None = None,
    ) -> Sampled:
        """Send each request (already in the server's key layout) and read its reply's actions.

        With `rtc`, the request carries the optional `rtc/...` keys (robot units; the server normalizes)."""
        actions, extras = [], []
        for i, request in enumerate(inputs):
            if noise is not None:
                request = {**request, "noise": noise[i].numpy()}
            if rtc is not None:
                request = {**request, **rtc_keys(rtc.request)}
            reply, round_trip_ms = self._round_trip(packb(request))
            result = self._result(reply)
            actions.append(result.pop("actions"))
            result["client_timing"] = {"round_trip_ms": round_trip_ms}
            extras.append(result)
        return Sampled(np.stack(actions), {}, extras)

    def _round_trip(self, payload: bytes) -> tuple[bytes, float]:
        start = time.monotonic()
        deadline = start + self.deadline_s
        with self._lock:
            failures = 0
            while True:
                if self._ws is None:
                    self._ws = self._connect(deadline)
                    self.reconnects += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceeded(f"no reply from {self.url} within {self.deadline_s:.3f} s")
                try:
                    self._ws.send(payload)
                    reply = self._ws.recv(timeout=remaining)
                except TimeoutError as exc:
                    # The reply may still come: drop the connection so it can never be taken for a later one.
                    self._drop()
                    raise DeadlineExceeded(f"no reply from {self.url} within {self.deadline_s:.3f} s") from exc
                except ConnectionClosed as exc:
                    # The server, or the replica behind a load balancer that held this connection, went away.
                    # The request is sent again on a new connection: the first right away (another replica
                    # is usually up), later ones after a pause that doubles, all within this deadline.
                    self._drop()
                    failures += 1
                    if failures > self.retries:
                        raise RemotePolicyError(f"connection to {self.url} lost {failures} times: {exc}") from exc
                    pause = 0.0 if failures == 1 else min(self.backoff_s * 2 ** (failures - 2), self.backoff_max_s)
                    pause = min(pause, deadline - time.monotonic())
                    logger.warning("connection to %s lost (%s); reconnecting in %.2f s", self.url, exc, max(pause, 0))
                    if pause > 0:
                        time.sleep(pause)
                    continue
                break
            if isinstance(reply, str):
                # The server closes after an error frame.
                self._drop()
                raise RemoteServerError(f"server {self.url} failed:\n{reply}")
        return reply, (time.monotonic() - start) * 1000.0

    def _result(self, reply: bytes) -> dict[str, Any]:
        try:
            result = unpackb(reply)
        except DecodeError as exc:
            raise RemotePolicyError(f"unreadable reply from {self.url}: {exc}") from exc
        if not isinstance(result, dict) or not isinstance(result.get("actions"), np.ndarray):
            raise RemotePolicyError(f"reply from {self.url} has no 'actions' array")
        actions = np.array(result["actions"], dtype=np.float32)  # writable copy
        if actions.ndim != 2:
            raise RemotePolicyError(f"remote actions must be (horizon, dim), got shape {actions.shape}")
        if not np.all(np.isfinite(actions)):
            raise RemotePolicyError("remote actions contain NaN or inf")
        # The server's own timing stays its own; ours is the pipeline's.
        result.pop("policy_timing", None)
        result["actions"] = actions
        return result


class RemoteProcessor:
    """Validation and one tile per camera here; the key layout of the server's key map on the wire."""

    def __init__(self, keymap: KeyMap, spec: ObservationSpec, metadata: PolicyMetadata) -> None:
        self.keymap, self.spec, self._metadata = keymap, spec, metadata

    @property
    def noise_shape(self) -> tuple[int, int] | None:
        return self._metadata.noise_shape

    def metadata(self, name: str, backend: str) -> PolicyMetadata:
        return self._metadata

    def parse(self, raw: Mapping[str, Any]) -> Observation:
        return make_observation(self.spec, raw)

    def inputs(self, observations: Sequence[Observation], device: Any = None, dtype: Any = None) -> list[dict]:
        return [self.keymap.to_openpi(_present(o)) for o in observations]

    def rtc_target(self, request: RtcRequest, observation: Observation) -> None:
        """None: the request goes to the server in robot units, and the server's processor normalizes it."""
        return None

    def actions(self, normalized: np.ndarray, observation: Observation) -> np.ndarray:
        action_dim = self._metadata.action_dim
        if action_dim and normalized.shape[1] != action_dim:
            raise RemotePolicyError(f"remote actions have dim {normalized.shape[1]}, expected {action_dim}")
        return normalized


class RemotePolicy(InferencePipeline):
    """Forwards `infer` to an OpenPI WebSocket server.

    `connection` options are the transport's (`RemoteRunner`: api_key, connect_timeout_s, deadline_s, retries,
    backoff_s, backoff_max_s, max_message_bytes, ping_interval_s).
    """

    processor: RemoteProcessor

    def __init__(
        self, url: str, keymap: KeyMap | str | None = None, action_horizon: int = 0, **connection: Any
    ) -> None:
        runner = RemoteRunner(url, **connection)
        meta = runner.server_metadata
        try:
            chosen = _pick_keymap(keymap, meta, runner.url)
        except Exception:
            runner.close()
            raise
        spec = ObservationSpec(
            camera_names=chosen.camera_names,
            state_dim=chosen.state_dim,
            image_size=int(meta.get("image_size", 224)),
            required_cameras=chosen.required_cameras,
            require_prompt=False,
        )
        action_dim = meta.get("action_dim") or chosen.action_dim or 0
        metadata = PolicyMetadata(
            model=str(meta.get("model", "remote")),
            backend="remote",
            camera_names=chosen.camera_names,
            image_size=spec.image_size,
            state_dim=chosen.state_dim,
            action_dim=int(action_dim),
            action_horizon=int(meta.get("action_horizon") or action_horizon),
            action_dt=float(meta.get("action_dt", 0.02)),
            noise_shape=_noise_shape(meta.get("noise_shape")),
            # What the server's GEMMs compute in, and why (its metadata's `precision`): the node's status says it.
            precision=str(meta.get("precision", "")),
        )
        processor = RemoteProcessor(chosen, spec, metadata)
        super().__init__(processor, runner, num_steps=None, seed=None, name=metadata.model)
        self.remote = runner

    @property
    def url(self) -> str:
        return self.remote.url

    @property
    def keymap(self) -> KeyMap:
        return self.processor.keymap

    @property
    def server_metadata(self) -> dict[str, Any]:
        return self.remote.server_metadata

    @property
    def reconnects(self) -> int:
        return self.remote.reconnects


# What a reconnected server must announce as before: the observation layout and the shape of its answers.
_LAYOUT_KEYS = ("keymap", "camera_names", "state_dim", "action_dim", "action_horizon", "noise_shape")


def _layout(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: metadata.get(k) for k in _LAYOUT_KEYS}


def _noise_shape(value: Any) -> tuple[int, int] | None:
    """The server's announced noise shape, if it announces a valid one."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(n, int) for n in value):
        return (value[0], value[1])
    return None


def _present(observation: Observation) -> dict[str, Any]:
    """The raw observation with only the cameras that sent an image (the server masks the rest itself)."""
    images = {c: img for c, img in observation.images.items() if observation.image_masks[c]}
    return {"images": images, "state": observation.state, "prompt": observation.prompt}


def _pick_keymap(keymap: KeyMap | str | None, metadata: dict[str, Any], url: str) -> KeyMap:
    if isinstance(keymap, KeyMap):
        return keymap
    if isinstance(keymap, str):
        return load_keymap(keymap)
    described = metadata.get("keymap")
    if isinstance(described, dict):
        return KeyMap.from_description(described)
    cameras, state_dim = metadata.get("camera_names"), metadata.get("state_dim")
    if cameras and state_dim:
        return KeyMap.canonical(ObservationSpec(camera_names=tuple(cameras), state_dim=int(state_dim)))
    raise RemotePolicyError(
        f"{url} does not describe its observation layout in its metadata; pass keymap= (e.g. 'droid')"
    )


def _close(ws: ClientConnection | None) -> None:
    if ws is None:
        return
    try:
        ws.close()
    except Exception:  # already broken; nothing more to release
        logger.debug("closing a broken connection", exc_info=True)
