"""Streaming resampling keeps frequencies and lengths; PCM encodings round-trip."""

from __future__ import annotations

import numpy as np
import pytest

from omni_ros.tts.resample import StreamResampler, decode_pcm, encode_pcm, resample

PAIRS = [(22050, 16000), (22050, 48000), (16000, 22050), (22050, 44100), (24000, 16000)]


def tone(freq: float, rate: int, seconds: float = 1.0, amplitude: float = 10000) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return np.rint(amplitude * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    k = int(np.argmax(spectrum))
    # Parabolic interpolation between bins for sub-bin accuracy.
    a, b, c = np.log(spectrum[k - 1 : k + 2] + 1e-9)
    return (k + 0.5 * (a - c) / (a - 2 * b + c)) * rate / len(samples)


@pytest.mark.parametrize("in_rate,out_rate", PAIRS)
@pytest.mark.parametrize("freq", [440.0, 3000.0])
def test_sine_keeps_its_frequency_amplitude_and_duration(in_rate, out_rate, freq):
    x = tone(freq, in_rate)
    y = resample(x, in_rate, out_rate)
    assert len(y) == out_rate  # one second in, one second out
    assert peak_hz(y, out_rate) == pytest.approx(freq, abs=0.5)
    # Away from the edges the amplitude is preserved and the output is a clean sine.
    mid = y[out_rate // 10 : -out_rate // 10].astype(np.float64)
    assert np.sqrt(np.mean(mid**2)) == pytest.approx(10000 / np.sqrt(2), rel=0.01)
    ideal = tone(freq, out_rate)[out_rate // 10 : -out_rate // 10]
    assert np.max(np.abs(mid - ideal)) < 100


def test_downsampling_removes_what_the_new_rate_cannot_hold():
    # 10 kHz is above 8 kHz, the Nyquist frequency at 16 kHz: it must not alias to 6 kHz.
    y = resample(tone(10000, 22050), 22050, 16000)
    assert np.sqrt(np.mean(y.astype(np.float64) ** 2)) < 0.01 * 10000


@pytest.mark.parametrize("in_rate,out_rate", PAIRS)
def test_streaming_in_random_blocks_equals_one_shot(in_rate, out_rate):
    rng = np.random.default_rng(1)
    x = rng.integers(-8000, 8000, in_rate // 2).astype(np.int16)
    whole = resample(x, in_rate, out_rate)
    r = StreamResampler(in_rate, out_rate)
    parts, i = [], 0
    while i < len(x):
        n = int(rng.integers(1, 2000))
        parts.append(r.process(x[i : i + n]))
        i += n
    parts.append(r.flush())
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    # The resampler resets after flush: a second utterance gives the same result.
    np.testing.assert_array_equal(np.concatenate([r.process(x), r.flush()]), whole)


def test_same_rate_is_a_passthrough():
    x = tone(440, 22050, 0.1)
    r = StreamResampler(22050, 22050)
    assert r.passthrough
    np.testing.assert_array_equal(r.process(x), x)
    assert len(r.flush()) == 0


def test_loud_input_clips_instead_of_wrapping():
    x = np.tile(np.array([32767, 32767, -32768, -32768], dtype=np.int16), 2000)
    y = resample(x, 22050, 48000)
    assert y.dtype == np.int16 and y.max() > 20000 and y.min() < -20000


@pytest.mark.parametrize("encoding", ["S16LE", "F32LE"])
@pytest.mark.parametrize("channels", [1, 2])
def test_pcm_encodings_round_trip(encoding, channels):
    x = np.array([0, 1, -1, 32767, -32768, 1234], dtype=np.int16)
    data = encode_pcm(x, encoding, channels)
    assert len(data) == len(x) * channels * (2 if encoding == "S16LE" else 4)
    np.testing.assert_array_equal(decode_pcm(data, encoding, channels), x)
    if encoding == "S16LE":
        assert data[:4] == bytes([0, 0, 0, 0] if channels == 2 else [0, 0, 1, 0])


def test_bad_encoding_and_rates_are_rejected():
    with pytest.raises(ValueError, match="unsupported audio encoding"):
        encode_pcm(np.zeros(3, np.int16), "MP3")
    with pytest.raises(ValueError, match="positive"):
        StreamResampler(0, 16000)
