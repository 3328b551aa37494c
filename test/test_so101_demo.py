"""The shipped SO-101 checkpoint: the default policy of `--sim so101`, and it touches the cube it is told to."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from omni_ros.sim.so101.gl import select_gl_backend

select_gl_backend()

from omni_ros.backends.factory import load_policy  # noqa: E402
from omni_ros.config import load_config  # noqa: E402
from omni_ros.policy.layouts.omni import read_checkpoint_config  # noqa: E402
from omni_ros.sim.evaluate import HELD_OUT_SEED, EvalOptions, evaluate  # noqa: E402

SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints" / "so101"
pytestmark = pytest.mark.skipif(
    not (SHIPPED / "model.safetensors").is_file(), reason="no shipped SO-101 checkpoint (checkpoints/so101)"
)


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def sim_config(root):
    return load_config(root / "config" / "sim_so101.yaml")


@pytest.fixture(scope="module")
def so101(sim_config):
    torch.set_num_threads(1)
    names = [c.name for c in sim_config.topics.cameras]
    return load_policy(sim_config.policy, camera_names=names, state_dim=6, action_dim=6)


def test_shipped_checkpoint_is_small_and_the_so101_default(root, sim_config, so101):
    assert sorted(p.name for p in SHIPPED.iterdir()) == ["config.json", "model.safetensors"]
    assert sum(p.stat().st_size for p in SHIPPED.iterdir()) < 20 * 2**20
    assert sim_config.policy.checkpoint == str(SHIPPED.resolve())
    cfg, _, extra = read_checkpoint_config(SHIPPED)
    assert cfg.camera_names == list(sim_config.sim.cameras) and cfg.state_dim == cfg.action_dim == 6
    assert extra["trained_steps"] > 1000
    assert extra["data"]["info"]["sim"]["engine"] == "so101"


def run(policy, sim_config, episodes: int, seed: int, episode_time_s: float):
    sim = dataclasses.replace(sim_config.sim, episode_time_s=episode_time_s)
    options = EvalOptions(episodes=episodes, seed=seed, latency=0.1)
    return evaluate(
        policy.metadata.model,
        lambda obs: policy.infer(obs)["actions"],
        sim,
        options,
        action_dt=policy.metadata.action_dt,
        control=sim_config.control,
    )[0]


def test_so101_demo_touches_the_prompted_cube_where_random_weights_cannot(sim_config, so101):
    from omni_ros.policy.loading import from_model
    from omni_ros.policy.pi0.modeling import Pi0Model

    seed = HELD_OUT_SEED + 500  # layouts never seen in training (seeds < 100,000) nor in the README numbers
    trained = run(so101, sim_config, 5, seed, episode_time_s=8.0)
    torch.manual_seed(0)
    random = from_model(Pi0Model(so101.processor.cfg), so101.processor.norm_stats, name="random")
    chance = run(random, sim_config, 5, seed, episode_time_s=4.0)
    # Each layout runs twice: its own prompt, then a prompt naming another cube.
    assert trained.success_rate >= 3 / 5, trained.records
    assert trained.prompt_following_rate >= 3 / 5, trained.records
    assert chance.success_rate <= 1 / 5 and chance.prompt_following_rate <= 1 / 5, chance.records


def test_rosbag_replay_scores_the_so101_demo_far_below_holding_still(root, tmp_path):
    """Expert episodes of the SO-101 written as a rosbag2 and replayed through the evaluator: the policy's
    action error next to the hold-the-observed-position baseline on the same values."""
    from omni_ros.eval.evaluate import evaluate as evaluate_bags
    from omni_ros.eval.record_sim import record_sim

    config = load_config(root / "config" / "eval_so101.yaml")
    assert config.policy.checkpoint == str(SHIPPED.resolve())
    sim = load_config(root / "config" / "sim_so101.yaml")
    episodes = record_sim(sim, tmp_path / "bag", episodes=2, seed=HELD_OUT_SEED + 700)
    assert all(e.success for e in episodes)
    overall = evaluate_bags([str(tmp_path / "bag")], config, progress=False).document["overall"]
    hold = overall["baseline_hold"]
    assert overall["aligned_samples"] > 10 and hold["scored_values"] == overall["scored_values"]
    assert overall["mae"] < 0.5 * hold["mae"], (overall["mae"], hold["mae"])
