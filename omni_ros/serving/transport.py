"""The three things the OpenPI protocol needs from a WebSocket, and nothing of any library.

`PolicyService` (service.py) speaks the protocol over a `Transport`: receive a frame, send a frame, close
with a code. The `websockets` server (server.py) and Starlette's WebSocket inside a Ray Serve replica
(ray_serve.py) each provide one, so the key maps, codec, error frames, size cap, API key and batching
are the same code whatever accepted the connection.
"""

from __future__ import annotations

import enum
from typing import Protocol


class CloseCode(enum.IntEnum):
    """The RFC 6455 close codes the protocol uses."""

    NORMAL_CLOSURE = 1000
    GOING_AWAY = 1001
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011


class TransportClosed(Exception):
    """The connection is gone (closed by either side, or broken)."""


class Transport(Protocol):
    """One accepted WebSocket connection."""

    # "host:port" of the client, for logs.
    peer: str

    async def recv(self) -> bytes | str:
        """The next message (bytes for a binary frame, str for a text frame); raises TransportClosed."""
        ...

    async def send(self, message: bytes | str) -> None:
        """Send one binary (bytes) or text (str) frame; raises TransportClosed."""
        ...

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """Close with `code`; a no-op on a closed connection."""
        ...

    async def wait_closed(self) -> None:
        """Return once the connection is closed (the client left)."""
        ...
