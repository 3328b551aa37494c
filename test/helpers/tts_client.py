"""The listening side of TTS node tests: talks to a TTS node in another process.

`TtsClient` publishes voice-feedback text, calls the stop service and collects
AudioChunk and status messages, all over DDS in the test's own process.
`start_tts_node` runs `python -m omni_ros.nodes.tts_node` with a config file
whose topics live under a namespace of the test's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import yaml
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String
from std_srvs.srv import Trigger

from omni_ros.msg import AudioChunk
from omni_ros.tts.resample import decode_pcm


def tts_topics(namespace: str) -> dict:
    return {
        "text_topic": f"/{namespace}/voice_feedback",
        "interrupt_topic": f"/{namespace}/voice_feedback/interrupt",
        "audio_topic": f"/{namespace}/audio",
        "status_topic": f"/{namespace}/tts/status",
        "stop_service": f"/{namespace}/tts/stop",
    }


def start_tts_node(root: Path, tmp_path: Path, namespace: str, **tts) -> tuple[subprocess.Popen, dict]:
    """Start a TTS node process; returns it and its tts config section."""
    section = {**tts_topics(namespace), **tts}
    path = tmp_path / f"{namespace}.yaml"
    path.write_text(yaml.safe_dump({"name": namespace, "tts": section}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_ros.nodes.tts_node", "--config", str(path)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, section


def stop_process(proc: subprocess.Popen) -> str:
    """Stop a node process (SIGINT, then kill) and return its output."""
    if proc.poll() is None:
        proc.send_signal(2)
        try:
            out, _ = proc.communicate(timeout=10)
            return out
        except subprocess.TimeoutExpired:
            proc.kill()
    out, _ = proc.communicate(timeout=10)
    return out


class TtsClient:
    def __init__(self, node, section: dict) -> None:
        from rclpy.executors import SingleThreadedExecutor

        self.node = node
        self.section = section
        self.executor = SingleThreadedExecutor(context=node.context)
        self.executor.add_node(node)
        qos = QoSProfile(depth=500, reliability=ReliabilityPolicy.RELIABLE)
        self.text_pub = node.create_publisher(String, section["text_topic"], 50)
        self.interrupt_pub = node.create_publisher(String, section["interrupt_topic"], 50)
        self.stop_client = node.create_client(Trigger, section["stop_service"])
        self.chunks: dict[str, list[AudioChunk]] = defaultdict(list)
        self.order: list[str] = []  # utterance ids in order of first arrival
        self.arrivals: list[tuple[float, AudioChunk]] = []
        self.statuses: list[dict] = []
        node.create_subscription(AudioChunk, section["audio_topic"], self._on_audio, qos)
        node.create_subscription(String, section["status_topic"], self._on_status, 50)

    def _on_audio(self, msg: AudioChunk) -> None:
        if msg.utterance_id not in self.chunks:
            self.order.append(msg.utterance_id)
        self.chunks[msg.utterance_id].append(msg)
        self.arrivals.append((time.monotonic(), msg))

    def _on_status(self, msg: String) -> None:
        self.statuses.append(json.loads(msg.data))

    def spin_until(self, predicate, timeout: float, proc: subprocess.Popen | None = None) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"TTS node exited early:\n{proc.communicate()[0]}")
            self.executor.spin_once(timeout_sec=0.01)
        return predicate()

    def wait_connected(self, proc: subprocess.Popen, timeout: float = 60.0) -> None:
        ok = self.spin_until(
            lambda: (
                self.text_pub.get_subscription_count() > 0
                and self.interrupt_pub.get_subscription_count() > 0
                and self.node.count_publishers(self.section["audio_topic"]) > 0
                and self.node.count_publishers(self.section["status_topic"]) > 0
                and self.stop_client.service_is_ready()
            ),
            timeout,
            proc,
        )
        assert ok, "the TTS node did not connect"

    def handshake(self, proc: subprocess.Popen, tries: int = 10) -> None:
        """Speak until one whole utterance arrives, then forget it.

        Seeing the node's publisher does not mean its writer has matched our
        reader yet; until it has, chunks are dropped at the writer.
        """
        for _ in range(tries):
            done = len(self.finished())
            self.say("Ready.")
            if self.spin_until(lambda d=done: len(self.finished()) > d, 10, proc):
                utterance_id = self.finished()[-1]
                if sorted(m.seq for m in self.chunks[utterance_id])[0] == 0:
                    # Let its status report arrive too, then start clean.
                    self.spin_until(
                        lambda u=utterance_id: any(r["utterance_id"] == u for r in self.utterance_reports()), 5
                    )
                    self.chunks.clear()
                    self.order.clear()
                    self.arrivals.clear()
                    self.statuses.clear()
                    return
        raise AssertionError("no complete utterance arrived from the TTS node")

    def say(self, text: str, interrupt: bool = False) -> None:
        msg = String()
        msg.data = text
        (self.interrupt_pub if interrupt else self.text_pub).publish(msg)

    def call_stop(self, timeout: float = 10.0) -> Trigger.Response:
        future = self.stop_client.call_async(Trigger.Request())
        assert self.spin_until(future.done, timeout), "stop service did not answer"
        return future.result()

    def finished(self) -> list[str]:
        """Utterance ids whose final chunk has arrived, in arrival order."""
        return [u for u in self.order if any(m.final for m in self.chunks[u])]

    def audio(self, utterance_id: str) -> list:
        msgs = sorted(self.chunks[utterance_id], key=lambda m: m.seq)
        return [decode_pcm(bytes(m.data), m.encoding, m.channels) for m in msgs]

    def utterance_reports(self) -> list[dict]:
        return [s for s in self.statuses if s.get("event") == "utterance"]
