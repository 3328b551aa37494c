"""Where synthesized audio can go besides the AudioChunk topic.

`WavSink` writes one WAV file per utterance as its chunks arrive.
`PlaybackSink` plays on the local sound card through ALSA's `aplay`; on a
machine without an output device `open_playback` logs one line saying why
and returns None, so the node runs on without it.
"""

from __future__ import annotations

import glob
import logging
import queue
import re
import shutil
import subprocess
import threading
import wave
from pathlib import Path
from typing import Protocol

import numpy as np

log = logging.getLogger(__name__)


class AudioSink(Protocol):
    def begin(self, utterance_id: str, sample_rate: int) -> None: ...

    def write(self, samples: np.ndarray) -> None: ...

    def end(self, interrupted: bool) -> None: ...

    def close(self) -> None: ...


def _safe_name(utterance_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", utterance_id) or "utterance"


class WavSink:
    """One 16-bit mono WAV file per utterance in `directory`, named by utterance id.

    With `filename` every utterance goes to that one file (the last one wins).
    """

    def __init__(self, directory: str | Path, filename: str | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.filename = filename
        self.path: Path | None = None
        self._wav: wave.Wave_write | None = None

    def begin(self, utterance_id: str, sample_rate: int) -> None:
        self.end(False)
        self.path = self.directory / (self.filename or f"{_safe_name(utterance_id)}.wav")
        # Open across calls: chunks are appended as they arrive, closed in end().
        self._wav = wave.open(str(self.path), "wb")  # noqa: SIM115
        self._wav.setnchannels(1)
        self._wav.setsampwidth(2)
        self._wav.setframerate(sample_rate)

    def write(self, samples: np.ndarray) -> None:
        if self._wav is not None:
            self._wav.writeframes(np.asarray(samples, dtype="<i2").tobytes())

    def end(self, interrupted: bool) -> None:
        if self._wav is not None:
            self._wav.close()
            self._wav = None

    def close(self) -> None:
        self.end(False)


def audio_output_problem() -> str | None:
    """Why live playback cannot work here, or None when it can."""
    if shutil.which("aplay") is None:
        return "the aplay program (alsa-utils) is not installed"
    if not glob.glob("/dev/snd/pcmC*D*p"):
        return "no audio output device (no playback PCM under /dev/snd)"
    return None


def open_playback() -> PlaybackSink | None:
    """A PlaybackSink, or None (with one log line) where no device exists."""
    problem = audio_output_problem()
    if problem is not None:
        log.warning("live playback disabled: %s; continuing without it", problem)
        return None
    return PlaybackSink()


class PlaybackSink:
    """Plays utterances through `aplay`, fed by a thread so the caller never blocks."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._proc: subprocess.Popen | None = None
        self._rate = 0
        self._thread = threading.Thread(target=self._run, name="tts-playback", daemon=True)
        self._thread.start()

    def _restart(self, rate: int) -> None:
        self._stop_proc()
        self._rate = rate
        self._proc = subprocess.Popen(
            ["aplay", "-q", "-t", "raw", "-f", "S16_LE", "-c", "1", "-r", str(rate), "-"],
            stdin=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def _stop_proc(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            kind, value = item
            try:
                if kind == "begin" and value != self._rate:
                    self._restart(value)
                elif kind == "cut":
                    # Interrupted: silence what aplay still holds.
                    self._stop_proc()
                    self._rate = 0
                elif kind == "data" and self._proc is not None and self._proc.stdin is not None:
                    self._proc.stdin.write(value)
                    self._proc.stdin.flush()
            except OSError as exc:
                log.warning("live playback failed: %s", exc)
                self._stop_proc()
                self._rate = 0
        self._stop_proc()

    def begin(self, utterance_id: str, sample_rate: int) -> None:
        self._queue.put(("begin", sample_rate))

    def write(self, samples: np.ndarray) -> None:
        self._queue.put(("data", np.asarray(samples, dtype="<i2").tobytes()))

    def end(self, interrupted: bool) -> None:
        if interrupted:
            # Drop what has not reached aplay yet, then cut aplay itself.
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._queue.put(("cut", None))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=2.0)
