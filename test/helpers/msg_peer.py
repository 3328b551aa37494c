"""A separate process that publishes or receives omni_ros messages over DDS.

    python msg_peer.py pub --count N     publish N ActionChunk and N AudioChunk
    python msg_peer.py sub --count N     print each received message as one JSON line

Both sides derive the message contents from the sequence number, so the test
can check every field of what arrived.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import rclpy
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

from omni_ros.msg import ActionChunk, AudioChunk

QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)


def make_action_chunk(i: int) -> ActionChunk:
    msg = ActionChunk()
    msg.header.stamp.sec = 1000 + i
    msg.header.stamp.nanosec = 123 * i
    msg.header.frame_id = "base_link"
    msg.chunk_id = i
    msg.joint_names = [f"joint_{k}" for k in range(3)]
    msg.horizon = 4
    msg.action_dim = 3
    msg.dt = 0.02
    msg.actions = [float(i) + 0.25 * k for k in range(12)]
    msg.inference_time = 0.5 + i
    msg.backend = "torch-cpu"
    return msg


def make_audio_chunk(i: int) -> AudioChunk:
    msg = AudioChunk()
    msg.header.stamp.sec = 2000 + i
    msg.utterance_id = f"utt-{i // 2}"
    msg.seq = i
    msg.sample_rate = 22050
    msg.channels = 1
    msg.encoding = "S16LE"
    msg.data = bytes((i + k) % 256 for k in range(1000 + i))
    msg.first = i == 0
    msg.final = i % 2 == 1
    return msg


def action_chunk_dict(msg: ActionChunk) -> dict:
    return {
        "stamp": [msg.header.stamp.sec, msg.header.stamp.nanosec],
        "frame_id": msg.header.frame_id,
        "chunk_id": msg.chunk_id,
        "joint_names": list(msg.joint_names),
        "horizon": msg.horizon,
        "action_dim": msg.action_dim,
        "dt": round(float(msg.dt), 6),
        "actions": [float(v) for v in msg.actions],
        "inference_time": round(float(msg.inference_time), 6),
        "backend": msg.backend,
    }


def audio_chunk_dict(msg: AudioChunk) -> dict:
    return {
        "stamp": [msg.header.stamp.sec, msg.header.stamp.nanosec],
        "utterance_id": msg.utterance_id,
        "seq": msg.seq,
        "sample_rate": msg.sample_rate,
        "channels": msg.channels,
        "encoding": msg.encoding,
        "data": bytes(msg.data).hex(),
        "first": msg.first,
        "final": msg.final,
    }


def publish(count: int, timeout: float) -> int:
    node = rclpy.create_node("msg_peer_pub")
    pubs = (
        node.create_publisher(ActionChunk, "/test/action_chunk", QOS),
        node.create_publisher(AudioChunk, "/test/audio_chunk", QOS),
    )
    deadline = time.monotonic() + timeout
    # Discovery between processes takes up to a few seconds.
    while any(p.get_subscription_count() == 0 for p in pubs):
        if time.monotonic() > deadline:
            print("no subscriber appeared", file=sys.stderr)
            return 1
        rclpy.spin_once(node, timeout_sec=0.05)
    for i in range(count):
        pubs[0].publish(make_action_chunk(i))
        pubs[1].publish(make_audio_chunk(i))
    # Keep the writer alive until the reader has taken everything.
    while time.monotonic() < deadline and any(p.get_subscription_count() > 0 for p in pubs):
        rclpy.spin_once(node, timeout_sec=0.05)
    return 0


def subscribe(count: int, timeout: float) -> int:
    node = rclpy.create_node("msg_peer_sub")
    got = {"action": 0, "audio": 0}

    def on_action(msg: ActionChunk) -> None:
        got["action"] += 1
        print(json.dumps({"type": "ActionChunk", **action_chunk_dict(msg)}), flush=True)

    def on_audio(msg: AudioChunk) -> None:
        got["audio"] += 1
        print(json.dumps({"type": "AudioChunk", **audio_chunk_dict(msg)}), flush=True)

    node.create_subscription(ActionChunk, "/test/action_chunk", on_action, QOS)
    node.create_subscription(AudioChunk, "/test/audio_chunk", on_audio, QOS)
    deadline = time.monotonic() + timeout
    while min(got.values()) < count and time.monotonic() < deadline:
        rclpy.spin_once(node, timeout_sec=0.05)
    node.destroy_node()  # tells the publisher it may exit
    return 0 if min(got.values()) >= count else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["pub", "sub"])
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    rclpy.init()
    try:
        return (publish if args.role == "pub" else subscribe)(args.count, args.timeout)
    finally:
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
