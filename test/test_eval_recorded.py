"""`omni-ros bag record-sim --out B` then `omni-ros eval B`: the bag says which config and episode markers it was
recorded with, and eval uses them without being told."""

from __future__ import annotations

import json

import pytest
import torch

from omni_ros.cli import main
from omni_ros.eval.bag import Bag
from omni_ros.eval.errors import EvalError
from omni_ros.eval.recorded import CONFIG_KEY, recorded_config

# A small robot of three joints and tiny frames; no eval: section at all (the recorder writes the replay's).
CONFIG = """
name: recorded_test
policy: {preset: tiny, num_threads: 1}
robot: {joint_names: [joint_1, joint_2, joint_3], dry_run: false}
sim: {image_width: 64, image_height: 64, episode_time_s: 1.0, camera_rate_hz: 10.0}
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("recorded")
    config = root / "robot.yaml"
    config.write_text(CONFIG)
    bag = root / "bag"
    assert main(["bag", "record-sim", "--episodes", "3", "--out", str(bag), "--config", str(config), "-q"]) == 0
    return root, bag


def _metrics(out) -> dict:
    return json.loads((out / "metrics.json").read_text())


def test_the_bag_carries_its_config_with_the_replay_topics_and_markers(recorded):
    _root, bag = recorded
    with Bag(bag) as b:
        stored = json.loads(b.custom_data[CONFIG_KEY])
    assert stored["name"] == "recorded_test" and stored["robot"]["joint_names"] == ["joint_1", "joint_2", "joint_3"]
    ev = stored["eval"]
    assert ev["episode_marker_topic"] == "/omni_ros/prompt" and ev["episode_gap_s"] == 0.5
    assert ev["ground_truth"]["topic"] == "/arm_controller/joint_trajectory"
    assert [c["topic"] for c in ev["cameras"]] == ["/camera/base/image_raw", "/camera/wrist/image_raw"]


def test_eval_without_a_config_uses_the_recorded_one(recorded, capsys):
    root, bag = recorded
    out = root / "out_plain"
    assert main(["eval", str(bag), "--out", str(out), "-q"]) == 0
    err = capsys.readouterr().err
    assert "using the config 'recorded_test' recorded in" in err and "a message on /omni_ros/prompt" in err
    doc = _metrics(out)
    assert doc["overall"]["episodes"] == 3 and doc["overall"]["aligned_samples"] > 0
    assert doc["policy"]["model"].startswith("tiny")


def test_a_config_without_markers_takes_the_bags(recorded, tmp_path, capsys):
    _root, bag = recorded
    config = tmp_path / "mine.yaml"
    config.write_text(CONFIG)  # same robot, no eval: section, so no episode markers of its own
    assert main(["eval", str(bag), "--config", str(config), "--out", str(tmp_path / "o1"), "-q"]) == 0
    assert "episode markers from" in capsys.readouterr().err
    assert _metrics(tmp_path / "o1")["overall"]["episodes"] == 3
    # A config with markers of its own keeps them: here a silence the bag never has, so one episode.
    config.write_text(CONFIG + "eval: {episode_gap_s: 100.0}\n")
    assert main(["eval", str(bag), "--config", str(config), "--out", str(tmp_path / "o2"), "-q"]) == 0
    assert "episode markers from" not in capsys.readouterr().err
    assert _metrics(tmp_path / "o2")["overall"]["episodes"] == 1


def test_bags_recorded_for_different_robots_are_not_mixed(recorded, tmp_path):
    _root, bag = recorded
    other = tmp_path / "slow.yaml"
    other.write_text(CONFIG.replace("dry_run: false", "dry_run: false, control_rate_hz: 25.0"))
    slow_bag = tmp_path / "bag_slow"
    assert main(["bag", "record-sim", "--episodes", "1", "--out", str(slow_bag), "--config", str(other), "-q"]) == 0
    with pytest.raises(EvalError, match="recorded with different 'robot' settings"):
        recorded_config([str(bag), str(slow_bag)])
    assert recorded_config([str(bag), str(bag)]).config.name == "recorded_test"
