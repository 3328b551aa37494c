"""A LeRobotDataset folder as a recording for the evaluator: `omni-ros eval --dataset DIR`.

The evaluator replays message streams (omni_ros.eval.replay); a dataset becomes one: per frame a JointState
of `observation.state`, a JointState of `action` (the ground truth, as a command topic), the prompt (`task`)
when it changes and each camera's frame as an rgb8 Image, the trigger camera last, all stamped with the
frame's timestamp. Each episode starts with a marker message and sits EPISODE_GAP_S after the previous one,
so the same feed, assembler, policy, executor, metrics and report run on it as on a bag.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from omni_ros.config import OmniConfig
from omni_ros.dataset import lerobot_format as fmt
from omni_ros.dataset.reader import DatasetFolder
from omni_ros.dataset.writer import DatasetError
from omni_ros.eval.bag import IMAGE, JOINT_STATE, STRING, BagProblems
from omni_ros.eval.config import EvalCamera
from omni_ros.eval.errors import TopicError

PREFIX = "/dataset/"
STATE_TOPIC = PREFIX + fmt.STATE
ACTION_TOPIC = PREFIX + fmt.ACTION
TASK_TOPIC = PREFIX + "task"
EPISODE_TOPIC = PREFIX + "episode"
EPISODE_GAP_S = 1.0
# Stamps start here (the evaluator treats zero stamps as missing).
EPOCH = 1_000.0


def camera_topic(camera: str) -> str:
    return PREFIX + fmt.image_key(camera)


def dataset_config(config: OmniConfig, folder: DatasetFolder) -> OmniConfig:
    """`config` with its eval: section pointed at the dataset's streams (policy, robot, control kept)."""
    out = copy.deepcopy(config)
    ev = out.eval
    ev.cameras = [EvalCamera(cam, camera_topic(cam)) for cam in folder.cameras]
    if ev.trigger_camera not in folder.cameras:
        ev.trigger_camera = folder.cameras[0]
    ev.joint_states = STATE_TOPIC
    ev.prompt_topic = TASK_TOPIC
    ev.ground_truth.source = "command"
    ev.ground_truth.topic = ACTION_TOPIC
    ev.ground_truth.trajectory_points = "first"
    ev.episode_marker_topic = EPISODE_TOPIC
    ev.episode_gap_s = 0.0
    ev.use_header_stamps = True
    return out


def _stamp(t: float) -> Any:
    sec = int(t // 1)
    return SimpleNamespace(sec=sec, nanosec=min(round((t - sec) * 1e9), 999_999_999))


class DatasetRecording:
    """The Bag interface the Replayer uses, over one dataset folder and a choice of its episodes."""

    def __init__(
        self, folder: DatasetFolder, episodes: Sequence[int] | None, joint_names: Sequence[str], trigger: str = ""
    ) -> None:
        self.folder = folder
        self.name = str(folder.root)
        # The trigger camera's frame goes last, so an instant sees the frame's state and other cameras.
        self.cameras = [c for c in folder.cameras if c != trigger] + [c for c in folder.cameras if c == trigger]
        self.name = str(folder.root)
        self.storage = f"lerobot-{fmt.CODEBASE_VERSION}"
        chosen = list(episodes) if episodes else [e.index for e in folder.episodes]
        for index in chosen:
            folder.episode(index)  # DatasetError for an episode it lacks
        self.episodes = chosen
        dims = len(joint_names)
        self.state_names = self._names(folder.state_names, joint_names, dims, fmt.STATE)
        self.action_names = self._names(folder.action_names, joint_names, dims, fmt.ACTION)
        self.topics = {topic: IMAGE for topic in (camera_topic(c) for c in folder.cameras)}
        self.topics.update({STATE_TOPIC: JOINT_STATE, ACTION_TOPIC: JOINT_STATE, TASK_TOPIC: STRING})
        self.topics[EPISODE_TOPIC] = STRING
        lengths = [folder.episode(i).length for i in chosen]
        self.counts: Counter = Counter()
        for topic in self.topics:
            self.counts[topic] = sum(lengths) if topic not in (EPISODE_TOPIC, TASK_TOPIC) else len(chosen)
        self.start_ns = int(EPOCH * 1e9)
        span = sum(n / folder.fps for n in lengths) + EPISODE_GAP_S * max(0, len(chosen) - 1)
        self.end_ns = int((EPOCH + span) * 1e9)
        self.problems = BagProblems()
        self.decoded = 0

    def _names(self, names: list[str], joint_names: Sequence[str], dims: int, key: str) -> list[str]:
        if names:
            missing = [j for j in joint_names if j not in names]
            if missing:
                raise DatasetError(
                    f"dataset {self.name}: {key} names {names} lack robot.joint_names {missing}; evaluate with the "
                    f"robot's config (--config)"
                )
            return names
        # A dataset without joint names: its columns are taken to be robot.joint_names, in that order.
        width = int(self.folder.features[key]["shape"][0])
        if width != dims:
            raise DatasetError(f"dataset {self.name}: {key} has {width} values but robot.joint_names lists {dims}")
        return list(joint_names)

    def __enter__(self) -> DatasetRecording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) * 1e-9

    def require(self, topic: str, types: Iterable[str], role: str) -> str:
        if topic not in self.topics:
            raise TopicError(f"dataset {self.name}: no stream for '{topic}' ({role})")
        return self.topics[topic]

    def message_count(self, topics: Iterable[str]) -> int:
        return sum(self.counts[t] for t in set(topics))

    def read(self, topics: Iterable[str]) -> Iterator[tuple[str, float, Any]]:
        wanted = set(topics)
        cameras = self.cameras
        offset = EPOCH
        for index in self.episodes:
            length = self.folder.episode(index).length
            task = None
            first = True
            for frame in self.folder.frames(index):
                t = offset + frame.timestamp
                header = SimpleNamespace(stamp=_stamp(t), frame_id="")
                if first and EPISODE_TOPIC in wanted:
                    yield EPISODE_TOPIC, t, SimpleNamespace(data=str(index))
                first = False
                if frame.task != task and TASK_TOPIC in wanted:
                    task = frame.task
                    yield TASK_TOPIC, t, SimpleNamespace(data=frame.task)
                if STATE_TOPIC in wanted:
                    yield STATE_TOPIC, t, SimpleNamespace(header=header, name=self.state_names, position=frame.state)
                if ACTION_TOPIC in wanted:
                    yield ACTION_TOPIC, t, SimpleNamespace(header=header, name=self.action_names, position=frame.action)
                for cam in cameras:
                    topic = camera_topic(cam)
                    if topic not in wanted:
                        continue
                    rgb = np.ascontiguousarray(frame.images[cam])
                    h, w = rgb.shape[:2]
                    msg = SimpleNamespace(
                        header=header, height=h, width=w, encoding="rgb8", is_bigendian=0, step=w * 3,
                        data=rgb.reshape(-1),
                    )  # fmt: skip
                    yield topic, t, msg
                self.decoded += 1
            offset += length / self.folder.fps + EPISODE_GAP_S


def opener(config: OmniConfig, episodes: Sequence[int] | None) -> Any:
    """What the Replayer opens each 'bag' path with, for datasets evaluated with `config` (from dataset_config)."""

    def open_dataset(path: str) -> DatasetRecording:
        return DatasetRecording(DatasetFolder(path), episodes, config.robot.joint_names, config.eval.trigger_camera)

    return open_dataset
