"""Chunk schedules on a simulated clock: sizes, sample integrity and playback gaps."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from helpers.tts_sim import SimClock, frames_at_speed
from omni_ros.config import OmniConfig, from_dict
from omni_ros.tts.config import TtsScheduleConfig
from omni_ros.tts.playback import PlaybackClock, simulate
from omni_ros.tts.scheduler import ChunkScheduler

SR = 24000
FRAME = 1920  # one 80 ms codec frame at 24 kHz, as in Qwen3-TTS
FRAME_S = FRAME / SR


def run(config: TtsScheduleConfig, speed: float, n_frames: int = 100, frame: int = FRAME, latency: float = 0.0):
    clock = SimClock()
    scheduler = ChunkScheduler(config, SR, clock)
    chunks = list(scheduler.run(frames_at_speed(clock, n_frames, frame, SR, speed, latency)))
    report = simulate([(c.time_s, len(c.samples)) for c in chunks if len(c.samples)], SR)
    return chunks, report


def one_to_25() -> TtsScheduleConfig:
    return TtsScheduleConfig(mode="fixed", first_chunk_ms=80, steady_chunk_ms=25 * 80)


def test_playback_clock_counts_gaps():
    clock = PlaybackClock(1000)
    assert clock.add(0.0, 100) == 0.0  # plays 0.0-0.1
    assert clock.add(0.05, 100) == 0.0  # queued: plays 0.1-0.2
    assert clock.add(0.25, 100) == pytest.approx(0.05)  # 50 ms of silence first
    report = clock.report()
    assert (report.underruns, report.chunks) == (1, 3)
    assert report.underrun_s == pytest.approx(0.05)
    assert report.playback_end_s == pytest.approx(0.35)
    # A pre-buffer absorbs a late chunk.
    assert simulate([(0.0, 100), (0.25, 100)], 1000, prebuffer_s=0.2).underruns == 0


@pytest.mark.parametrize(
    "config,expected_ms",
    [
        (TtsScheduleConfig(mode="fixed", first_chunk_ms=80, steady_chunk_ms=400), [80] + [400] * 4),
        (
            TtsScheduleConfig(mode="ramp", first_chunk_ms=40, ramp_ms=[40, 80, 160, 320], steady_chunk_ms=640),
            [40, 40, 80, 160, 320] + [640] * 2,
        ),
    ],
)
def test_planned_schedules_follow_the_config(config, expected_ms):
    chunks, _ = run(config, speed=50.0, n_frames=200, frame=480)  # 4 s of audio in 20 ms frames
    sizes = [round(1000 * len(c.samples) / SR) for c in chunks]
    assert sizes[: len(expected_ms)] == expected_ms
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]


@pytest.mark.parametrize("mode", ["fixed", "ramp", "adaptive"])
@pytest.mark.parametrize("frame", [480, 1324, 1920])
def test_chunks_concatenate_to_the_engine_output(mode, frame):
    clock = SimClock()
    source = list(frames_at_speed(clock, 37, frame, SR, 3.0))
    clock = SimClock()
    chunks = list(
        ChunkScheduler(TtsScheduleConfig(mode=mode), SR, clock).run(frames_at_speed(clock, 37, frame, SR, 3.0))
    )
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), np.concatenate(source))


def test_one_then_25_frames_leaves_the_expected_gap():
    # vLLM-Omni's codec streaming: one frame first, then 25-frame chunks, at 156 frames/s.
    speed = 156 * FRAME_S
    _, report = run(one_to_25(), speed)
    # Chunk 0 arrives after frame 1 and plays one frame; chunk 1 needs frame 26.
    expected_gap = 26 / 156 - (1 / 156 + FRAME_S)
    assert report.underruns == 1
    assert report.max_gap_s == pytest.approx(expected_gap, abs=1e-9)
    assert report.underrun_s == pytest.approx(0.0803, abs=1e-3)


@pytest.mark.parametrize("speed", [2.0, 156 * FRAME_S])
def test_ramp_and_adaptive_play_without_gaps_where_1_to_25_stalls(speed):
    _, fixed = run(one_to_25(), speed)
    assert fixed.underruns >= 1
    for config in (
        TtsScheduleConfig(mode="ramp", first_chunk_ms=40, ramp_ms=[40, 80, 160], steady_chunk_ms=320),
        TtsScheduleConfig(mode="adaptive", first_chunk_ms=40, steady_chunk_ms=320),
        # Adaptive with vLLM-Omni's sizes: a one-frame start and 25-frame chunks at most.
        TtsScheduleConfig(mode="adaptive", first_chunk_ms=80, min_chunk_ms=80, steady_chunk_ms=2000),
    ):
        chunks, report = run(config, speed)
        assert report.underruns == 0, (config, report)
        # Same first-audio time as the stalling schedule: the gain is not bought with latency.
        assert chunks[0].time_s <= 1.0 / 156 + FRAME_S / speed


def test_adaptive_grows_chunks_with_the_measured_speed():
    config = TtsScheduleConfig(mode="adaptive", first_chunk_ms=40, steady_chunk_ms=2000)
    slow, slow_report = run(config, speed=1.5, n_frames=60)
    fast, fast_report = run(config, speed=20.0, n_frames=60)
    assert slow_report.underruns == 0 and fast_report.underruns == 0
    # Faster synthesis allows bigger chunks sooner: fewer messages for the same audio.
    assert len(fast) < len(slow)
    assert max(len(c.samples) for c in fast) == round(2.0 * SR)


def test_adaptive_stays_gap_free_where_a_fixed_ramp_outgrows_slow_synthesis():
    # At 1.5x real time a doubling ramp grows faster than synthesis keeps up;
    # adaptive sizing measures the speed and grows only as fast as it allows.
    ramp = TtsScheduleConfig(mode="ramp", first_chunk_ms=40, ramp_ms=[40, 80, 160], steady_chunk_ms=320)
    adaptive = TtsScheduleConfig(mode="adaptive", first_chunk_ms=40, steady_chunk_ms=320)
    _, ramp_report = run(ramp, speed=1.5)
    _, adaptive_report = run(adaptive, speed=1.5)
    assert ramp_report.underruns >= 1
    assert adaptive_report.underruns == 0


def test_cancel_stops_without_a_final_chunk():
    clock = SimClock()
    cancel = threading.Event()
    out = []
    for chunk in ChunkScheduler(TtsScheduleConfig(mode="fixed"), SR, clock).run(
        frames_at_speed(clock, 100, FRAME, SR, 10.0), cancel
    ):
        out.append(chunk)
        if len(out) == 3:
            cancel.set()
    assert len(out) == 3 and not any(c.final for c in out)


def test_empty_stream_gives_one_empty_final_chunk():
    chunks = list(ChunkScheduler(TtsScheduleConfig(), SR, SimClock()).run(iter([])))
    assert len(chunks) == 1 and chunks[0].final and len(chunks[0].samples) == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"first_chunk_ms": 0},
        {"ramp_ms": [40, -1]},
        {"safety_margin": -0.5},
        {"min_chunk_ms": 500, "steady_chunk_ms": 320},
    ],
)
def test_bad_schedules_are_rejected(bad):
    # The schedule checks itself when it is built, so a bad one never reaches a ChunkScheduler.
    with pytest.raises(ValueError, match=r"tts\.schedule"):
        from_dict(OmniConfig, {"tts": {"schedule": bad}})
