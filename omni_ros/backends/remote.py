"""A Policy that runs on another machine: any OpenPI WebSocket server (ours or openpi's).

    policy = RemotePolicy("ws://gpu-box:8000", keymap="droid", deadline_s=0.5)
    out = policy.infer({"images": {...}, "state": ..., "prompt": "..."})

Each observation is validated locally with `make_observation` (so the robot side
catches bad input before the network does), reduced to one tile per camera, put
into the openpi key layout of the key map and sent; the reply's `actions` come
back as a writable float32 array.

Key layout: with `keymap` given (a name in config/keymaps/ or a KeyMap) the
request uses that openpi layout, which drives openpi's own servers. Without
one, the layout our server announces in its metadata is used, and failing that
our canonical `{"images": {...}, "state", "prompt"}`.

Safety: every request has a deadline. When it passes, `infer` raises
DeadlineExceeded and the connection is dropped, because the protocol has no
request ids: a reply still in flight would otherwise be read as the answer to
the next observation. Connection failures are retried (bounded, with
exponential backoff) and a dropped connection is re-opened, all within the
same deadline; the robot never gets a reply computed for an older request.
"""

from __future__ import annotations

import inspect
import logging
import ssl
import threading
import time
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.sync.client import ClientConnection, connect

from omni_ros.observation import ObservationSpec, make_observation
from omni_ros.policy.base import BasePolicy, PolicyMetadata
from omni_ros.serving.keymap import KeyMap, load_keymap
from omni_ros.serving.msgpack_numpy import DecodeError, packb, unpackb

logger = logging.getLogger("omni_ros.remote")

# websockets >= 16 warns unless a long-lived connection is asked for explicitly.
_LEGACY = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}


class RemotePolicyError(RuntimeError):
    """The remote policy could not produce an answer."""


class DeadlineExceeded(RemotePolicyError, TimeoutError):
    """No reply within the request deadline; act on nothing from this request."""


class RemoteServerError(RemotePolicyError):
    """The server reported an error (its text frame is the message)."""


class RemotePolicy(BasePolicy):
    """Forwards `infer` to an OpenPI WebSocket server."""

    def __init__(
        self,
        url: str,
        keymap: KeyMap | str | None = None,
        api_key: str | None = None,
        connect_timeout_s: float = 5.0,
        deadline_s: float = 2.0,
        retries: int = 3,
        backoff_s: float = 0.05,
        backoff_max_s: float = 1.0,
        max_message_bytes: int | None = None,
        ping_interval_s: float | None = 20.0,
        action_horizon: int = 0,
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
        # Connect now: the spec comes from the key map or the server's metadata.
        self._ws = self._connect(time.monotonic() + max(connect_timeout_s, deadline_s) * (retries + 1))
        self.keymap = self._pick_keymap(keymap)
        meta = self.server_metadata
        self.spec = ObservationSpec(
            camera_names=self.keymap.camera_names,
            state_dim=self.keymap.state_dim,
            image_size=int(meta.get("image_size", 224)),
            required_cameras=self.keymap.required_cameras,
            require_prompt=False,
        )
        action_dim = meta.get("action_dim") or self.keymap.action_dim or 0
        self.metadata = PolicyMetadata(
            model=str(meta.get("model", "remote")),
            backend="remote",
            camera_names=self.keymap.camera_names,
            image_size=self.spec.image_size,
            state_dim=self.keymap.state_dim,
            action_dim=int(action_dim),
            action_horizon=int(meta.get("action_horizon") or action_horizon),
            action_dt=float(meta.get("action_dt", 0.02)),
        )

    def _pick_keymap(self, keymap: KeyMap | str | None) -> KeyMap:
        if isinstance(keymap, KeyMap):
            return keymap
        if isinstance(keymap, str):
            return load_keymap(keymap)
        described = self.server_metadata.get("keymap")
        if isinstance(described, dict):
            return KeyMap.from_description(described)
        cameras, state_dim = self.server_metadata.get("camera_names"), self.server_metadata.get("state_dim")
        if cameras and state_dim:
            return KeyMap.canonical(ObservationSpec(camera_names=tuple(cameras), state_dim=int(state_dim)))
        raise RemotePolicyError(
            f"{self.url} does not describe its observation layout in its metadata; pass keymap= (e.g. 'droid')"
        )

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
                    **({"ssl": self._ssl} if self._ssl is not None else {}),
                    **_LEGACY,
                )
                first = ws.recv(timeout=timeout)
                if isinstance(first, str):
                    raise RemoteServerError(f"server error on connect:\n{first}")
                metadata = unpackb(first)
                self.server_metadata = metadata if isinstance(metadata, dict) else {}
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

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        start = time.monotonic()
        deadline = start + self.deadline_s
        observation = make_observation(self.spec, obs)
        raw = {
            "images": {c: img for c, img in observation.images.items() if observation.image_masks[c]},
            "state": observation.state,
            "prompt": observation.prompt,
        }
        payload = packb(self.keymap.to_openpi(raw))
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
                    self._drop()
                    failures += 1
                    if failures > self.retries:
                        raise RemotePolicyError(f"connection to {self.url} lost {failures} times: {exc}") from exc
                    logger.warning("connection to %s lost (%s); reconnecting", self.url, exc)
                    continue
                break
            if isinstance(reply, str):
                # The server closes after an error frame.
                self._drop()
                raise RemoteServerError(f"server {self.url} failed:\n{reply}")
        return self._result(reply, start)

    def _result(self, reply: bytes, start: float) -> dict[str, Any]:
        try:
            result = unpackb(reply)
        except DecodeError as exc:
            raise RemotePolicyError(f"unreadable reply from {self.url}: {exc}") from exc
        if not isinstance(result, dict) or not isinstance(result.get("actions"), np.ndarray):
            raise RemotePolicyError(f"reply from {self.url} has no 'actions' array")
        actions = np.array(result["actions"], dtype=np.float32)  # writable copy
        if actions.ndim != 2:
            raise RemotePolicyError(f"remote actions must be (horizon, dim), got shape {actions.shape}")
        if self.metadata.action_dim and actions.shape[1] != self.metadata.action_dim:
            raise RemotePolicyError(f"remote actions have dim {actions.shape[1]}, expected {self.metadata.action_dim}")
        if not np.all(np.isfinite(actions)):
            raise RemotePolicyError("remote actions contain NaN or inf")
        result["actions"] = actions
        result["client_timing"] = {"round_trip_ms": (time.monotonic() - start) * 1000.0}
        return result


def _close(ws: ClientConnection | None) -> None:
    if ws is None:
        return
    try:
        ws.close()
    except Exception:  # already broken; nothing more to release
        logger.debug("closing a broken connection", exc_info=True)
