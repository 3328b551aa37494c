"""Bag episodes -> dataset frames at a fixed rate, through the policy node's own feed and assembler.

Messages are read in log-time order and fed through `MessageFeed` into an `ObservationAssembler`, as the
policy node and `omni-ros eval` do: the same image conversion (raw encodings, JPEG/PNG -> RGB), the same
reordering of joint states by `robot.joint_names`, the same staleness rules. Episodes split as the
evaluator splits them (omni_ros.eval.episodes).

Resampling: the ticks of an episode are t0 + n / fps on the trigger camera's clock (its header stamps),
t0 being its first frame. Each tick takes the trigger frame nearest to it (within half a period), and the
assembler's observation at that frame's arrival: the other cameras' latest frames and the latest joint
state, exactly what a frame-triggered inference instant of the evaluator sees. The action of a frame is
the command in effect at its stamp (the latest command at or before it, no older than `max_gap_s`) or,
with `eval.ground_truth.source: joint_states`, the first joint state after the stamp (+ `offset_s`).
A tick without a usable frame, state, prompt or action is dropped, and the reason counted.

A frame is held back until the bag has reached its stamp + `max_gap_s`, so a command logged a little after
the frame it belongs to still counts; at most that many frames are in memory per camera.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from omni_ros.assembler import Assembled, ObservationAssembler, StaleInput
from omni_ros.config import OmniConfig
from omni_ros.eval.bag import COMPRESSED_IMAGE, Bag
from omni_ros.eval.episodes import EpisodeSplitter
from omni_ros.eval.groundtruth import GroundTruthCollector
from omni_ros.eval.replay import TopicMap
from omni_ros.feed import MessageFeed
from omni_ros.ros_convert import message_stamp

NO_TRIGGER_FRAME = "no trigger-camera frame within half a period of the tick"


@dataclass
class Frame:
    """One dataset frame: the observation at a tick and the action recorded for it."""

    stamp: float
    images: dict[str, np.ndarray]
    state: np.ndarray
    action: np.ndarray
    prompt: str


@dataclass
class EpisodeStart:
    index: int
    bag: str
    start: float


@dataclass
class EpisodeEnd:
    index: int
    bag: str
    start: float
    end: float
    frames: int
    dropped: Counter = field(default_factory=Counter)


Event = Frame | EpisodeStart | EpisodeEnd


@dataclass
class _Candidate:
    tick: int
    stamp: float
    # When the frame was logged: the observation is taken once every message logged at that instant is in
    # (cameras recorded together arrive one after the other at the same time).
    log_time: float
    observed: Assembled | None = None
    problem: str = ""
    taken: bool = False


class _ActionSource:
    """The recorded action track of one episode, searchable by time as it grows."""

    def __init__(self, collector: GroundTruthCollector, next_sample: bool, max_gap_s: float) -> None:
        self.collector = collector
        self.next_sample = next_sample
        self.max_gap_s = max_gap_s
        self.times: list[float] = []
        self.values: list[np.ndarray] = []
        self._seen = 0

    def add(self, msg: object, log_time: float) -> None:
        self.collector.add(msg, log_time)
        times, values = self.collector.samples()
        for t, q in zip(times[self._seen :], values[self._seen :], strict=True):
            k = bisect.bisect_right(self.times, t)  # recorded out of order now and then: keep them sorted
            self.times.insert(k, t)
            self.values.insert(k, q)
        self._seen = len(times)

    def at(self, stamp: float) -> tuple[np.ndarray | None, str]:
        """The action for a frame stamped `stamp`, or None and why there is none."""
        eps = 1e-9
        if self.next_sample:
            k = bisect.bisect_right(self.times, stamp + eps)
            if k == len(self.times) or self.times[k] - stamp > self.max_gap_s + eps:
                return None, f"no joint state within {self.max_gap_s:g} s after the frame (action source)"
            return self.values[k], ""
        k = bisect.bisect_right(self.times, stamp + eps) - 1
        if k < 0 or stamp - self.times[k] > self.max_gap_s + eps:
            return None, f"no command within {self.max_gap_s:g} s before the frame"
        return self.values[k], ""


class EpisodeSampler:
    """Reads bags and yields EpisodeStart, Frame ... EpisodeEnd per episode (see the module docstring)."""

    def __init__(self, config: OmniConfig, fps: float) -> None:
        if not fps > 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.config = config
        self.fps = float(fps)
        self.topics = TopicMap.from_config(config)
        gt = config.eval.ground_truth
        self.next_joint_state = gt.source == "joint_states"
        self.settle_s = gt.max_gap_s
        self.episodes = 0

    @property
    def camera_names(self) -> list[str]:
        return [name for name, _ in self.topics.cameras]

    def _assembler(self, prompt: tuple[str, float] | None) -> ObservationAssembler:
        control = self.config.control
        assembler = ObservationAssembler(
            self.camera_names,
            self.topics.joint_names,
            camera_stale_s=control.camera_stale_s,
            state_stale_s=control.state_stale_s,
            prompt_stale_s=control.prompt_stale_s,
            default_prompt=self.topics.default_prompt,
        )
        if prompt is not None:  # latched across episodes, as on the robot
            assembler.add_prompt(*prompt)
        return assembler

    def _actions(self, types: dict[str, str]) -> _ActionSource:
        gt = self.config.eval.ground_truth
        collector = GroundTruthCollector(
            self.topics.joint_names,
            types[self.topics.ground_truth],
            array_joint_names=gt.joint_names,
            offset_s=gt.offset_s if self.next_joint_state else 0.0,
            trajectory_points="first",
            use_header_stamps=self.config.eval.use_header_stamps,
            max_gap_s=gt.max_gap_s,
        )
        return _ActionSource(collector, self.next_joint_state, gt.max_gap_s)

    def read(self, bag: Bag, types: dict[str, str], progress: Counter | None = None) -> Iterator[Event]:
        """Events of one opened, checked bag (`types` from TopicMap.check). `progress["messages"]` counts reads."""
        tm = self.topics
        ev = self.config.eval
        cameras = {topic: name for name, topic in tm.cameras}
        period = 1.0 / self.fps
        splitter = EpisodeSplitter(tm.marker, ev.episode_gap_s)
        prompt: tuple[str, float] | None = None
        assembler = self._assembler(None)
        feed = MessageFeed(assembler, use_header_stamps=ev.use_header_stamps)
        actions = self._actions(types)
        start = last_t = 0.0
        open_episode = False
        t0: float | None = None
        next_tick = 0
        candidate: _Candidate | None = None
        pending: deque[_Candidate] = deque()
        dropped: Counter = Counter()
        emitted = 0
        index = self.episodes

        def take(cand: _Candidate | None) -> None:
            if cand is None or cand.taken:
                return
            cand.taken = True
            try:
                cand.observed = assembler.assemble(cand.log_time)
            except StaleInput as exc:
                cand.problem = exc.problem.summary

        def finalize(upto_tick: int) -> None:
            """Close every tick before `upto_tick`: its candidate waits for its action; a tick without one drops."""
            nonlocal candidate, next_tick
            while next_tick < upto_tick:
                if candidate is not None and candidate.tick == next_tick:
                    take(candidate)
                    pending.append(candidate)
                    candidate = None
                else:
                    dropped[NO_TRIGGER_FRAME] += 1
                next_tick += 1

        def resolve(now: float, final: bool) -> Iterator[Frame]:
            nonlocal emitted
            while pending and (final or pending[0].stamp + self.settle_s < now):
                cand = pending.popleft()
                if cand.observed is None:
                    dropped[cand.problem] += 1
                    continue
                action, why = actions.at(cand.stamp)
                if action is None:
                    dropped[why] += 1
                    continue
                obs = cand.observed.obs
                emitted += 1
                yield Frame(
                    cand.stamp,
                    dict(obs["images"]),
                    np.asarray(obs["state"], dtype=np.float32),
                    np.asarray(action, dtype=np.float32),
                    obs["prompt"],
                )

        def close(end: float) -> Iterator[Event]:
            nonlocal index
            if candidate is not None:
                finalize(candidate.tick + 1)
            yield from resolve(math.inf, final=True)
            yield EpisodeEnd(index, bag.name, start, end, emitted, Counter(dropped))
            index += 1

        for topic, t, msg in bag.read(sorted(types)):
            if progress is not None:
                progress["messages"] += 1
            if splitter.starts_episode(topic, t):
                if open_episode:
                    yield from close(last_t)
                    assembler = self._assembler(prompt)
                    feed = MessageFeed(assembler, use_header_stamps=ev.use_header_stamps)
                    actions = self._actions(types)
                open_episode = True
                start = t
                t0, next_tick, candidate = None, 0, None
                pending.clear()
                dropped = Counter()
                emitted = 0
                yield EpisodeStart(index, bag.name, start)
            last_t = t
            if candidate is not None and t > candidate.log_time:
                take(candidate)
            yield from resolve(t, final=False)
            name = cameras.get(topic)
            if name is not None:
                accepted = feed.image(name, msg, t, compressed=types[topic] == COMPRESSED_IMAGE)
                if accepted and name == tm.trigger_camera:
                    stamp = message_stamp(msg, t, ev.use_header_stamps)
                    if t0 is None:
                        t0 = stamp
                    tick = round((stamp - t0) / period)
                    if tick < next_tick or (candidate is not None and tick < candidate.tick):
                        continue  # a faster camera: a nearer frame already took this tick
                    distance = abs(stamp - (t0 + tick * period))
                    if distance > 0.5 * period - 1e-6:
                        continue  # halfway between two ticks: near enough to neither (a faster camera's extra frame)
                    finalize(tick)
                    if candidate is None or distance < abs(candidate.stamp - (t0 + tick * period)):
                        candidate = _Candidate(tick, stamp, t)
                continue
            if topic == tm.joint_states:
                feed.joint_state(msg, t)
            elif topic == tm.prompt_topic and tm.read_prompt_topic:
                prompt = (msg.data, t)
                feed.prompt(msg, t)
            if topic == tm.ground_truth:
                actions.add(msg, t)
        if open_episode:
            yield from close(last_t)
        self.episodes = index
