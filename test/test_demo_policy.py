"""The shipped demo checkpoint: the default policy of the simulated robot, and it does what it is told."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omni_ros.backends.factory import load_policy
from omni_ros.config import load_config
from omni_ros.policy.layouts.omni import read_checkpoint_config
from omni_ros.sim.evaluate import HELD_OUT_SEED, EvalOptions, evaluate

SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints" / "demo"
pytestmark = [
    pytest.mark.skipif(
        not (SHIPPED / "model.safetensors").is_file(), reason="no shipped demo checkpoint (checkpoints/demo)"
    ),
    pytest.mark.usefixtures("torch_one_thread"),
]


@pytest.fixture(scope="module")
def sim_config(root):
    return load_config(root / "config" / "sim.yaml")


@pytest.fixture(scope="module")
def demo(sim_config):
    torch.set_num_threads(1)
    return load_policy(sim_config.policy, camera_names=["base", "wrist"], state_dim=3, action_dim=3)


def test_shipped_checkpoint_is_small_and_the_sim_default(root, sim_config, demo):
    ckpt = root / "checkpoints" / "demo"
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "model.safetensors"]
    assert sum(p.stat().st_size for p in ckpt.iterdir()) < 20 * 2**20
    assert sim_config.policy.checkpoint == str(ckpt.resolve())
    cfg, _, extra = read_checkpoint_config(ckpt)
    assert cfg.name == "demo" and cfg.camera_names == ["base", "wrist"] and cfg.state_dim == 3
    assert extra["trained_steps"] > 1000
    assert demo.metadata.action_dt == cfg.action_dt


def run(policy, sim_config, episodes, seed):
    options = EvalOptions(episodes=episodes, seed=seed, latency=0.1)
    return evaluate(
        policy.metadata.model,
        lambda obs: policy.infer(obs)["actions"],
        sim_config.sim,
        options,
        action_dt=policy.metadata.action_dt,
        control=sim_config.control,
    )[0]


def test_demo_reaches_the_prompted_block_where_random_weights_cannot(sim_config, demo):
    from omni_ros.policy.loading import from_model
    from omni_ros.policy.pi0.modeling import Pi0Model

    seed = HELD_OUT_SEED + 500  # layouts never seen in training (seeds 0..) nor in the README numbers
    trained = run(demo, sim_config, 6, seed)
    torch.manual_seed(0)
    random = from_model(Pi0Model(demo.processor.cfg), demo.processor.norm_stats, name="random")
    chance = run(random, sim_config, 6, seed)
    # Each layout runs twice: its own prompt, then a prompt naming another block.
    assert trained.success_rate >= 4 / 6, trained.records
    assert trained.prompt_following_rate >= 4 / 6, trained.records
    assert chance.success_rate <= 1 / 6 and chance.prompt_following_rate <= 1 / 6
    assert trained.mean_time_to_success < 6.0


def test_rosbag_replay_scores_the_demo_far_below_holding_still(root, tmp_path):
    """Recorded expert episodes replayed through the evaluator: the policy's action error next to the constant
    baseline (hold the observed joint positions) on the same values."""
    from omni_ros.eval.evaluate import evaluate as evaluate_bags
    from omni_ros.eval.record_sim import record_sim

    config = load_config(root / "config" / "eval_sim.yaml")
    assert config.policy.checkpoint == str(SHIPPED.resolve())
    record_sim(config, tmp_path / "bag", episodes=2, seed=HELD_OUT_SEED + 700)
    overall = evaluate_bags([str(tmp_path / "bag")], config, progress=False).document["overall"]
    hold = overall["baseline_hold"]
    assert overall["aligned_samples"] > 20 and hold["scored_values"] == overall["scored_values"]
    assert overall["mae"] < 0.4 * hold["mae"], (overall["mae"], hold["mae"])
