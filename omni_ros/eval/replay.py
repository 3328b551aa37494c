"""Offline replay: bag messages -> the policy node's ObservationAssembler -> Policy -> scored chunks.

Messages are fed in log-time order (the order a subscriber would have received them) through the
`MessageFeed` the policy node's callbacks use, so frames are converted, stamped and refused exactly as on
the robot; an inference instant asks the assembler for an observation at that instant, so its staleness
rules decide which instants are evaluated (the others are counted, with the reason). Each episode's
predictions are scored against its recorded ground truth.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_ros.assembler import ObservationAssembler, StaleInput
from omni_ros.config import OmniConfig
from omni_ros.eval.bag import COMPRESSED_IMAGE, IMAGE, JOINT_STATE, STRING, Bag, BagProblems
from omni_ros.eval.episodes import EpisodeSplitter
from omni_ros.eval.errors import EvalError, TopicError
from omni_ros.eval.groundtruth import COMMAND_TYPES, GroundTruthCollector, Track
from omni_ros.eval.metrics import Prediction, Scores, score_episode
from omni_ros.feed import MessageFeed
from omni_ros.policy.base import Policy
from omni_ros.progress import Progress

THUMBNAIL_WIDTH = 192
# Report frame candidates: the first evaluated instant of each episode, then one every this many seconds.
FRAME_EVERY_S = 2.0


@dataclass
class TopicMap:
    """The topics a replay reads, resolved from `eval:` with the policy node's `topics:` as fallback."""

    cameras: list[tuple[str, str]]
    joint_states: str
    prompt_topic: str
    default_prompt: str
    read_prompt_topic: bool
    ground_truth: str
    ground_truth_source: str
    marker: str
    trigger_camera: str
    joint_names: list[str]

    @classmethod
    def from_config(cls, config: OmniConfig) -> TopicMap:
        ev = config.eval
        # The config checked the cameras, the trigger camera and the rates when it was built.
        cameras = [(c.name, c.topic) for c in ev.cameras] or [(c.name, c.topic) for c in config.topics.cameras]
        trigger = ev.trigger_camera or cameras[0][0]
        gt = ev.ground_truth
        joint_states = ev.joint_states or config.topics.joint_states
        gt_topic = joint_states if gt.source == "joint_states" else (gt.topic or config.control.command_topic)
        return cls(
            cameras=cameras,
            joint_states=joint_states,
            prompt_topic=ev.prompt_topic or config.topics.prompt,
            default_prompt=ev.prompt or config.topics.default_prompt,
            read_prompt_topic=not ev.prompt,
            ground_truth=gt_topic,
            ground_truth_source=gt.source,
            marker=ev.episode_marker_topic,
            trigger_camera=trigger,
            joint_names=list(config.robot.joint_names),
        )

    def check(self, bag: Bag) -> dict[str, str]:
        """Every topic this replay needs is in `bag` with a usable type: {topic: type}. Raises TopicError."""
        types = {}
        for name, topic in self.cameras:
            types[topic] = bag.require(topic, (IMAGE, COMPRESSED_IMAGE), f"camera '{name}'")
        types[self.joint_states] = bag.require(self.joint_states, (JOINT_STATE,), "joint states")
        if self.read_prompt_topic:
            if self.prompt_topic in bag.topics:
                types[self.prompt_topic] = bag.require(self.prompt_topic, (STRING,), "prompt")
            elif not self.default_prompt:
                raise TopicError(
                    f"bag {bag.name}: no prompt topic '{self.prompt_topic}' and no fixed prompt; set eval.prompt "
                    f"(or topics.default_prompt), or eval.prompt_topic to the bag's prompt topic"
                )
        allowed = (JOINT_STATE,) if self.ground_truth_source == "joint_states" else COMMAND_TYPES
        types[self.ground_truth] = bag.require(self.ground_truth, allowed, "ground-truth actions")
        if self.marker:
            types[self.marker] = bag.require(self.marker, tuple(bag.topics.values()), "episode marker")
        return types


@dataclass
class Frame:
    """Camera thumbnails at one evaluated instant, for the report."""

    time: float
    prompt: str
    images: dict[str, np.ndarray]


@dataclass
class Episode:
    index: int
    bag: str
    start: float
    end: float
    gt: GroundTruthCollector
    prompt: str = ""
    messages: int = 0
    instants: int = 0
    predictions: list[Prediction] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    frames: list[Frame] = field(default_factory=list)
    image_errors: Counter = field(default_factory=Counter)
    dropped_out_of_order: int = 0
    track: Track | None = None
    scores: Scores | None = None
    masks: list[np.ndarray] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class BagSummary:
    path: str
    storage: str
    duration_s: float
    start_time: float
    messages: int
    decoded: int
    problems: BagProblems
    episodes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "storage": self.storage,
            "duration_s": round(self.duration_s, 6),
            "messages_read": self.messages,
            "messages_decoded": self.decoded,
            "episodes": self.episodes,
            "skipped_messages": self.problems.to_dict(),
        }


@dataclass
class Timing:
    """Wall time of the replay by stage: bag reading and decoding, observation assembly, inference."""

    read_s: float = 0.0
    assemble_s: float = 0.0
    infer_s: float = 0.0
    total_s: float = 0.0

    def to_dict(self) -> dict[str, float]:
        other = max(0.0, self.total_s - self.read_s - self.assemble_s - self.infer_s)
        return {
            "read_decode_s": round(self.read_s, 6),
            "assemble_s": round(self.assemble_s, 6),
            "inference_s": round(self.infer_s, 6),
            "other_s": round(other, 6),
            "total_s": round(self.total_s, 6),
        }


@dataclass
class ReplayResult:
    episodes: list[Episode]
    bags: list[BagSummary]
    timing: Timing
    joint_names: list[str]
    action_dt: float


def _thumbnail(image: np.ndarray) -> np.ndarray:
    import cv2

    h, w = image.shape[:2]
    if w <= THUMBNAIL_WIDTH:
        return image.copy()
    return cv2.resize(image, (THUMBNAIL_WIDTH, max(1, round(h * THUMBNAIL_WIDTH / w))), interpolation=cv2.INTER_AREA)


class Replayer:
    """Replays bags through the assembler and (when given) the policy, episode by episode."""

    def __init__(
        self,
        config: OmniConfig,
        policy: Policy | None,
        progress: Callable[[int], Progress] | None = None,
        opener: Callable[[str], Any] | None = None,
    ) -> None:
        """`opener(path)` opens each recording (default: a rosbag2 `Bag`; a dataset folder offers the same reads)."""
        self.config = config
        self.opener = opener or Bag
        self.policy = policy
        self.topics = TopicMap.from_config(config)
        self.make_progress = progress
        dims = len(self.topics.joint_names)
        if policy is not None:
            meta = policy.metadata
            if meta.action_dim != dims or meta.state_dim != dims:
                raise EvalError(
                    f"policy has state_dim {meta.state_dim} / action_dim {meta.action_dim} but robot.joint_names "
                    f"lists {dims} joints"
                )
        self.action_dt = policy.metadata.action_dt if policy is not None else 0.02

    def open_all(self, paths: Sequence[str]) -> list[tuple[Bag, dict[str, str]]]:
        """Open and check every bag before replaying any: a bad topic map fails fast, naming bag and topic."""
        opened: list[tuple[Bag, dict[str, str]]] = []
        try:
            for path in paths:
                bag = self.opener(path)
                opened.append((bag, {}))
                opened[-1] = (bag, self.topics.check(bag))
        except Exception:
            for bag, _ in opened:
                bag.close()
            raise
        return opened

    def run(self, paths: Sequence[str]) -> ReplayResult:
        start = time.perf_counter()
        opened = self.open_all(paths)
        total = sum(bag.message_count(types) for bag, types in opened)
        progress = self.make_progress(total) if self.make_progress else None
        timing = Timing()
        episodes: list[Episode] = []
        summaries: list[BagSummary] = []
        try:
            for bag, types in opened:
                with bag:
                    found = self._replay_bag(bag, types, episodes, timing, progress)
                summaries.append(
                    BagSummary(
                        bag.name,
                        bag.storage,
                        bag.duration_s,
                        bag.start_ns * 1e-9,
                        found,
                        bag.decoded,
                        bag.problems,
                        sum(1 for e in episodes if e.bag == bag.name),
                    )
                )
        finally:
            if progress is not None:
                progress.close()
        timing.total_s = time.perf_counter() - start
        return ReplayResult(episodes, summaries, timing, self.topics.joint_names, self.action_dt)

    # ----- one bag -------------------------------------------------------------------------------------------

    def _new_assembler(self, prompt: tuple[str, float] | None) -> ObservationAssembler:
        control = self.config.control
        assembler = ObservationAssembler(
            [n for n, _ in self.topics.cameras],
            self.topics.joint_names,
            camera_stale_s=control.camera_stale_s,
            state_stale_s=control.state_stale_s,
            prompt_stale_s=control.prompt_stale_s,
            default_prompt=self.topics.default_prompt,
        )
        # The prompt is latched: a new episode keeps the last one until another arrives.
        if prompt is not None:
            assembler.add_prompt(*prompt)
        return assembler

    def _new_episode(self, bag: Bag, types: dict[str, str], t: float, index: int) -> Episode:
        gt = self.config.eval.ground_truth
        collector = GroundTruthCollector(
            self.topics.joint_names,
            types[self.topics.ground_truth],
            array_joint_names=gt.joint_names,
            offset_s=gt.offset_s if gt.source == "joint_states" else 0.0,
            trajectory_points=gt.trajectory_points,
            use_header_stamps=self.config.eval.use_header_stamps,
            max_gap_s=gt.max_gap_s,
        )
        return Episode(index=index, bag=bag.name, start=t, end=t, gt=collector)

    def _replay_bag(
        self, bag: Bag, types: dict[str, str], episodes: list[Episode], timing: Timing, progress: Progress | None
    ) -> int:
        ev = self.config.eval
        tm = self.topics
        cameras = {topic: name for name, topic in tm.cameras}
        rate = ev.rate_hz
        read_topics = set(types)

        assembler = self._new_assembler(None)
        feed = MessageFeed(assembler)  # the first message opens an episode, which brings its own feed
        episode: Episode | None = None
        trigger_frames = 0
        # Fixed-rate instants are episode start + n / rate (counted, so long bags do not drift).
        n_instant = 0
        next_instant = math.inf
        splitter = EpisodeSplitter(tm.marker, ev.episode_gap_s)
        last_frame_t = -math.inf
        count = 0
        prompt: tuple[str, float] | None = None

        def finish() -> None:
            if episode is not None and (episode.instants or episode.gt.count):
                episode.dropped_out_of_order = assembler.stats.dropped_out_of_order
                self._score(episode)
                episodes.append(episode)

        def instant(now: float) -> None:
            nonlocal last_frame_t
            if self.policy is None:  # ground truth only (real-time mode: the node decides when to infer)
                return
            assert episode is not None  # instants come after the first message opened an episode
            episode.instants += 1
            t_start = time.perf_counter()
            try:
                assembled = assembler.assemble(now)
            except StaleInput as exc:
                timing.assemble_s += time.perf_counter() - t_start
                episode.skipped[exc.problem.summary] += 1
                return
            timing.assemble_s += time.perf_counter() - t_start
            t_infer = time.perf_counter()
            try:
                result = self.policy.infer(assembled.obs)
                actions = np.asarray(result["actions"], dtype=np.float32)
            except Exception as exc:
                timing.infer_s += time.perf_counter() - t_infer
                episode.skipped[f"inference failed: {type(exc).__name__}: {str(exc)[:80]}"] += 1
                return
            latency = time.perf_counter() - t_infer
            timing.infer_s += latency
            dims = len(tm.joint_names)
            if actions.ndim != 2 or actions.shape[1] != dims or not np.all(np.isfinite(actions)):
                episode.skipped[f"policy returned an unusable chunk of shape {actions.shape}"] += 1
                return
            state = np.asarray(assembled.obs["state"], dtype=np.float64)
            episode.predictions.append(Prediction(assembled.stamp, now, actions, self.action_dt, latency, state))
            if not episode.prompt:
                episode.prompt = assembled.obs["prompt"]
            if now - last_frame_t >= FRAME_EVERY_S and ev.report_frames > 0:
                last_frame_t = now
                images = {k: _thumbnail(v) for k, v in assembled.obs["images"].items()}
                episode.frames.append(Frame(now, assembled.obs["prompt"], images))

        stream = bag.read(sorted(read_topics))
        while True:
            t_read = time.perf_counter()
            try:
                topic, t, msg = next(stream)
            except StopIteration:
                timing.read_s += time.perf_counter() - t_read
                break
            timing.read_s += time.perf_counter() - t_read
            count += 1
            if progress is not None and count % 16 == 0:
                progress.update(16)

            if splitter.starts_episode(topic, t):
                finish()
                if episode is not None:
                    assembler = self._new_assembler(prompt)
                episode = self._new_episode(bag, types, t, len(episodes))
                feed = MessageFeed(assembler, use_header_stamps=ev.use_header_stamps, image_errors=episode.image_errors)
                trigger_frames = 0
                last_frame_t = -math.inf
                n_instant = 0
                next_instant = t if rate > 0 else math.inf
            assert episode is not None  # the first message opened one
            # Fixed-rate instants due before this message see only what came before it.
            while next_instant < t - 1e-9:
                instant(next_instant)
                n_instant += 1
                next_instant = episode.start + n_instant / rate
            episode.messages += 1
            episode.end = t

            t_asm = time.perf_counter()
            name = cameras.get(topic)
            if name is not None:
                accepted = feed.image(name, msg, t, compressed=types[topic] == COMPRESSED_IMAGE)
                timing.assemble_s += time.perf_counter() - t_asm
                if accepted and rate <= 0 and name == tm.trigger_camera:
                    if trigger_frames % ev.every_k_frames == 0:
                        instant(t)
                    trigger_frames += 1
            else:
                if topic == tm.joint_states:
                    feed.joint_state(msg, t)
                elif topic == tm.prompt_topic and tm.read_prompt_topic:
                    prompt = (msg.data, t)  # latched into the next episode's assembler
                    feed.prompt(msg, t)
                timing.assemble_s += time.perf_counter() - t_asm
            if topic == tm.ground_truth:
                episode.gt.add(msg, t)
        if episode is not None and rate > 0:
            while next_instant <= episode.end + 1e-9:
                instant(next_instant)
                n_instant += 1
                next_instant = episode.start + n_instant / rate
        finish()
        if progress is not None:
            progress.update(count % 16)
        return count

    def _score(self, episode: Episode) -> None:
        episode.track = episode.gt.track()
        episode.scores, episode.masks = score_episode(episode.predictions, episode.track, len(self.topics.joint_names))
