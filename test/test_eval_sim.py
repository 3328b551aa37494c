"""`omni-ros bag record-sim` -> `omni-ros eval` with the tiny policy, in process (sqlite3 and mcap)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from omni_ros.cli import main
from omni_ros.config import load_config
from omni_ros.eval.bag import ACTION_CHUNK, Bag
from omni_ros.eval.evaluate import evaluate
from omni_ros.eval.replay import Replayer
from omni_ros.eval.schema import validate
from omni_ros.observation import ObservationSpec
from omni_ros.policy.base import BasePolicy, PolicyMetadata

CONFIG = """
name: eval_sim_test
policy: {preset: tiny, num_threads: 1}
robot: {joint_names: [joint_1, joint_2, joint_3], dry_run: false}
sim: {image_width: 64, image_height: 64, episode_time_s: 1.5, camera_rate_hz: 15.0}
eval:
  cameras: [{name: base, topic: /camera/base/image_raw}, {name: wrist, topic: /camera/wrist/image_raw}]
  ground_truth: {topic: /arm_controller/joint_trajectory}
  every_k_frames: 2
  episode_marker_topic: /omni_ros/prompt
"""


@pytest.fixture(scope="module")
def sim_bag(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("sim")
    config = root / "c.yaml"
    config.write_text(CONFIG)
    bag = root / "bag"
    assert main(["bag", "record-sim", "--episodes", "2", "--out", str(bag), "--storage", "sqlite3",
                 "--config", str(config), "-q"]) == 0  # fmt: skip
    return config, bag


class HoldPolicy(BasePolicy):
    """Predicts 'stay where you are' (the measured state for every step)."""

    def __init__(self, joints: int = 3, cameras=("base", "wrist")) -> None:
        self.spec = ObservationSpec(camera_names=tuple(cameras), state_dim=joints, image_size=64)
        self.metadata = PolicyMetadata("hold", "test", tuple(cameras), 64, joints, joints, 10, 0.02)

    def infer(self, obs, *, noise=None):
        return {"actions": np.tile(np.asarray(obs["state"], np.float32), (10, 1))}


def test_record_sim_writes_the_node_topics_and_custom_messages(sim_bag):
    _, bag = sim_bag
    with Bag(bag) as b:
        assert b.storage == "sqlite3"
        assert b.topics["/camera/base/image_raw"] == "sensor_msgs/msg/Image"
        assert b.topics["/joint_states"] == "sensor_msgs/msg/JointState"
        assert b.topics["/omni_ros/prompt"] == "std_msgs/msg/String"
        assert b.topics["/arm_controller/joint_trajectory"] == "trajectory_msgs/msg/JointTrajectory"
        assert b.topics["/omni_ros/action_chunk"] == ACTION_CHUNK
        assert b.counts["/omni_ros/prompt"] == 2
        chunks = [m for _, _, m in b.read(["/omni_ros/action_chunk"])]
    assert chunks and all(c.horizon == 50 and c.action_dim == 3 and len(c.actions) == 150 for c in chunks)
    assert list(chunks[0].joint_names) == ["joint_1", "joint_2", "joint_3"]


def test_cli_eval_of_a_sim_bag_with_the_tiny_policy(sim_bag, tmp_path, capsys):
    config, bag = sim_bag
    out = tmp_path / "out"
    assert main(["eval", str(bag), "--config", str(config), "--out", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "metrics.json").read_text())
    assert validate(doc) == []
    assert doc["policy"]["model"].startswith("tiny") and doc["overall"]["episodes"] == 2
    assert doc["overall"]["aligned_samples"] > 10
    assert {e["prompt"] for e in doc["episodes"]} == {p for p in _prompts(bag)}
    assert "MAE" in printed and "report.html" in printed and (out / "report.html").stat().st_size > 10_000


@pytest.mark.parametrize("split", [{"episode_gap_s": 0.5, "episode_marker_topic": ""}, {}])
def test_sim_episodes_split_by_gap_or_marker(sim_bag, split):
    config_path, bag = sim_bag
    config = load_config(config_path)
    for key, value in split.items():
        setattr(config.eval, key, value)
    result = evaluate([str(bag)], config, policy=HoldPolicy(), progress=False)
    eps = result.result.episodes
    assert len(eps) == 2
    assert eps[1].start - eps[0].end > 0.9  # the recorder's 1 s of silence
    # Holding still is wrong while the expert moves: a real, positive error.
    assert result.document["overall"]["mae"] > 1e-3


def test_no_split_makes_one_episode(sim_bag):
    config_path, bag = sim_bag
    config = load_config(config_path)
    config.eval.episode_marker_topic = ""
    result = Replayer(config, HoldPolicy()).run([str(bag)])
    assert len(result.episodes) == 1


def _prompts(bag):
    with Bag(bag) as b:
        return [m.data for _, _, m in b.read(["/omni_ros/prompt"])]
