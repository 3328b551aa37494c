"""`omni-ros say`: speech to a WAV file without ROS, with TTFA and RTF printed."""

from __future__ import annotations

import json
import subprocess
import sys
import wave

import numpy as np
import pytest


def say(root, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omni_ros.cli", "say", *args], cwd=root, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("engine,rate", [("espeak", 0), ("piper", 16000)])
def test_say_writes_speech_and_reports_timing(root, tmp_path, engine, rate):
    out = tmp_path / "speech.wav"
    args = ["Gripper open, moving to the cup.", "--engine", engine, "--out", str(out), "--json"]
    if rate:
        args += ["--sample-rate", str(rate)]
    result = say(root, *args)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["engine"] == engine
    assert 0 < report["ttfa_s"] <= report["synth_s"] and report["rtf"] > 0
    with wave.open(str(out)) as wav:
        assert wav.getframerate() == report["sample_rate"] == (rate or 22050)
        audio = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
    assert len(audio) == round(report["audio_s"] * report["sample_rate"])
    assert 1.0 < report["audio_s"] < 6.0
    assert np.sqrt(np.mean(audio.astype(np.float64) ** 2)) > 300


def test_say_prints_ttfa_and_rtf(root):
    result = say(root, "Hello.")
    assert result.returncode == 0, result.stderr
    assert "TTFA" in result.stdout and "RTF" in result.stdout


@pytest.mark.parametrize(
    "args,code,message",
    [
        (["   "], 1, "nothing to say"),
        (["hi", "--engine", "festival"], 2, "unknown TTS engine 'festival'"),
        (["hi", "--engine", "piper", "--voice", "/nonexistent.onnx"], 2, "piper voice file not found"),
    ],
)
def test_say_bad_input(root, args, code, message):
    result = say(root, *args)
    assert result.returncode == code
    assert message in result.stderr and "Traceback" not in result.stderr
