"""Streaming sample-rate conversion and PCM encoding for the published audio.

The resampler is a polyphase windowed-sinc interpolator that keeps the input
tail between calls, so feeding an utterance in any number of blocks gives
exactly the samples of converting it in one go: chunk boundaries never click.
"""

from __future__ import annotations

import math

import numpy as np

from omni_ros.tts.config import ENCODINGS


def _kaiser_beta(attenuation_db: float) -> float:
    if attenuation_db > 50:
        return 0.1102 * (attenuation_db - 8.7)
    return 0.5842 * (attenuation_db - 21) ** 0.4 + 0.07886 * (attenuation_db - 21)


class StreamResampler:
    """Converts int16 mono PCM from `in_rate` to `out_rate`, block by block."""

    def __init__(self, in_rate: int, out_rate: int, taps: int = 32, rolloff: float = 0.94) -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self.in_rate = int(in_rate)
        self.out_rate = int(out_rate)
        g = math.gcd(self.in_rate, self.out_rate)
        self.up = self.out_rate // g
        self.down = self.in_rate // g
        # Cut-off in input-rate units: below both Nyquist frequencies.
        scale = min(1.0, self.up / self.down) * rolloff
        half = math.ceil(taps / 2 / min(1.0, self.up / self.down))
        self._half = half
        # Table of filter taps for each of the `up` fractional input positions.
        offsets = np.arange(-half + 1, half + 1)
        frac = np.arange(self.up)[:, None] / self.up
        u = frac - offsets[None, :]
        window = np.kaiser(2 * half + 1, _kaiser_beta(80.0))
        # Window evaluated at u by interpolation (u lies in (-half, half)).
        w = np.interp(u, np.linspace(-half, half, 2 * half + 1), window)
        table = scale * np.sinc(scale * u) * w
        self._table = table / table.sum(axis=1, keepdims=True)
        self._offsets = offsets
        self.reset()

    @property
    def passthrough(self) -> bool:
        return self.up == self.down

    def reset(self) -> None:
        """Start a new utterance."""
        # Zeros stand in for the samples before the start.
        self._buf = np.zeros(self._half, dtype=np.float64)
        self._buf_start = -self._half
        self._n_in = 0
        self._m = 0

    def _produce(self, limit: int | None) -> np.ndarray:
        total = self._buf_start + len(self._buf)  # absolute index one past the last input
        # Output m needs inputs up to floor(m*down/up) + half.
        last = ((total - self._half) * self.up - 1) // self.down if total - self._half > 0 else -1
        stop = last + 1 if limit is None else min(last + 1, limit)
        if stop <= self._m:
            return np.zeros(0, dtype=np.int16)
        m = np.arange(self._m, stop)
        pos = m * self.down
        base = pos // self.up
        phase = pos % self.up
        idx = base[:, None] + self._offsets[None, :] - self._buf_start
        y = np.einsum("ij,ij->i", self._buf[idx], self._table[phase])
        self._m = stop
        keep_from = (self._m * self.down) // self.up - self._half + 1 - self._buf_start
        if keep_from > 0:
            self._buf = self._buf[keep_from:]
            self._buf_start += keep_from
        return np.clip(np.rint(y), -32768, 32767).astype(np.int16)

    def process(self, block: np.ndarray) -> np.ndarray:
        """Convert the next block; returns the output samples that are ready."""
        if self.passthrough:
            return np.asarray(block, dtype=np.int16)
        block = np.asarray(block, dtype=np.float64).reshape(-1)
        self._n_in += len(block)
        self._buf = np.concatenate([self._buf, block])
        return self._produce(None)

    def flush(self) -> np.ndarray:
        """The remaining output of the utterance; the resampler is then reset."""
        if self.passthrough:
            return np.zeros(0, dtype=np.int16)
        total_out = -(-self._n_in * self.up // self.down)
        self._buf = np.concatenate([self._buf, np.zeros(self._half + 1)])
        out = self._produce(total_out)
        self.reset()
        return out


def resample(samples: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """Convert a whole int16 signal (convenience wrapper of StreamResampler)."""
    r = StreamResampler(in_rate, out_rate)
    return np.concatenate([r.process(samples), r.flush()])


def encode_pcm(samples: np.ndarray, encoding: str = "S16LE", channels: int = 1) -> bytes:
    """int16 mono samples -> interleaved bytes in `encoding` with `channels` copies."""
    if encoding not in ENCODINGS:
        raise ValueError(f"unsupported audio encoding '{encoding}'; supported: {', '.join(ENCODINGS)}")
    if channels < 1:
        raise ValueError(f"channels must be at least 1, got {channels}")
    samples = np.asarray(samples, dtype=np.int16)
    if channels > 1:
        samples = np.repeat(samples, channels)
    if encoding == "S16LE":
        return samples.astype("<i2").tobytes()
    return (samples.astype(np.float32) / 32768.0).astype("<f4").tobytes()


def decode_pcm(data: bytes, encoding: str = "S16LE", channels: int = 1) -> np.ndarray:
    """Bytes of `encode_pcm` -> int16 samples of the first channel."""
    if encoding == "S16LE":
        samples = np.frombuffer(data, dtype="<i2").astype(np.int16)
    elif encoding == "F32LE":
        samples = np.clip(np.rint(np.frombuffer(data, dtype="<f4") * 32768.0), -32768, 32767).astype(np.int16)
    else:
        raise ValueError(f"unsupported audio encoding '{encoding}'")
    return samples[::channels] if channels > 1 else samples
