"""The TtsEngine interface and the registry that maps engine names to engines.

An engine turns text into int16 mono PCM and yields it while it synthesizes,
so the first audio can leave before the utterance is finished. New engines
(a codec-LM voice, say) register a factory here; the node and `omni-ros say`
only ever call `create_engine`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

import numpy as np

from omni_ros.tts.config import TtsConfig


class TtsError(RuntimeError):
    """The TTS engine cannot be configured or cannot synthesize this text."""


@runtime_checkable
class TtsEngine(Protocol):
    """A speech synthesizer that streams int16 mono PCM at `sample_rate`."""

    name: str
    sample_rate: int

    def stream(self, text: str) -> Iterator[np.ndarray]:
        """Yield 1-D int16 arrays as they are synthesized; closing the iterator cancels."""
        ...

    def close(self) -> None:
        """Release the engine's resources."""
        ...


EngineFactory = Callable[[TtsConfig], TtsEngine]

# Built-in engines by "module:factory", imported only when chosen so that an
# unused engine's libraries never load.
_BUILTIN: dict[str, str] = {
    "espeak": "omni_ros.tts.espeak:EspeakEngine",
    "piper": "omni_ros.tts.piper:PiperEngine",
}
_REGISTERED: dict[str, EngineFactory] = {}


def register_engine(name: str, factory: EngineFactory) -> None:
    """Make `factory(config)` available as engine `name` (replacing any before it)."""
    _REGISTERED[name] = factory


def available_engines() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTERED))


def create_engine(config: TtsConfig) -> TtsEngine:
    """Build the engine `config.engine`; raises TtsError naming the problem."""
    name = config.engine
    factory = _REGISTERED.get(name)
    if factory is None:
        target = _BUILTIN.get(name)
        if target is None:
            known = ", ".join(available_engines())
            raise TtsError(f"unknown TTS engine '{name}'; known engines: {known}")
        module, attr = target.split(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory(config)
