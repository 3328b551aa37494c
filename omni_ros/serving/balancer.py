"""One TCP port in front of several replicas' own ports: a least-connections layer-4 balancer.

With Ray Serve's direct ingress each fused replica serves its WebSocket on a port of its own, which takes
Serve's Python proxy (one more process and an actor call per message, +5 ms) off the path. Clients still
want one URL, so this balancer accepts on the serve port and splices each connection, bytes unchanged
(TLS, the API key header and WebSocket frames pass through), to the replica with the fewest open
connections (ties taken in turn). A connection keeps its replica for life, as with Serve's proxy; when
that replica dies its connections close, and a reconnect lands on a live one. Where the replicas are
is asked of `targets()` (a callable, so the balancer knows nothing of Ray) every `refresh_s`; a target
that refuses a connection is skipped until the next refresh says it is back.

    balancer = TcpBalancer("127.0.0.1", 8000, targets=lambda: [("127.0.0.1", 30000), ("127.0.0.1", 30001)])
    balancer.start()   # its own thread and event loop
    ...
    balancer.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence

logger = logging.getLogger("omni_ros.serve")

Target = tuple[str, int]
_CHUNK = 1 << 16


class TcpBalancer:
    """Least-connections TCP splicing from (host, port) to the addresses `targets()` returns."""

    def __init__(
        self,
        host: str,
        port: int,
        targets: Callable[[], Sequence[Target]],
        refresh_s: float = 0.5,
        connect_timeout_s: float = 2.0,
        linger_s: float = 5.0,
    ) -> None:
        self.host, self._port = host, port
        self._targets_fn = targets
        self.refresh_s = refresh_s
        self.connect_timeout_s = connect_timeout_s
        self.linger_s = linger_s
        self._targets: tuple[Target, ...] = ()
        self._refused: set[Target] = set()  # refused a connection since the last refresh
        self._warned: set[Target] = set()  # said so once; again only after it answered or left the list
        self.open_connections: dict[Target, int] = {}
        self.accepted = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._refresher: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def targets(self) -> tuple[Target, ...]:
        return self._targets

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self, wait_for_targets_s: float = 0.0) -> TcpBalancer:
        """Listen (in a thread of its own); with `wait_for_targets_s`, first wait until a target is known."""
        self.refresh()
        self._refresher = threading.Thread(target=self._refresh_loop, name="omni-balancer-refresh", daemon=True)
        self._refresher.start()
        self._thread = threading.Thread(target=self._run, name="omni-balancer", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        deadline = time.monotonic() + wait_for_targets_s
        while not self._targets and time.monotonic() < deadline:
            time.sleep(0.1)
            self.refresh()
        return self

    def stop(self) -> None:
        self._stopping.set()
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._refresher is not None:
            self._refresher.join(timeout=5)

    def __enter__(self) -> TcpBalancer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def refresh(self) -> None:
        """Ask `targets()` where the replicas are now (a failing call keeps the last answer)."""
        try:
            found = tuple(dict.fromkeys((str(h), int(p)) for h, p in self._targets_fn()))
        except Exception as exc:  # the cluster is busy or restarting: keep routing to what we knew
            logger.debug("balancer: target refresh failed: %s", exc)
            return
        if found != self._targets:
            logger.info("balancer: replicas at %s", ", ".join(f"{h}:{p}" for h, p in found) or "(none)")
        self._targets = found
        self._refused.clear()
        self._warned &= set(found)

    def _refresh_loop(self) -> None:
        while not self._stopping.wait(self.refresh_s):
            self.refresh()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(asyncio.start_server(self._handle, self.host, self._port))
            self._port = self._server.sockets[0].getsockname()[1]
        except BaseException as exc:  # e.g. the port is taken: start() re-raises it
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            for task in asyncio.all_tasks(loop):
                task.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.gather(*asyncio.all_tasks(loop), return_exceptions=True))
            loop.close()

    # -- one connection ----------------------------------------------------------------------------------------

    def _order(self) -> list[Target]:
        """Live targets, fewest open connections first; ties taken in turn (round robin)."""
        live = [t for t in self._targets if t not in self._refused] or list(self._targets)
        if not live:
            return []
        shift = self.accepted % len(live)
        turn = live[shift:] + live[:shift]
        return sorted(turn, key=lambda t: self.open_connections.get(t, 0))

    async def _connect(self) -> tuple[Target, asyncio.StreamReader, asyncio.StreamWriter] | None:
        for target in self._order():
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(*target), self.connect_timeout_s)
            except (OSError, asyncio.TimeoutError) as exc:
                level = logging.DEBUG if target in self._warned else logging.WARNING
                logger.log(level, "balancer: replica %s:%d refused a connection (%s)", *target, exc)
                self._refused.add(target)
                self._warned.add(target)
                continue
            self._warned.discard(target)
            return target, reader, writer
        return None

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        peer = client_writer.get_extra_info("peername")
        upstream = await self._connect()
        if upstream is None:
            logger.warning("balancer: no replica to take the connection of %s", peer)
            client_writer.close()
            return
        target, reader, writer = upstream
        self.open_connections[target] = self.open_connections.get(target, 0) + 1
        pipes = [
            asyncio.ensure_future(_pipe(client_reader, writer)),
            asyncio.ensure_future(_pipe(reader, client_writer)),
        ]
        try:
            # One side ended (and the other was told so by a half-close): give the other a moment to finish
            # its closing handshake, then cut it, so no half-open connection stays behind.
            _, pending = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            if pending:
                _, pending = await asyncio.wait(pending, timeout=self.linger_s)
            for task in pending:
                task.cancel()
        except asyncio.CancelledError:  # the balancer is stopping: its connections end with it
            for task in pipes:
                task.cancel()
        finally:
            self.open_connections[target] -= 1
            for w in (writer, client_writer):
                w.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF or an error, then half-close the other side so it sees the end too."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()
