"""Engine -> resampler -> scheduler in one pipeline, as the node and `omni-ros say` use it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from omni_ros.tts.config import TtsConfig, TtsScheduleConfig
from omni_ros.tts.engine import create_engine
from omni_ros.tts.pipeline import TtsPipeline, UtteranceStats
from omni_ros.tts.resample import resample

TEXT = "Placing the cup in the bin, then returning to the home pose. The task is complete."


@pytest.fixture(scope="module")
def piper_quiet():
    from piper.config import SynthesisConfig

    engine = create_engine(TtsConfig(engine="piper", num_threads=1))
    # Zero noise makes the voice deterministic, so outputs can be compared exactly.
    engine.synthesis = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    return engine


@pytest.mark.parametrize("rate", [16000, 48000])
def test_pipeline_output_is_the_resampled_engine_output(piper_quiet, rate):
    config = TtsConfig(engine="piper", output_sample_rate=rate)
    pipeline = TtsPipeline(piper_quiet, config)
    assert pipeline.sample_rate == rate
    stats = UtteranceStats()
    chunks = list(pipeline.synthesize(TEXT, stats=stats))
    reference = resample(np.concatenate(list(piper_quiet.stream(TEXT))), piper_quiet.sample_rate, rate)
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), reference)
    assert chunks[-1].final and not any(c.final for c in chunks[:-1])
    assert stats.audio_s == pytest.approx(len(reference) / rate)
    assert stats.chunks == len(chunks) and not stats.interrupted
    assert 0 < stats.ttfa_s < stats.synth_s and stats.rtf == pytest.approx(stats.synth_s / stats.audio_s)


def test_chunk_sizes_follow_the_ramp_at_the_output_rate(piper_quiet):
    schedule = TtsScheduleConfig(mode="ramp", first_chunk_ms=40, ramp_ms=[80, 160], steady_chunk_ms=320)
    pipeline = TtsPipeline(piper_quiet, TtsConfig(output_sample_rate=16000, schedule=schedule))
    sizes = [len(c.samples) for c in pipeline.synthesize(TEXT)]
    assert sizes[:4] == [640, 1280, 2560, 5120]
    assert set(sizes[4:-1]) == {5120}


def test_cancel_ends_the_stream_at_the_next_chunk():
    engine = create_engine(TtsConfig(engine="espeak"))
    pipeline = TtsPipeline(engine, TtsConfig())
    cancel = threading.Event()
    stats = UtteranceStats()
    got = []
    for chunk in pipeline.synthesize(TEXT * 20, cancel=cancel, stats=stats):
        got.append(chunk)
        if len(got) == 2:
            cancel.set()
    assert len(got) == 2 and not any(c.final for c in got)
    assert stats.interrupted
    assert pipeline.wait_idle(5.0)
    # The engine is free again for the next utterance.
    assert list(pipeline.synthesize("Next."))[-1].final


def test_bad_output_settings_are_rejected():
    engine = create_engine(TtsConfig(engine="espeak"))
    with pytest.raises(ValueError, match="output_channels"):
        TtsPipeline(engine, TtsConfig(output_channels=0))
    with pytest.raises(ValueError, match="output_sample_rate"):
        TtsPipeline(engine, TtsConfig(output_sample_rate=-1))
