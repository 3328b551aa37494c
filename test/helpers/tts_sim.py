"""A simulated clock and a synthesizer that produces frames at a set speed on it."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class SimClock:
    """Time that only moves when the simulated synthesizer works."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def frames_at_speed(
    clock: SimClock, n_frames: int, frame_samples: int, sample_rate: int, speed: float, latency_s: float = 0.0
) -> Iterator[np.ndarray]:
    """Yield `n_frames` frames, each made in frame duration / `speed` seconds of `clock`."""
    clock.now += latency_s
    for i in range(n_frames):
        clock.now += frame_samples / sample_rate / speed
        # A distinct ramp per frame so lost or reordered samples show.
        yield (np.arange(frame_samples) + i * frame_samples).astype(np.int16)
