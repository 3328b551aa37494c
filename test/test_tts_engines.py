"""Real TTS engines: non-silent speech of plausible length, streamed in pieces."""

from __future__ import annotations

import numpy as np
import pytest

from omni_ros.tts.config import TtsConfig
from omni_ros.tts.engine import TtsEngine, TtsError, available_engines, create_engine, register_engine
from omni_ros.tts.text import clean_text, split_text

SENTENCE = "The robot has picked up the red cup and is now placing it carefully into the blue bin on the left."


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples.astype(np.float64) ** 2)))


@pytest.fixture(scope="module")
def espeak() -> TtsEngine:
    return create_engine(TtsConfig(engine="espeak"))


@pytest.fixture(scope="module")
def piper() -> TtsEngine:
    return create_engine(TtsConfig(engine="piper", num_threads=1))


def check_speech(engine: TtsEngine, text: str) -> list[np.ndarray]:
    blocks = list(engine.stream(text))
    assert blocks and all(b.dtype == np.int16 and b.ndim == 1 for b in blocks)
    audio = np.concatenate(blocks)
    words = len(text.split())
    duration = len(audio) / engine.sample_rate
    # Speech runs at roughly 2.5 words per second.
    assert words / 2.5 / 2 < duration < words / 2.5 * 2, duration
    assert rms(audio) > 500, "speech should not be near-silent"
    return blocks


def test_espeak_streams_speech(espeak):
    assert espeak.sample_rate == 22050
    blocks = check_speech(espeak, SENTENCE)
    # Streaming: many small blocks, not one buffer at the end.
    assert len(blocks) > 10
    assert max(len(b) for b in blocks) < espeak.sample_rate // 4


def test_piper_streams_speech_in_growing_pieces(piper):
    assert piper.sample_rate == 22050
    pieces = piper.pieces(SENTENCE)
    assert len(pieces) >= 2 and " ".join(pieces) == SENTENCE
    assert len(pieces[0].split()) <= 6
    blocks = check_speech(piper, SENTENCE)
    assert len(blocks) == len(pieces)


def test_piper_stream_equals_piecewise_synthesis_when_deterministic(piper):
    from piper.config import SynthesisConfig

    saved = piper.synthesis
    # Zero noise makes the VITS voice deterministic.
    piper.synthesis = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    try:
        streamed = np.concatenate(list(piper.stream(SENTENCE)))
        whole = np.concatenate(
            [c.audio_int16_array for p in piper.pieces(SENTENCE) for c in piper.voice.synthesize(p, piper.synthesis)]
        )
    finally:
        piper.synthesis = saved
    np.testing.assert_array_equal(streamed, whole)


def test_espeak_rate_and_pitch_change_the_voice(espeak):
    slow = np.concatenate(list(create_engine(TtsConfig(rate=0.7)).stream(SENTENCE)))
    fast = np.concatenate(list(create_engine(TtsConfig(rate=1.6)).stream(SENTENCE)))
    assert len(fast) < 0.7 * len(slow)

    def pitch_hz(samples: np.ndarray, sr: int) -> float:
        # Median fundamental from the autocorrelation of voiced 40 ms frames.
        f0 = []
        n = int(0.04 * sr)
        for i in range(0, len(samples) - n, n):
            x = samples[i : i + n].astype(np.float64)
            if rms(x) < 1000:
                continue
            ac = np.correlate(x, x, "full")[n - 1 :]
            lo, hi = sr // 400, sr // 60
            f0.append(sr / (lo + int(np.argmax(ac[lo:hi]))))
        return float(np.median(f0))

    low = np.concatenate(list(create_engine(TtsConfig(pitch=10)).stream(SENTENCE)))
    high = np.concatenate(list(create_engine(TtsConfig(pitch=90)).stream(SENTENCE)))
    assert pitch_hz(high, 22050) > 1.2 * pitch_hz(low, 22050)


def test_espeak_closing_the_stream_early_frees_the_engine(espeak):
    stream = espeak.stream(SENTENCE * 20)
    next(stream)
    stream.close()
    # The library is not left mid-synthesis: the next utterance runs fully.
    check_speech(espeak, SENTENCE)


def test_two_espeak_users_in_one_process_take_turns():
    # libespeak-ng is process-global: concurrent users must be serialized, not hang.
    import threading

    engines = [create_engine(TtsConfig(engine="espeak", voice=v)) for v in ("en-us", "en")]
    results: dict[int, np.ndarray] = {}

    def speak(i: int) -> None:
        results[i] = np.concatenate([b for _ in range(3) for b in engines[i].stream(SENTENCE)])

    threads = [threading.Thread(target=speak, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "espeak users deadlocked"
    for audio in results.values():
        assert 3 * len(SENTENCE.split()) / 2.5 / 2 < len(audio) / 22050 and rms(audio) > 500
    assert len(results) == 2


def test_unsupported_characters_are_dropped_or_spoken(espeak, piper):
    text = "Cup\x00 placed\u200b 🤖 at 90° ✓\ud800 done."
    assert "\x00" not in clean_text(text) and "\ud800" not in clean_text(text)
    for engine in (espeak, piper):
        audio = np.concatenate(list(engine.stream(text)))
        assert rms(audio) > 500
    # Piper's raw-phoneme syntax in user text is read as text, not phonemes.
    assert "[[" not in " ".join(piper.pieces("say [[hɛloʊ]] now"))
    assert list(espeak.stream(" \t\n\x00 ")) == []
    assert list(piper.stream("   ")) == []


def test_espeak_and_piper_live_in_one_process(espeak, piper):
    # Piper links its own espeak-ng copy; neither may disturb the other.
    for _ in range(2):
        check_speech(espeak, "Checking the first engine now.")
        check_speech(piper, "Checking the second engine now.")


def test_configure_errors_are_clear(tmp_path):
    with pytest.raises(TtsError, match=r"unknown TTS engine 'festival'; known engines: .*espeak, piper"):
        create_engine(TtsConfig(engine="festival"))
    with pytest.raises(TtsError, match="unknown espeak voice 'xx-nowhere'"):
        create_engine(TtsConfig(engine="espeak", voice="xx-nowhere"))
    with pytest.raises(TtsError, match="piper voice file not found"):
        create_engine(TtsConfig(engine="piper", voice=str(tmp_path / "missing.onnx")))
    with pytest.raises(TtsError, match=r"must be a \.onnx file"):
        create_engine(TtsConfig(engine="piper", voice=str(tmp_path / "voice.txt")))
    bare = tmp_path / "bare.onnx"
    bare.write_bytes(b"not a model")
    with pytest.raises(TtsError, match="voice config not found"):
        create_engine(TtsConfig(engine="piper", voice=str(bare)))
    (tmp_path / "bare.onnx.json").write_text('{"audio": {"sample_rate": 22050}}')
    with pytest.raises(TtsError, match=r"cannot read piper voice config|cannot load piper voice"):
        create_engine(TtsConfig(engine="piper", voice=str(bare)))
    with pytest.raises(TtsError, match="pitch"):
        create_engine(TtsConfig(engine="espeak", pitch=150))


def test_registry_takes_new_engines_without_touching_callers(espeak):
    class Louder:
        """A wrapper engine: espeak at double gain."""

        name = "louder"

        def __init__(self, config: TtsConfig) -> None:
            self.inner = espeak
            self.sample_rate = espeak.sample_rate

        def stream(self, text):
            for block in self.inner.stream(text):
                yield np.clip(block.astype(np.int32) * 2, -32768, 32767).astype(np.int16)

        def close(self) -> None:
            pass

    register_engine("louder", Louder)
    assert "louder" in available_engines()
    engine = create_engine(TtsConfig(engine="louder"))
    assert isinstance(engine, TtsEngine)
    assert rms(np.concatenate(list(engine.stream(SENTENCE)))) > 1.5 * rms(np.concatenate(list(espeak.stream(SENTENCE))))


def test_split_text_grows_pieces_and_prefers_boundaries():
    text = (
        "Okay. The arm moves to the shelf, grasps the box, and lifts it slowly toward the table "
        "while the camera tracks the gripper; then it stops. Done!"
    )
    pieces = split_text(text, first_words=6, max_chars=240)
    assert " ".join(pieces) == text
    assert pieces[0] == "Okay."
    # No piece spans a sentence end.
    for piece in pieces:
        assert not any(w.endswith((".", "!", "?")) for w in piece.split()[:-1])
    # Mid-sentence cuts fall after clause marks where one is close.
    assert pieces[1] == "The arm moves to the shelf, grasps the box,"
    limits = [6 * 2**k for k in range(len(pieces))]
    assert all(len(p.split()) <= lim for p, lim in zip(pieces, limits, strict=True))
    long_pieces = split_text("word " * 5000, first_words=6, max_chars=100)
    assert all(len(p) <= 100 for p in long_pieces)
    assert sum(len(p.split()) for p in long_pieces) == 5000
