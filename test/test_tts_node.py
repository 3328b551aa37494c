"""The TTS node over real DDS: text from this process, AudioChunks from a node process."""

from __future__ import annotations

import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import yaml

from helpers.tts_client import TtsClient, start_tts_node, stop_process, tts_topics

PARAGRAPH = (
    "The robot is now picking up the red cup from the table and will place it carefully in the blue bin "
    "on the left side of the workspace. After that it returns to its home pose, checks the gripper, and "
    "waits for the next instruction from the operator. All joints are within their limits and the task "
    "queue is empty, so the arm will rest until someone asks for something new."
)


@pytest.fixture(scope="module")
def ros_node():
    import rclpy

    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node("tts_test_client", context=context)
    yield node
    node.destroy_node()
    context.try_shutdown()


def node_fixture(request, ros_node, tmp_path_factory, namespace: str, expect_in_log: tuple[str, ...], **tts):
    root = request.config.rootpath
    tmp = tmp_path_factory.mktemp(namespace)
    # Topics of this run only, even if a node of another run shares the domain.
    proc, section = start_tts_node(root, tmp, f"{namespace}_{os.getpid()}", **tts)
    try:
        client = TtsClient(ros_node, section)
        client.wait_connected(proc)
        client.handshake(proc)
    except BaseException:
        print(stop_process(proc))
        raise
    yield proc, client, tmp
    out = stop_process(proc)
    assert "Traceback" not in out, out
    assert proc.returncode == 0, out
    for line in expect_in_log:
        assert line in out, (line, out)


@pytest.fixture(scope="module")
def espeak_node(request, ros_node, tmp_path_factory):
    yield from node_fixture(
        request,
        ros_node,
        tmp_path_factory,
        "tts_espeak",
        ("with espeak", "live playback disabled"),
        engine="espeak",
        output_sample_rate=16000,
        wav_dir=str(tmp_path_factory.mktemp("wav")),
        max_text_chars=2000,
        # No sound card here: the node must say so once and carry on.
        playback=True,
    )


@pytest.fixture(scope="module")
def piper_node(request, ros_node, tmp_path_factory):
    # The node says which engine it speaks with, and logs the interrupts the tests below make.
    expected = ("with piper (22050 Hz)", "interrupt: cancelling", " interrupted: ttfa")
    yield from node_fixture(request, ros_node, tmp_path_factory, "tts_piper", expected, engine="piper")


def check_utterance(client: TtsClient, utterance_id: str, interrupted: bool = False) -> np.ndarray:
    msgs = sorted(client.chunks[utterance_id], key=lambda m: m.seq)
    assert [m.seq for m in msgs] == list(range(len(msgs))), "seq must be contiguous from 0"
    assert [m.first for m in msgs] == [True] + [False] * (len(msgs) - 1)
    assert [m.final for m in msgs] == [False] * (len(msgs) - 1) + [True]
    if interrupted:
        assert len(msgs[-1].data) == 0, "an interrupted utterance ends with an empty final chunk"
    return np.concatenate(client.audio(utterance_id))


def report_for(client: TtsClient, utterance_id: str) -> dict:
    assert client.spin_until(lambda: any(r["utterance_id"] == utterance_id for r in client.utterance_reports()), 10)
    return next(r for r in client.utterance_reports() if r["utterance_id"] == utterance_id)


def test_texts_become_ordered_audio_chunk_streams(espeak_node):
    proc, client, _ = espeak_node
    texts = ["Moving to the shelf now.", "Grasping the red cup.", "Done."]
    client.say("")
    client.say("   \n\t")
    for text in texts:
        client.say(text)
    assert client.spin_until(lambda: len(client.finished()) >= 3, 30, proc)
    ids = client.finished()
    assert len(ids) == 3 and len(set(ids)) == 3
    for utterance_id, text in zip(ids, texts, strict=True):
        msgs = client.chunks[utterance_id]
        assert {(m.sample_rate, m.channels, m.encoding) for m in msgs} == {(16000, 1, "S16LE")}
        audio = check_utterance(client, utterance_id)
        report = report_for(client, utterance_id)
        assert report["text"] == text and not report["interrupted"] and report["error"] == ""
        # What arrived is exactly what the node reports having synthesized.
        assert len(audio) == round(report["audio_s"] * 16000)
        assert len(text.split()) / 2.5 / 3 < report["audio_s"] < len(text.split()) / 2.5 * 3
        assert np.sqrt(np.mean(audio.astype(np.float64) ** 2)) > 300
        assert report["ttfa_s"] > 0 and report["rtf"] > 0 and report["underruns"] == 0
    # The empty texts produced no audio, only status reports.
    ignored = [s for s in client.statuses if s.get("event") == "ignored"]
    assert len(ignored) == 2
    assert len(client.order) == 3


def test_wav_sink_holds_what_was_published(espeak_node):
    proc, client, _ = espeak_node
    client.say("Writing this sentence to a file.")
    before = set(client.finished())
    assert client.spin_until(lambda: len(set(client.finished()) - before) == 1, 30, proc)
    (utterance_id,) = set(client.finished()) - before
    audio = check_utterance(client, utterance_id)
    report_for(client, utterance_id)  # the WAV file is closed before the report goes out
    config_path = Path(next(a for a in proc.args if a.endswith(".yaml")))
    path = Path(yaml.safe_load(config_path.read_text())["tts"]["wav_dir"]) / f"{utterance_id}.wav"
    with wave.open(str(path)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (16000, 1, 2)
        np.testing.assert_array_equal(np.frombuffer(wav.readframes(wav.getnframes()), "<i2"), audio)


def test_long_text_is_cut_and_never_blocks_the_node(espeak_node):
    proc, client, _ = espeak_node
    before = len(client.order)
    client.say("Status report. " * 2000)  # 30000 characters, cut to max_text_chars
    assert client.spin_until(lambda: len(client.order) > before, 30, proc)
    long_id = client.order[before]
    # The node answers its service while it streams minutes of audio.
    response = client.call_stop()
    assert response.success
    client.say("Still listening.")
    assert client.spin_until(lambda: len(client.finished()) >= before + 2, 60, proc)
    long_report, short_report = report_for(client, long_id), report_for(client, client.order[before + 1])
    assert long_report["chars"] <= 2000
    # Stopped mid-stream or already through: either way a complete, well-formed stream.
    check_utterance(client, long_id, interrupted=long_report["interrupted"])
    if long_report["interrupted"]:
        assert long_id in response.message
    assert short_report["text"] == "Still listening." and not short_report["interrupted"]
    check_utterance(client, client.order[before + 1])


def test_interrupt_cancels_the_current_utterance_and_the_queue(piper_node):
    proc, client, _ = piper_node
    client.say(PARAGRAPH)
    client.say("This queued sentence must never be spoken.")
    assert client.spin_until(lambda: len(client.order) >= 1, 30, proc)
    first = client.order[0]
    client.say("Stop, obstacle ahead.", interrupt=True)
    assert client.spin_until(lambda: len(client.finished()) >= 2, 30, proc)
    assert client.finished()[:2] == [first, client.order[1]]
    cut = check_utterance(client, first, interrupted=True)
    report = report_for(client, first)
    assert report["interrupted"]
    # Far less than the paragraph's ~20 s was sent.
    assert len(cut) / 22050 < 10
    urgent = client.order[1]
    assert report_for(client, urgent)["text"] == "Stop, obstacle ahead."
    check_utterance(client, urgent)
    # The queued sentence was dropped with the interrupted one.
    client.spin_until(lambda: False, 1.0, proc)
    assert len(client.order) == 2

    # A prefix on the normal topic interrupts too.
    client.say(PARAGRAPH)
    assert client.spin_until(lambda: len(client.order) >= 3, 30, proc)
    client.say("!Halt.")
    assert client.spin_until(lambda: len(client.finished()) >= 4, 30, proc)
    check_utterance(client, client.order[2], interrupted=True)
    assert report_for(client, client.order[3])["text"] == "Halt."


def test_stop_service_cancels_within_a_chunk(piper_node):
    proc, client, _ = piper_node
    start = len(client.order)
    client.say(PARAGRAPH)
    assert client.spin_until(lambda: len(client.order) > start, 30, proc)
    utterance_id = client.order[start]
    response = client.call_stop()
    assert response.success and utterance_id in response.message
    assert client.spin_until(lambda: utterance_id in client.finished(), 10, proc)
    check_utterance(client, utterance_id, interrupted=True)
    assert report_for(client, utterance_id)["interrupted"]
    # Stopping while idle is harmless.
    assert "nothing" in client.call_stop().message


@pytest.mark.parametrize(
    "tts,message",
    [
        ({"engine": "festival"}, "unknown TTS engine 'festival'"),
        ({"engine": "piper", "voice": "/nonexistent/voice.onnx"}, "piper voice file not found"),
        ({"engine": "espeak", "voice": "xx-nowhere"}, "unknown espeak voice"),
        ({"engine": "espeak", "output_encoding": "MP3"}, "tts.output_encoding: expected one of"),
    ],
)
def test_bad_engine_config_fails_at_start_with_a_clear_error(root, tmp_path, tts, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"tts": {**tts_topics("tts_bad"), **tts}}))
    result = subprocess.run(
        [sys.executable, "-m", "omni_ros.nodes.tts_node", "--config", str(path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
