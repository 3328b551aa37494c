"""Cuts a stream of synthesized audio into the chunks that get published.

Small chunks reach the listener sooner; big chunks cost fewer messages (and,
for codec-LM voices, fewer decoder calls). The schedule starts with a small
first chunk for a quick start, and then must grow no faster than synthesis
stays ahead of playback: after a first chunk of E0 samples, chunk k can end
at most at E0 + S * E(k-1) samples when synthesis runs S times faster than
real time. A first chunk of one 80 ms frame followed by 25-frame chunks
breaks that bound at S = 12.5 and leaves the listener 80 ms of silence.

Modes (TtsScheduleConfig.mode):
  fixed     first chunk, then steady chunks;
  ramp      first chunk, then the ramp sizes in turn, then steady chunks;
  adaptive  first chunk, then the largest chunk that the measured synthesis
            speed can fill before the listener's buffer runs out, divided by
            (1 + safety_margin), between min and steady size.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from omni_ros.tts.config import TtsScheduleConfig


@dataclass
class Chunk:
    samples: np.ndarray
    # Scheduler clock time when the chunk was handed out.
    time_s: float
    index: int
    final: bool


class ChunkScheduler:
    """Re-chunks int16 blocks at `sample_rate` following a TtsScheduleConfig (which checks its own sizes)."""

    def __init__(
        self, config: TtsScheduleConfig, sample_rate: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.sample_rate = sample_rate
        self.clock = clock

    def _samples(self, ms: float) -> int:
        return max(1, round(ms * self.sample_rate / 1000.0))

    def planned_size(self, index: int) -> int:
        """Chunk size of the fixed and ramp modes (and adaptive's first chunk)."""
        c = self.config
        if index == 0:
            return self._samples(c.first_chunk_ms)
        if c.mode == "ramp" and index - 1 < len(c.ramp_ms):
            return self._samples(c.ramp_ms[index - 1])
        return self._samples(c.steady_chunk_ms)

    def _adaptive_size(self, pending: int, produced: int, emitted: int, block: int, start: float, first: float) -> int:
        now = self.clock()
        elapsed = now - start
        # Samples synthesized per second so far (counting the start-up latency,
        # which only makes the estimate cautious).
        speed = produced / elapsed if elapsed > 0 else float("inf")
        buffered_s = emitted / self.sample_rate - (now - first)
        if buffered_s <= 0:
            budget = pending
        elif speed == float("inf"):
            budget = float("inf")
        else:
            # Audio arrives in engine blocks: count only whole blocks that are
            # due before the listener's buffer (less the margin) runs out.
            room = speed * buffered_s / (1.0 + self.config.safety_margin)
            budget = pending + (room // block) * block
        low = self._samples(self.config.min_chunk_ms)
        high = self._samples(self.config.steady_chunk_ms)
        return int(min(max(budget, low), high))

    def run(self, blocks: Iterable[np.ndarray], cancel: threading.Event | None = None) -> Iterator[Chunk]:
        """Yield scheduled chunks; the last has final=True (possibly empty).

        When `cancel` is set the run stops at the next block or chunk without a
        final chunk: the caller ends the utterance its own way.
        """
        pending: list[np.ndarray] = []
        n_pending = 0
        produced = emitted = 0
        index = 0
        start = self.clock()
        first = start
        adaptive = self.config.mode == "adaptive"
        size: int | None = None
        block = 1  # largest engine block seen

        def take(n: int) -> np.ndarray:
            nonlocal n_pending
            out = np.concatenate(pending) if len(pending) > 1 else pending[0]
            pending.clear()
            if n < len(out):
                pending.append(out[n:])
            n_pending = len(out) - min(n, len(out))
            return out[:n]

        for data in blocks:
            if cancel is not None and cancel.is_set():
                return
            if len(data) == 0:
                continue
            pending.append(np.asarray(data, dtype=np.int16))
            n_pending += len(data)
            produced += len(data)
            block = max(block, len(data))
            while n_pending:
                # A size is fixed when its chunk is planned: re-planning while
                # waiting would let the target recede and eat the margin.
                if size is None:
                    if index == 0 or not adaptive:
                        size = self.planned_size(index)
                    else:
                        size = self._adaptive_size(n_pending, produced, emitted, block, start, first)
                if n_pending < size:
                    if adaptive and index > 0 and emitted / self.sample_rate <= self.clock() - first:
                        # The listener has run dry: what we have shortens the gap.
                        size = n_pending
                    else:
                        break
                samples = take(size)
                size = None
                now = self.clock()
                if index == 0:
                    first = now
                emitted += len(samples)
                yield Chunk(samples, now, index, False)
                index += 1
                if cancel is not None and cancel.is_set():
                    return
        if cancel is not None and cancel.is_set():
            return
        rest = take(n_pending) if n_pending else np.zeros(0, dtype=np.int16)
        yield Chunk(rest, self.clock(), index, True)
