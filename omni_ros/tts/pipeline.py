"""Text -> engine -> resampler -> chunk scheduler, with per-utterance metrics.

One path shared by the ROS node, `omni-ros say` and the benchmark. The engine
runs in a producer thread, so a cancel request is honoured at the next chunk
even while the engine is inside a long synthesis call (Piper's ONNX run).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from omni_ros.tts.config import TtsConfig
from omni_ros.tts.engine import TtsEngine
from omni_ros.tts.playback import PlaybackClock
from omni_ros.tts.resample import StreamResampler
from omni_ros.tts.scheduler import Chunk, ChunkScheduler

_POLL_S = 0.005


@dataclass
class UtteranceStats:
    """What one utterance cost; published as JSON by the node."""

    utterance_id: str = ""
    engine: str = ""
    chars: int = 0
    # Seconds from the request (text arrival) to the first chunk handed out.
    ttfa_s: float = 0.0
    # Synthesis wall time over audio duration (< 1: faster than real time).
    rtf: float = 0.0
    synth_s: float = 0.0
    audio_s: float = 0.0
    chunks: int = 0
    # Simulated listener starting at the first chunk (playback.PlaybackClock).
    underruns: int = 0
    underrun_s: float = 0.0
    interrupted: bool = False
    error: str = ""
    chunk_ms: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("ttfa_s", "rtf", "synth_s", "audio_s", "underrun_s"):
            d[key] = round(d[key], 5)
        d["chunk_ms"] = [round(v, 1) for v in self.chunk_ms]
        return d


class TtsPipeline:
    """Streams scheduled chunks of one utterance at a time from `engine`."""

    def __init__(self, engine: TtsEngine, config: TtsConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.config = config
        self.clock = clock
        self.sample_rate = config.output_sample_rate or engine.sample_rate
        self.scheduler = ChunkScheduler(config.schedule, self.sample_rate, clock)
        # Producers of cancelled utterances may still be inside an engine call.
        self._producers: list[threading.Thread] = []

    def _produce(self, text: str, out: queue.Queue, stop: threading.Event) -> None:
        resampler = StreamResampler(self.engine.sample_rate, self.sample_rate)
        stream = self.engine.stream(text)
        try:
            for block in stream:
                if stop.is_set():
                    break
                samples = resampler.process(block)
                if len(samples):
                    out.put(samples)
            else:
                tail = resampler.flush()
                if len(tail):
                    out.put(tail)
        except Exception as exc:  # handed to the consumer thread
            out.put(exc)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
            out.put(None)

    def _blocks(self, text: str, cancel: threading.Event) -> Iterator[np.ndarray]:
        out: queue.Queue = queue.Queue()
        stop = threading.Event()
        producer = threading.Thread(target=self._produce, args=(text, out, stop), name="tts-engine", daemon=True)
        producer.start()
        self._producers = [t for t in self._producers if t.is_alive()] + [producer]
        try:
            while True:
                try:
                    item = out.get(timeout=_POLL_S)
                except queue.Empty:
                    if cancel.is_set():
                        return
                    continue
                if item is None:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            # Let the engine finish its current block in the background; the
            # next utterance waits for it only if the engine is single-user.
            stop.set()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait for engine work of cancelled utterances to end (before closing the engine)."""
        for thread in self._producers:
            thread.join(timeout)
        return not any(t.is_alive() for t in self._producers)

    def synthesize(
        self,
        text: str,
        cancel: threading.Event | None = None,
        stats: UtteranceStats | None = None,
        requested_at: float | None = None,
    ) -> Iterator[Chunk]:
        """Yield the scheduled chunks of `text`; the last has final=True.

        If `cancel` is set the stream ends early without a final chunk and
        `stats.interrupted` is set. `stats` (if given) is filled in as chunks
        go out, measured from `requested_at` (default: now).
        """
        cancel = cancel or threading.Event()
        stats = stats if stats is not None else UtteranceStats()
        start = self.clock() if requested_at is None else requested_at
        stats.engine = self.engine.name
        stats.chars = len(text)
        listener = PlaybackClock(self.sample_rate)
        samples = 0
        completed = False
        try:
            for chunk in self.scheduler.run(self._blocks(text, cancel), cancel):
                now = self.clock()
                if chunk.index == 0:
                    stats.ttfa_s = now - start
                if len(chunk.samples):
                    listener.add(now, len(chunk.samples))
                samples += len(chunk.samples)
                stats.chunks += 1
                stats.chunk_ms.append(1000.0 * len(chunk.samples) / self.sample_rate)
                completed = chunk.final
                yield chunk
        finally:
            # A cancel that comes after the final chunk interrupted nothing.
            stats.interrupted = cancel.is_set() and not completed
            stats.synth_s = self.clock() - start
            stats.audio_s = samples / self.sample_rate
            stats.rtf = stats.synth_s / stats.audio_s if stats.audio_s > 0 else 0.0
            report = listener.report()
            stats.underruns = report.underruns
            stats.underrun_s = report.underrun_s
