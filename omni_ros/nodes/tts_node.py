"""TTS node: voice-feedback text in, `omni_ros/AudioChunk` stream out.

    python -m omni_ros.nodes.tts_node [--config FILE] [--engine piper] [--voice PATH]

Subscribes to `tts.text_topic` (std_msgs/String) and speaks each text as one
utterance: AudioChunk messages with one utterance id, seq 0, 1, 2, ..., the
first flagged `first` and the last `final`. Utterances queue in order. A text
on `tts.interrupt_topic` (or starting with `tts.interrupt_prefix`) cancels
the current utterance and the queue and is spoken next; the `tts.stop_service`
Trigger cancels both. A cancelled utterance ends with an empty final chunk.
Each finished utterance is reported (TTFA, RTF, simulated underruns) as JSON
on `tts.status_topic` and in the log. Synthesis runs on a worker thread, so
the ROS callbacks only queue work and never wait for an engine.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String
from std_srvs.srv import Trigger

from omni_ros.msg import AudioChunk
from omni_ros.tts.config import TtsConfig
from omni_ros.tts.engine import TtsEngine, create_engine
from omni_ros.tts.pipeline import TtsPipeline, UtteranceStats
from omni_ros.tts.resample import encode_pcm
from omni_ros.tts.sinks import AudioSink, WavSink, open_playback
from omni_ros.tts.text import clean_text

# Audio must not be dropped: reliable, with room for a few utterances.
AUDIO_QOS = QoSProfile(
    depth=500,
    history=HistoryPolicy.KEEP_LAST,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)
TEXT_QOS = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)


@dataclass
class Utterance:
    utterance_id: str
    text: str
    received: float


class TtsNode(Node):
    """Speaks voice-feedback text as AudioChunk messages (see module docstring)."""

    def __init__(
        self, config: TtsConfig, engine: TtsEngine | None = None, node_name: str = "omni_ros_tts", **kwargs
    ) -> None:
        # Build the engine first: a bad engine or voice fails here, at configure time.
        engine = engine if engine is not None else create_engine(config)
        pipeline = TtsPipeline(engine, config)
        super().__init__(node_name, **kwargs)
        self.config = config
        self.engine = engine
        self.pipeline = pipeline
        self._prefix = f"tts-{uuid.uuid4().hex[:6]}"
        self._count = 0
        self._queue: collections.deque[Utterance] = collections.deque()
        self._cond = threading.Condition()
        self._cancel = threading.Event()
        self._current: Utterance | None = None
        self._running = True
        # The latest reports, for tests and tools that hold the node in-process.
        self.finished: collections.deque[UtteranceStats] = collections.deque(maxlen=100)

        self._audio_pub = self.create_publisher(AudioChunk, config.audio_topic, AUDIO_QOS)
        self._status_pub = self.create_publisher(String, config.status_topic, TEXT_QOS)
        self.create_subscription(String, config.text_topic, self._on_text, TEXT_QOS)
        if config.interrupt_topic:
            self.create_subscription(String, config.interrupt_topic, self._on_interrupt, TEXT_QOS)
        self.create_service(Trigger, config.stop_service, self._on_stop)

        self._sinks: list[AudioSink] = []
        if config.wav_dir:
            self._sinks.append(WavSink(config.wav_dir))
        if config.playback:
            playback = open_playback()
            if playback is not None:
                self._sinks.append(playback)

        self._worker = threading.Thread(target=self._work, name="tts-node-worker", daemon=True)
        self._worker.start()
        self.get_logger().info(
            f"speaking {config.text_topic} with {engine.name} ({engine.sample_rate} Hz) -> {config.audio_topic} "
            f"at {pipeline.sample_rate} Hz {config.output_encoding}, schedule {config.schedule.mode}"
        )

    # ROS callbacks: only queue work.

    def _on_text(self, msg: String) -> None:
        text = msg.data
        prefix = self.config.interrupt_prefix
        if prefix and text.lstrip().startswith(prefix):
            self.say(text.lstrip()[len(prefix) :], interrupt=True)
        else:
            self.say(text)

    def _on_interrupt(self, msg: String) -> None:
        self.say(msg.data, interrupt=True)

    def _on_stop(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        current, dropped = self.stop()
        response.success = True
        response.message = f"stopped {current or 'nothing'}; dropped {dropped} queued"
        return response

    # Queue control, callable from any thread.

    def say(self, text: str, interrupt: bool = False) -> str | None:
        """Queue `text` (first, after cancelling everything, if `interrupt`); its utterance id."""
        received = time.monotonic()
        cleaned = clean_text(text)
        if not cleaned:
            self.get_logger().info("ignored voice feedback with no speakable text")
            self._publish_status({"event": "ignored", "reason": "empty text", "chars": len(text)})
            return None
        limit = self.config.max_text_chars
        if len(cleaned) > limit:
            cut = cleaned.rfind(" ", 0, limit)
            cleaned = cleaned[: cut if cut > 0 else limit]
            self.get_logger().warning(f"voice feedback of {len(text)} characters cut to {len(cleaned)}")
        with self._cond:
            self._count += 1
            utt = Utterance(f"{self._prefix}-{self._count}", cleaned, received)
            if interrupt:
                dropped = len(self._queue)
                self._queue.clear()
                if self._current is not None:
                    self._cancel.set()
                self._queue.appendleft(utt)
                if dropped or self._current is not None:
                    current = self._current.utterance_id if self._current else "nothing"
                    self.get_logger().info(f"interrupt: cancelling {current} and {dropped} queued")
            else:
                if len(self._queue) >= self.config.max_queue:
                    old = self._queue.popleft()
                    self.get_logger().warning(f"voice feedback queue full: dropped {old.utterance_id}")
                self._queue.append(utt)
            self._cond.notify()
        return utt.utterance_id

    def stop(self) -> tuple[str | None, int]:
        """Cancel the current utterance and drop the queue; (current id, dropped count)."""
        with self._cond:
            dropped = len(self._queue)
            self._queue.clear()
            current = self._current.utterance_id if self._current is not None else None
            if current is not None:
                self._cancel.set()
        self.get_logger().info(f"stop: cancelling {current or 'nothing'} and {dropped} queued")
        return current, dropped

    def busy(self) -> bool:
        with self._cond:
            return self._current is not None or bool(self._queue)

    # Worker thread.

    def _work(self) -> None:
        while True:
            with self._cond:
                while self._running and not self._queue:
                    self._cond.wait()
                if not self._running:
                    return
                utt = self._queue.popleft()
                self._current = utt
                self._cancel = threading.Event()
                cancel = self._cancel
            try:
                self._speak(utt, cancel)
            except Exception as exc:
                if not self.context.ok():
                    return  # ROS is shutting down under us
                self.get_logger().error(f"{utt.utterance_id} failed: {type(exc).__name__}: {exc}")
            finally:
                with self._cond:
                    self._current = None

    def _chunk_msg(self, utt: Utterance, seq: int, data: bytes, final: bool) -> AudioChunk:
        msg = AudioChunk()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.utterance_id = utt.utterance_id
        msg.seq = seq
        msg.sample_rate = self.pipeline.sample_rate
        msg.channels = self.config.output_channels
        msg.encoding = self.config.output_encoding
        msg.data = data
        msg.first = seq == 0
        msg.final = final
        return msg

    def _speak(self, utt: Utterance, cancel: threading.Event) -> None:
        stats = UtteranceStats(utterance_id=utt.utterance_id)
        seq = 0
        ended = False
        for sink in self._sinks:
            sink.begin(utt.utterance_id, self.pipeline.sample_rate)
        try:
            for chunk in self.pipeline.synthesize(utt.text, cancel, stats, requested_at=utt.received):
                data = encode_pcm(chunk.samples, self.config.output_encoding, self.config.output_channels)
                self._audio_pub.publish(self._chunk_msg(utt, seq, data, chunk.final))
                for sink in self._sinks:
                    sink.write(chunk.samples)
                seq += 1
                ended = chunk.final
        except Exception as exc:  # an engine failure ends this utterance, not the node
            stats.error = f"{type(exc).__name__}: {exc}"
            self.get_logger().error(f"synthesis of {utt.utterance_id} failed: {stats.error}")
        if not ended:
            # Cancelled or failed: close the utterance for the listeners.
            self._audio_pub.publish(self._chunk_msg(utt, seq, b"", True))
        for sink in self._sinks:
            sink.end(not ended)
        with self._cond:
            # Done before the report goes out, so a listener that saw it finds the node idle.
            self._current = None
        self.finished.append(stats)
        self._publish_status({"event": "utterance", "text": utt.text[:80], **stats.to_dict(), "chunks_sent": seq})
        state = "interrupted" if stats.interrupted else ("failed" if stats.error else "done")
        self.get_logger().info(
            f"{utt.utterance_id} {state}: ttfa {1000 * stats.ttfa_s:.1f} ms, rtf {stats.rtf:.3f}, "
            f"{stats.audio_s:.2f} s audio in {seq + (0 if ended else 1)} chunks, {stats.underruns} underruns"
        )

    def _publish_status(self, payload: dict) -> None:
        msg = String()
        msg.data = json.dumps(payload)
        self._status_pub.publish(msg)

    def destroy_node(self) -> None:
        with self._cond:
            self._running = False
            self._queue.clear()
            self._cancel.set()
            self._cond.notify_all()
        self._worker.join(timeout=5.0)
        # Native engine threads still running at interpreter exit abort the process.
        self.pipeline.wait_idle(timeout=10.0)
        for sink in self._sinks:
            sink.close()
        self.engine.close()
        super().destroy_node()


def main(argv: Sequence[str] | None = None) -> int:
    from omni_ros.config import ConfigError, load_config
    from omni_ros.ros_env import run_node
    from omni_ros.tts.engine import TtsError

    parser = argparse.ArgumentParser(prog="tts_node", description="omni_ros voice feedback (TTS) node")
    parser.add_argument("--config", help="omni_ros YAML config (its tts: section is used)")
    parser.add_argument("--engine", help="override tts.engine")
    parser.add_argument("--voice", help="override tts.voice")
    args, ros_args = parser.parse_known_args(argv)
    try:
        config = load_config(args.config).tts
    except ConfigError as exc:
        print(f"tts_node: config error: {exc}", file=sys.stderr)
        return 2
    if args.engine:
        config.engine = args.engine
    if args.voice is not None:
        config.voice = args.voice

    return run_node("tts_node", lambda: TtsNode(config), ros_args, (TtsError, ValueError))


if __name__ == "__main__":
    sys.exit(main())
