"""A simulated listener that measures gaps (underruns) in chunked audio.

The listener starts playing when the first chunk arrives (plus an optional
pre-buffer) and then plays continuously; a chunk that arrives after the
audio before it has finished playing leaves a gap. Feeding it the (arrival
time, sample count) of each chunk tells whether a schedule is gap-free
without a sound card, and with a simulated clock, without timing anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class PlaybackReport:
    chunks: int
    audio_s: float
    underruns: int
    underrun_s: float
    max_gap_s: float
    # Time from the first arrival to the end of playback.
    playback_end_s: float

    def to_dict(self) -> dict:
        return asdict(self)


class PlaybackClock:
    """Plays chunks at `sample_rate` as they arrive and counts the gaps."""

    def __init__(self, sample_rate: int, prebuffer_s: float = 0.0, tolerance_s: float = 1e-6) -> None:
        self.sample_rate = sample_rate
        self.prebuffer_s = prebuffer_s
        # Float rounding on a simulated clock must not count as a gap.
        self.tolerance_s = tolerance_s
        self.gaps: list[tuple[int, float]] = []
        self._start: float | None = None
        self._play_end = 0.0
        self._chunks = 0
        self._samples = 0

    def add(self, arrival_s: float, samples: int) -> float:
        """Record a chunk; returns the gap (seconds of silence) before it plays."""
        gap = 0.0
        if self._start is None:
            self._start = arrival_s
            self._play_end = arrival_s + self.prebuffer_s
        elif arrival_s > self._play_end + self.tolerance_s:
            gap = arrival_s - self._play_end
            self.gaps.append((self._chunks, gap))
        self._play_end = max(self._play_end, arrival_s) + samples / self.sample_rate
        self._chunks += 1
        self._samples += samples
        return gap

    def report(self) -> PlaybackReport:
        return PlaybackReport(
            chunks=self._chunks,
            audio_s=self._samples / self.sample_rate,
            underruns=len(self.gaps),
            underrun_s=sum(g for _, g in self.gaps),
            max_gap_s=max((g for _, g in self.gaps), default=0.0),
            playback_end_s=self._play_end - self._start if self._start is not None else 0.0,
        )


def simulate(events: list[tuple[float, int]], sample_rate: int, prebuffer_s: float = 0.0) -> PlaybackReport:
    """Play a list of (arrival time, samples) events; the report of the run."""
    clock = PlaybackClock(sample_rate, prebuffer_s)
    for arrival, samples in events:
        clock.add(arrival, samples)
    return clock.report()
