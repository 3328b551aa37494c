"""Real-time evaluation: play a bag to a running policy node over ROS and score what the node publishes.

The bag's inputs (cameras, joint states, prompt) are published with their original timing, their header
stamps moved onto the current clock (the node judges staleness against its own clock), as raw CDR bytes
so nothing is re-encoded. The node's ActionChunks (stamped with the observation they answer) and its
JointTrajectory commands (after blending, limits and latency compensation) are recorded, mapped back to
bag time, and scored against the bag's ground truth: the chunks like offline predictions, the commands
as "executed". Recorded commands in the bag are not replayed: the node's own commands take that topic.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from omni_ros.config import OmniConfig
from omni_ros.eval.bag import COMPRESSED_IMAGE, IMAGE, JOINT_STATE, STRING, Bag
from omni_ros.eval.errors import EvalError, NoSamplesError
from omni_ros.eval.evaluate import Evaluation, _finish, _prepare_out
from omni_ros.eval.groundtruth import Track
from omni_ros.eval.metrics import Prediction, _num, percentiles, score_episode
from omni_ros.eval.replay import Episode, Replayer
from omni_ros.eval.results import build_document
from omni_ros.policy.base import PolicyMetadata
from omni_ros.progress import Progress

# Messages whose CDR payload starts with std_msgs/Header (stamp sec, nanosec right after the 4-byte
# encapsulation header), so they can be restamped in place.
HEADER_FIRST = (IMAGE, COMPRESSED_IMAGE, JOINT_STATE)
# First message goes out this long after playback starts (publishers settle).
LEAD_S = 0.3


def restamp(data: bytes, shift_s: float) -> bytes:
    """CDR bytes of a Header-first message with its stamp moved by `shift_s` (a zero stamp stays zero)."""
    little = data[1] == 1  # encapsulation 0x0001 = CDR little endian, 0x0000 = big endian
    fmt = "<iI" if little else ">iI"
    sec, nsec = struct.unpack_from(fmt, data, 4)
    if sec == 0 and nsec == 0:
        return data
    total = sec * 1_000_000_000 + nsec + round(shift_s * 1e9)
    out = bytearray(data)
    struct.pack_into(fmt, out, 4, total // 1_000_000_000, total % 1_000_000_000)
    return bytes(out)


def _msg_class(msgtype: str) -> Any:
    from sensor_msgs.msg import CompressedImage, Image, JointState
    from std_msgs.msg import String

    return {IMAGE: Image, COMPRESSED_IMAGE: CompressedImage, JOINT_STATE: JointState, STRING: String}[msgtype]


class _Recorder:
    """What the policy node publishes, with receive times (wall clock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.chunks: list[tuple[float, Any]] = []
        self.commands: list[tuple[float, Any]] = []

    def on_chunk(self, msg: Any) -> None:
        with self.lock:
            self.chunks.append((time.time(), msg))

    def on_command(self, msg: Any) -> None:
        with self.lock:
            self.commands.append((time.time(), msg))


def _stamp(msg: Any) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


def _reorder(names: Sequence[str], values: np.ndarray, joints: Sequence[str]) -> np.ndarray | None:
    if not names:
        return values if values.shape[-1] == len(joints) else None
    index = {n: i for i, n in enumerate(names)}
    if any(j not in index for j in joints):
        return None
    return values[..., [index[j] for j in joints]]


def evaluate_realtime(
    bags: Sequence[str],
    config: OmniConfig,
    out_dir: str | Path | None = None,
    progress: bool = True,
    discovery_timeout_s: float = 30.0,
    settle_s: float = 1.0,
) -> Evaluation:
    """Play `bags` to the policy node configured in `config` (already running) and score its output."""
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    from omni_ros.ros_env import default_to_localhost

    if not bags:
        raise EvalError("no bags given")
    if out_dir is not None:
        out_dir = _prepare_out(out_dir)
    # Ground truth and episodes come from the same offline pass as always (no inference in it).
    replayer = Replayer(config, None)
    offline = replayer.run(bags)

    default_to_localhost()
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from trajectory_msgs.msg import JointTrajectory

    from omni_ros.msg import ActionChunk

    tm = replayer.topics
    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    sensor = QoSProfile(depth=5, reliability=ReliabilityPolicy.RELIABLE)
    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node("omni_ros_eval_player", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    recorder = _Recorder()
    node.create_subscription(ActionChunk, config.topics.action_chunk, recorder.on_chunk, 100)
    node.create_subscription(JointTrajectory, config.control.command_topic, recorder.on_command, 500)
    spinner = threading.Thread(target=executor.spin, name="eval-recorder", daemon=True)
    spinner.start()
    # (wall time playback started, bag, offset wall - bag time) per bag, in playing order.
    windows: list[tuple[float, str, float]] = []
    lateness: list[float] = []
    published = 0
    start = time.perf_counter()
    try:
        for path in bags:
            with Bag(path) as bag:
                types = tm.check(bag)
                play = {t: ty for t, ty in types.items() if t in {topic for _, topic in tm.cameras}}
                play[tm.joint_states] = JOINT_STATE
                if tm.read_prompt_topic and tm.prompt_topic in types:
                    play[tm.prompt_topic] = STRING
                pubs = {
                    topic: node.create_publisher(_msg_class(msgtype), topic, latched if msgtype == STRING else sensor)
                    for topic, msgtype in play.items()
                }
                _wait_for_node(pubs, node, config, discovery_timeout_s)
                bar = Progress(bag.message_count(play), label=f"messages of {Path(bag.name).name}", enabled=progress)
                offset = time.time() + LEAD_S - bag.start_ns * 1e-9
                windows.append((time.time(), bag.name, offset))
                for topic, msgtype, t_ns, data in bag.raw(sorted(play)):
                    due = t_ns * 1e-9 + offset
                    wait = due - time.time()
                    if wait > 0:
                        time.sleep(wait)
                    lateness.append(max(0.0, time.time() - due))
                    if msgtype in HEADER_FIRST and len(data) >= 12:
                        data = restamp(bytes(data), offset)
                    pubs[topic].publish(bytes(data))
                    published += 1
                    bar.update(1)
                bar.close()
                time.sleep(settle_s)
                for pub in pubs.values():
                    node.destroy_publisher(pub)
    finally:
        executor.shutdown()
        spinner.join(timeout=5)
        node.destroy_node()
        context.try_shutdown()
    wall = time.perf_counter() - start

    joints = tm.joint_names
    with recorder.lock:
        chunks, commands = list(recorder.chunks), list(recorder.commands)
    episodes_by_bag: dict[str, list[Episode]] = {}
    for ep in offline.episodes:
        episodes_by_bag.setdefault(ep.bag, []).append(ep)

    def locate(t_wall: float) -> tuple[Episode | None, float]:
        """The episode playing at wall time `t_wall` (the latest started), and that time in bag time."""
        _, name, offset = windows[0]
        for started, cand, off in windows:
            if t_wall >= started:
                name, offset = cand, off
        t_bag = t_wall - offset
        best = None
        for ep in episodes_by_bag.get(name, []):
            if ep.start - 1e-6 <= t_bag:
                best = ep
        return best, t_bag

    metadata = None
    actions: np.ndarray | None  # None: the chunk's joints do not cover ours
    for received, msg in chunks:
        actions = np.asarray(msg.actions, dtype=np.float32)
        if msg.horizon * msg.action_dim != len(actions) or msg.horizon == 0:
            continue
        actions = _reorder(list(msg.joint_names), actions.reshape(msg.horizon, msg.action_dim), joints)
        if actions is None:
            continue
        episode, t0 = locate(_stamp(msg))
        if episode is None:
            continue
        _, now = locate(received)
        episode.predictions.append(Prediction(t0, now, actions, float(msg.dt), float(msg.inference_time)))
        if metadata is None:
            metadata = PolicyMetadata(
                model=f"policy node ({config.policy.checkpoint or config.policy.preset})",
                backend=msg.backend or "unknown",
                camera_names=tuple(n for n, _ in tm.cameras),
                image_size=0,
                state_dim=len(joints),
                action_dim=len(joints),
                action_horizon=int(msg.horizon),
                action_dt=float(msg.dt),
            )
    executed: dict[int, list[tuple[float, np.ndarray]]] = {}
    ex_sq = np.zeros(len(joints))
    ex_ab = np.zeros(len(joints))
    ex_n = 0
    for _, msg in commands:
        if not msg.points:
            continue
        q = _reorder(list(msg.joint_names), np.asarray(msg.points[0].positions, dtype=np.float64), joints)
        episode, t = locate(_stamp(msg))
        if q is None or episode is None or episode.track is None:
            continue
        executed.setdefault(episode.index, []).append((t, q))
        truth, valid = episode.track.sample(np.array([t]))
        if valid[0]:
            err = q - truth[0]
            ex_sq += err**2
            ex_ab += np.abs(err)
            ex_n += 1
    for ep in offline.episodes:
        ep.predictions.sort(key=lambda p: p.t0)
        ep.instants = len(ep.predictions)
        # An episode without a track got no predictions above, so score_episode never reads its track.
        ep.scores, ep.masks = score_episode(ep.predictions, cast(Track, ep.track), len(joints))
    if not any(ep.scores is not None and ep.scores.samples for ep in offline.episodes):
        raise NoSamplesError(
            f"real time: no aligned samples from the policy node for {', '.join(bags)}: received {len(chunks)} "
            f"chunks on '{config.topics.action_chunk}' and {len(commands)} commands on "
            f"'{config.control.command_topic}'"
        )
    offline.timing.total_s = wall
    realtime = {
        "chunks_received": len(chunks),
        "commands_received": len(commands),
        "messages_published": published,
        "lateness_ms": percentiles(lateness, 1e3),
        "executed": {
            "samples": ex_n,
            "mse": _num(ex_sq.sum() / (ex_n * len(joints))) if ex_n else None,
            "mae": _num(ex_ab.sum() / (ex_n * len(joints))) if ex_n else None,
            "mae_per_joint": {j: (_num(ex_ab[i] / ex_n) if ex_n else None) for i, j in enumerate(joints)},
        },
    }
    assert metadata is not None  # set by the first chunk, and without chunks NoSamplesError was raised
    doc = build_document(offline, config, metadata, mode="realtime", realtime=realtime)
    series = {
        k: (np.array([t for t, _ in v]), np.array([q for _, q in v]).reshape(len(v), len(joints)))
        for k, v in executed.items()
    }
    return _finish(doc, offline, config, out_dir, executed=series)


def _wait_for_node(pubs: dict[str, Any], node: Any, config: OmniConfig, timeout_s: float) -> None:
    """Until the policy node subscribes to every input and publishes chunks; EvalError naming what is missing."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        missing = [t for t, p in pubs.items() if p.get_subscription_count() == 0]
        if not missing and node.count_publishers(config.topics.action_chunk) > 0:
            return
        time.sleep(0.05)
    missing = [t for t, p in pubs.items() if p.get_subscription_count() == 0]
    what = f"no subscriber on {missing}" if missing else f"no publisher on '{config.topics.action_chunk}'"
    raise EvalError(
        f"real time: no policy node found within {timeout_s:g} s ({what}); start one with "
        "`omni-ros node policy --config CONFIG` using the same topics"
    )
