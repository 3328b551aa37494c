"""Dynamic batching: concurrent requests for one policy become one `infer_batch` call.

A batch waits at most `max_wait_ms` for more requests, counted from its first
request's arrival or from the end of the previous batch, whichever is later:
clients answered by one batch get that long to rejoin the next, so sixteen
clients settle into batches of sixteen rather than alternating halves. It does
not wait at all when no other client could add to it: every connected client
(`clients()`, one request at a time each, as the OpenPI protocol has it) already
has a request queued, so a lone client pays no batching delay. That test counts
the queue itself, on the event loop, at the moment of dispatch; a count kept
elsewhere (connections "busy" from frame arrival to reply) runs ahead of the
queue while a received request is still being decoded or an answered one is
still being sent, and would dispatch a batch without requests that are about
to join it. A batch takes every request queued at dispatch time, up to
`max_batch`. `infer_batch` must give each observation the result `infer` would
give it alone; if it raises, each request of that batch is retried alone, so
one bad observation fails only its sender.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("omni_ros.serve")


@dataclass
class BatchInfo:
    """How a request was served: its batch size and where its time went."""

    batch_size: int
    queue_ms: float
    infer_ms: float


@dataclass
class _Request:
    raw: dict[str, Any]
    future: asyncio.Future
    enqueued: float = field(default_factory=time.monotonic)


class Batcher:
    """Collects requests on the event loop and runs batches on `executor`."""

    def __init__(
        self,
        infer: Callable[[dict[str, Any]], dict[str, Any]],
        infer_batch: Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]],
        executor: Executor,
        max_batch: int = 8,
        max_wait_ms: float = 5.0,
        clients: Callable[[], int] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self._infer = infer
        self._infer_batch = infer_batch
        self._executor = executor
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self._clients = clients
        self._pending: collections.deque[_Request] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.batch_sizes: collections.Counter[int] = collections.Counter()

    @property
    def pending(self) -> int:
        """Requests waiting for a batch."""
        return len(self._pending)

    def _everyone_queued(self) -> bool:
        """Every connected client has a request in the queue: waiting longer cannot grow the batch."""
        if self._clients is None:
            return False
        live = sum(1 for r in self._pending if not r.future.done())
        return live >= self._clients()

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="omni-serve-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        while self._pending:
            request = self._pending.popleft()
            if not request.future.done():
                request.future.set_exception(RuntimeError("server is shutting down"))

    async def submit(self, raw: dict[str, Any]) -> tuple[dict[str, Any], BatchInfo]:
        """Queue one observation; returns its result and how it was batched."""
        if self._task is None or self._wakeup is None:
            raise RuntimeError("Batcher.start() was not called")
        request = _Request(raw, asyncio.get_running_loop().create_future())
        self._pending.append(request)
        self._wakeup.set()
        return await request.future

    async def _run(self) -> None:
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        last_done = 0.0
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            deadline = max(self._pending[0].enqueued, last_done) + self.max_wait
            while len(self._pending) < self.max_batch:
                if self._everyone_queued():
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
            batch = [self._pending.popleft() for _ in range(min(self.max_batch, len(self._pending)))]
            # A sender that went away while queued does not cost an inference.
            batch = [r for r in batch if not r.future.done()]
            if not batch:
                continue
            start = time.monotonic()
            outcomes = await loop.run_in_executor(self._executor, self._run_batch, [r.raw for r in batch])
            infer_ms = (time.monotonic() - start) * 1000.0
            self.batch_sizes[len(batch)] += 1
            for request, outcome in zip(batch, outcomes, strict=True):
                if request.future.done():
                    continue
                if isinstance(outcome, BaseException):
                    request.future.set_exception(outcome)
                else:
                    info = BatchInfo(len(batch), (start - request.enqueued) * 1000.0, infer_ms)
                    request.future.set_result((outcome, info))
            last_done = time.monotonic()

    def _run_batch(self, observations: list[dict[str, Any]]) -> list[Any]:
        """Runs on the executor: one batched call, or each alone if the batch fails."""
        if len(observations) > 1:
            try:
                results = list(self._infer_batch(observations))
                if len(results) == len(observations):
                    return results
                logger.error("infer_batch returned %d results for %d observations", len(results), len(observations))
            except Exception:
                logger.debug("batch of %d failed; retrying each request alone", len(observations), exc_info=True)
        outcomes: list[Any] = []
        for obs in observations:
            try:
                outcomes.append(self._infer(obs))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes
