"""The config a bag was recorded with, stored in the bag so that `omni-ros eval BAG` needs nothing else.

`omni-ros bag record-sim` writes the whole config it ran (robot, topics, control, sim, policy) as custom data
`omni_ros.config` (JSON) in the bag's metadata, with its `eval:` section filled in to match what it wrote: the
camera, joint state, prompt and command topics, and the episode markers (the prompt is published once at the
start of each episode, and episodes are separated by silence). `omni-ros eval` uses that config when it is
given neither `--config` nor `--sim`; with a config of its own that sets no episode markers, it still takes the
bag's markers, since they describe the recording and not the robot.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omni_ros.config import ConfigError, OmniConfig, from_dict, to_dict
from omni_ros.eval.config import EvalCamera, EvalConfig
from omni_ros.eval.errors import EvalError

CONFIG_KEY = "omni_ros.config"


@dataclass
class RecordedConfig:
    config: OmniConfig
    bag: str

    def describe(self) -> str:
        ev = self.config.eval
        markers = [f"a message on {ev.episode_marker_topic}"] if ev.episode_marker_topic else []
        if ev.episode_gap_s > 0:
            markers.append(f"{ev.episode_gap_s:g} s of silence")
        joints = len(self.config.robot.joint_names)
        split = " or ".join(markers) or "nothing (one episode per bag)"
        return f"config '{self.config.name}' recorded in {self.bag} ({joints} joints; a new episode at {split})"


def recording_eval_config(
    config: OmniConfig, camera_topics: dict[str, str], joint_states: str, prompt_topic: str, gap_s: float
) -> EvalConfig:
    """The `eval:` section that replays what a recorder wrote with `config`."""
    ev = copy.deepcopy(config.eval)
    ev.cameras = [EvalCamera(name, topic) for name, topic in camera_topics.items()]
    ev.joint_states = joint_states
    ev.prompt_topic = prompt_topic
    ev.prompt = ""
    ev.ground_truth.source = "command"
    ev.ground_truth.topic = config.control.command_topic
    ev.episode_marker_topic = prompt_topic
    ev.episode_gap_s = gap_s / 2 if gap_s > 0 else 0.0
    return ev


def config_json(config: OmniConfig, eval_config: EvalConfig) -> str:
    """What the recorder stores under CONFIG_KEY."""
    data = to_dict(config)
    data["eval"] = to_dict(eval_config)
    return json.dumps(data)


def read_recorded_config(bag_path: str) -> RecordedConfig | None:
    """The config stored in the bag at `bag_path`, or None when it carries none (a bag not recorded by us)."""
    from omni_ros.eval.bag import Bag

    with Bag(bag_path) as bag:
        text = bag.custom_data.get(CONFIG_KEY)
    if text is None:
        return None
    source = f"bag {bag_path}: custom data {CONFIG_KEY}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EvalError(f"{source}: not valid JSON: {exc}") from exc
    try:
        config = from_dict(OmniConfig, data, source=source)
    except ConfigError as exc:
        raise EvalError(f"{exc}; pass --config to evaluate with a config of your own") from exc
    return RecordedConfig(config, bag_path)


def recorded_config(bags: Sequence[str]) -> RecordedConfig | None:
    """The one config these bags were recorded with; None when the first carries none.

    Bags recorded with different robots or topics cannot be replayed with one config: that is an error
    naming both bags.
    """
    # A bag that is not there is the evaluator's to report, with everything else it checks first.
    first = read_recorded_config(bags[0]) if bags and Path(bags[0]).exists() else None
    if first is None:
        return None
    keep = ("robot", "topics", "control", "eval")
    for path in bags[1:]:
        other = read_recorded_config(path) if Path(path).exists() else None
        if other is None:
            continue
        for section in keep:
            if to_dict(getattr(other.config, section)) != to_dict(getattr(first.config, section)):
                raise EvalError(
                    f"bags {first.bag} and {path} were recorded with different '{section}' settings; evaluate them "
                    f"separately or pass --config"
                )
    return first


def apply_recorded_markers(config: OmniConfig, recorded: RecordedConfig) -> bool:
    """Use the bag's episode markers when `config` sets none; True when it did."""
    ev, rec = config.eval, recorded.config.eval
    if ev.episode_marker_topic or ev.episode_gap_s > 0:
        return False
    if not rec.episode_marker_topic and rec.episode_gap_s <= 0:
        return False
    ev.episode_marker_topic = rec.episode_marker_topic
    ev.episode_gap_s = rec.episode_gap_s
    return True
