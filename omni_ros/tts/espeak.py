"""eSpeak NG through the `espeakng-loader` wheel (libespeak-ng.so plus its data).

The library runs in its synchronous mode: `espeak_Synth` blocks while it
calls our callback with each ~60 ms block of 22.05 kHz audio as soon as it is
made, so a worker thread runs the call and the engine's iterator hands the
blocks on as they arrive. libespeak-ng keeps its voice, parameters and
callback in process globals, and two independent users in one process hang,
so the library is opened and initialised once per process and every
synthesis holds one process-wide lock.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
from collections.abc import Callable, Iterator

import numpy as np

from omni_ros.tts.config import TtsConfig
from omni_ros.tts.engine import TtsError
from omni_ros.tts.text import clean_text

log = logging.getLogger(__name__)

# espeak_AUDIO_OUTPUT: AUDIO_OUTPUT_SYNCHRONOUS.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
# Return an error instead of calling exit() when the data directory is bad.
_INITIALIZE_DONT_EXIT = 0x8000
_CHARS_UTF8 = 1
_POS_CHARACTER = 1
_PARAM_RATE = 1
_PARAM_PITCH = 3
_NORMAL_WPM = 175
_MIN_WPM, _MAX_WPM = 80, 450

_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class _Library:
    """The one libespeak-ng of this process, initialised once."""

    _instance: _Library | None = None
    _create_lock = threading.Lock()

    def __init__(self) -> None:
        try:
            import espeakng_loader
        except ImportError as exc:
            raise TtsError("the espeak engine needs the espeakng-loader package (pip install espeakng-loader)") from exc
        path = espeakng_loader.get_library_path()
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise TtsError(f"cannot load libespeak-ng from {path}: {exc}") from exc
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), _INITIALIZE_DONT_EXIT
        )
        if rate <= 0:
            raise TtsError(f"espeak-ng failed to initialise with data at {espeakng_loader.get_data_path()}")
        self.lib = lib
        self.sample_rate = int(rate)
        # Held for a whole synthesis: voice, parameters and callback are global.
        self.lock = threading.Lock()
        self._sink: Callable[[np.ndarray], bool] | None = None
        # Kept referenced for as long as the library may call it.
        self._callback = _SynthCallback(self._on_audio)
        lib.espeak_SetSynthCallback(self._callback)

    @classmethod
    def get(cls) -> _Library:
        with cls._create_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _on_audio(self, wav, numsamples: int, events) -> int:
        sink = self._sink
        if sink is None:
            return 1
        if wav and numsamples > 0:
            # Copy: the buffer is reused by the library after we return.
            block = np.ctypeslib.as_array(wav, shape=(numsamples,)).astype(np.int16, copy=True)
            if not sink(block):
                return 1  # abort the synthesis
        return 0

    def configure(self, voice: str, wpm: int, pitch: int) -> None:
        """Select voice and parameters; the caller holds `lock`."""
        if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise TtsError(
                f"unknown espeak voice '{voice}' (names as in espeak-ng-data/lang, e.g. en, en-us, de, fr, es)"
            )
        self.lib.espeak_SetParameter(_PARAM_RATE, wpm, 0)
        self.lib.espeak_SetParameter(_PARAM_PITCH, pitch, 0)

    def synth(self, text: str, sink: Callable[[np.ndarray], bool]) -> None:
        """Synthesize `text`, handing each block to `sink`; the caller holds `lock`.

        `sink` returns False to stop the synthesis early.
        """
        data = text.encode("utf-8")
        self._sink = sink
        try:
            status = self.lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        finally:
            self._sink = None
        if status != 0:
            raise TtsError(f"espeak_Synth failed with status {status}")


class EspeakEngine:
    """eSpeak NG: formant synthesis, ~1 ms to first audio, robotic but clear."""

    name = "espeak"

    def __init__(self, config: TtsConfig) -> None:
        self._lib = _Library.get()
        self.sample_rate = self._lib.sample_rate
        self.voice = config.voice or "en-us"
        if not 0 <= config.pitch <= 100:
            raise TtsError(f"tts.pitch must be within 0-100 for espeak, got {config.pitch}")
        self.pitch = int(config.pitch)
        self.wpm = round(min(max(_NORMAL_WPM * config.rate, _MIN_WPM), _MAX_WPM))
        # Check the voice now so a bad name fails at configure time.
        with self._lib.lock:
            self._lib.configure(self.voice, self.wpm, self.pitch)

    def stream(self, text: str) -> Iterator[np.ndarray]:
        text = clean_text(text)
        if not text:
            return
        blocks: queue.Queue = queue.Queue()
        stop = threading.Event()
        done = object()

        def sink(block: np.ndarray) -> bool:
            if stop.is_set():
                return False
            blocks.put(block)
            return True

        def work() -> None:
            try:
                with self._lib.lock:
                    self._lib.configure(self.voice, self.wpm, self.pitch)
                    self._lib.synth(text, sink)
            except Exception as exc:  # handed to the consumer
                blocks.put(exc)
            finally:
                blocks.put(done)

        worker = threading.Thread(target=work, name="espeak-synth", daemon=True)
        worker.start()
        try:
            while True:
                item = blocks.get()
                if item is done:
                    break
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            # Closing the iterator early aborts the synthesis at its next block.
            stop.set()
            worker.join()

    def close(self) -> None:
        # The library stays loaded for the process: re-initialising it is what hangs.
        pass
