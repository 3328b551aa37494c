"""Demonstrations -> training -> closed-loop evaluation: datasets, the training loop, the CLI end to end."""

from __future__ import annotations

import itertools
import json
import subprocess

import numpy as np
import pytest
import torch

from omni_ros.config import ConfigError, load_config
from omni_ros.policy.layouts.omni import load_checkpoint
from omni_ros.policy.pi0.presets import preset
from omni_ros.sim.collect import CollectOptions, collect
from omni_ros.sim.config import SimConfig
from omni_ros.sim.dataset import DatasetError, DatasetMeta, DatasetWriter, iter_samples, read_meta
from omni_ros.sim.evaluate import EvalOptions, evaluate, score, write_video
from omni_ros.sim.expert import ReachExpert
from omni_ros.sim.task import parse_target
from omni_ros.train.config import TrainConfig
from omni_ros.train.data import load_tiles
from omni_ros.train.loop import TrainError, learning_rate, train

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def collect_to(path, episodes, seed=0, **options):
    meta = DatasetMeta(["base", "wrist"], 3, 3, 16, 0.05)
    writer = DatasetWriter(path, meta, shard_size=25)
    results = []

    def on_episode(samples, result):
        results.append(result)
        for s in samples:
            writer.add(s)

    collect(SimConfig(), CollectOptions(**options), range(seed, seed + episodes), on_episode)
    return writer.close(), results


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    path = tmp_path_factory.mktemp("demos")
    meta, results = collect_to(path, 4)
    return path, meta, results


def test_collected_samples_are_observations_labelled_by_the_expert(tiny_data):
    path, meta, _ = tiny_data
    assert read_meta(path).samples == meta.samples > 4 * 5
    assert len(meta.shards) > 1  # shard_size 25 splits them
    samples = list(iter_samples(path))
    assert len(samples) == meta.samples
    assert {s.episode for s in samples} == {0, 1, 2, 3}
    from omni_ros.sim.collect import make_env

    env, expert = make_env(SimConfig(), CollectOptions())
    for s in samples[::7]:
        # Images as the cameras render them, the prompt names the labelled target.
        assert s.images["base"].shape == (224, 224, 3) and s.images["base"].dtype == np.uint8
        assert parse_target(s.prompt) == s.target
        env.reset(s.episode)
        assert env.task.target == s.target
        # The label is the expert's chunk from the recorded state.
        np.testing.assert_allclose(s.actions, expert.chunk(s.state, env.scene.block(s.target).xy), atol=1e-5)
    # Several samples per episode, taken as the arm moves.
    per_episode = [s for s in samples if s.episode == 0]
    assert len({tuple(np.round(s.state, 3)) for s in per_episode}) > 5


def test_noise_injection_moves_states_off_the_expert_path(tmp_path):
    _, clean = collect_to(tmp_path / "clean", 3, noise_prob=0.0)
    _, noisy = collect_to(tmp_path / "noisy", 3, noise_prob=1.0)
    assert all(r.success for r in clean)
    clean_t = [r.time_to_success for r in clean]
    noisy_t = [r.time_to_success if r.success else 99.0 for r in noisy]
    assert np.mean(noisy_t) > np.mean(clean_t)


def test_dataset_refuses_overwrite_and_mismatched_layouts(tmp_path, tiny_data):
    path, _, _ = tiny_data
    with pytest.raises(DatasetError, match="already holds"):
        DatasetWriter(path, DatasetMeta(["base", "wrist"], 3, 3, 16, 0.05))
    with pytest.raises(DatasetError, match=r"no meta\.json"):
        read_meta(tmp_path)
    with pytest.raises(DatasetError, match="model needs 50"):
        load_tiles([path], preset("demo", action_horizon=50))
    with pytest.raises(DatasetError, match=r"0\.02 s"):
        load_tiles([path], preset("small", state_dim=3, action_dim=3))


def test_tiles_are_what_the_policy_sees(tiny_data):
    path, meta, _ = tiny_data
    cfg = preset("demo")
    data = load_tiles([path], cfg)
    assert len(data) == meta.samples
    size = cfg.vision.image_size
    assert data.tiles["wrist"].shape == (meta.samples, size, size, 3)
    assert data.actions.shape == (meta.samples, 16, 3)
    from omni_ros.observation import ObservationSpec, make_observation

    first = next(iter_samples(path))
    obs = make_observation(ObservationSpec(("base", "wrist"), 3, size), first.observation())
    np.testing.assert_array_equal(data.tiles["base"][0], obs.images["base"])


def test_learning_rate_warms_up_then_decays():
    cfg = TrainConfig(steps=1000, lr=1e-3, warmup_steps=100, final_lr_fraction=0.1)
    lrs = [learning_rate(cfg, s) for s in range(1000)]
    assert lrs[0] == pytest.approx(1e-5)
    assert max(lrs) == pytest.approx(1e-3)
    assert np.argmax(lrs) == 99
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01)
    assert all(a >= b for a, b in itertools.pairwise(lrs[100:]))


def fixed_batch_loss(model, stats, data, n=32):
    from omni_ros.policy.train import Trainer

    trainer = Trainer(model, stats, seed=123)
    idx = np.arange(min(n, len(data)))
    batch = trainer.batch(data.observations(idx), data.actions[idx])
    with torch.no_grad():
        return float(model.eval().loss(**batch, generator=torch.Generator().manual_seed(7)))


def test_training_reduces_loss_and_resumes_exactly(tmp_path, tiny_data):
    from omni_ros.policy.pi0.processing import fit_norm_stats
    from omni_ros.train.loop import _fresh_model

    path, _, _ = tiny_data
    data = load_tiles([path], preset("demo"))
    quiet = {"dataset": data, "log": lambda *_: None}
    cfg = TrainConfig(steps=100, batch_size=8, lr=2e-3, warmup_steps=10, checkpoint_every=50, log_every=20, threads=1)
    result = train(cfg, [path], tmp_path / "run", **quiet)
    assert result.steps == 100
    # The demo preset learns chunks relative to the state: its statistics are those of the deltas.
    stats = fit_norm_stats(preset("demo"), data.states, data.actions)
    before = fixed_batch_loss(_fresh_model(cfg, preset("demo"))[0], stats, data)
    trained, trained_stats, extra = load_checkpoint(tmp_path / "run")
    assert trained_stats == stats and extra["trained_steps"] == 100
    after = fixed_batch_loss(trained, stats, data)
    assert after < 0.7 * before

    # Interrupted at step 40 and resumed, the run reaches the very same weights as running through.
    train(cfg, [path], tmp_path / "split", stop_after=40, **quiet)
    assert load_checkpoint(tmp_path / "split")[2]["trained_steps"] == 40
    with pytest.raises(TrainError, match="--resume"):
        train(cfg, [path], tmp_path / "split", **quiet)
    train(cfg, [path], tmp_path / "split", resume=True, **quiet)
    split = load_checkpoint(tmp_path / "split")[0]
    for (name, a), b in zip(trained.state_dict().items(), split.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    logged = [json.loads(line)["step"] for line in (tmp_path / "split" / "train_log.jsonl").read_text().splitlines()]
    assert logged == [20, 40, 60, 80, 100]
    with pytest.raises(TrainError, match="nothing to resume"):
        train(cfg, [path], tmp_path / "fresh", resume=True, **quiet)

    # Fine-tuning starts from the weights and keeps the normalization they were trained with.
    tune = TrainConfig(**{**cfg.__dict__, "steps": 3, "init_checkpoint": str(tmp_path / "run")})
    train(tune, [path], tmp_path / "tuned", **quiet)
    tuned, tuned_stats, tuned_extra = load_checkpoint(tmp_path / "tuned")
    assert tuned_stats == stats and tuned_extra["trained_steps"] == 3
    assert fixed_batch_loss(tuned, stats, data) < 0.8 * before


def test_training_recipe_file_is_valid(root):
    cfg = load_config(root / "config" / "train_demo.yaml", TrainConfig)
    assert cfg.preset == "demo" and cfg.steps > 1000
    bad = root / "config" / "default.yaml"
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(bad, TrainConfig)


def test_scores_count_prompt_following_and_wrong_blocks():
    from omni_ros.sim.evaluate import EpisodeRecord

    records = [
        EpisodeRecord(1, "reach the red block", "red", True, 1.5, 0.01, "red"),
        EpisodeRecord(1, "reach the blue block", "blue", True, 2.5, 0.01, "blue", alternate=True),
        EpisodeRecord(2, "reach the red block", "red", False, None, 0.3, "green"),
        EpisodeRecord(2, "reach the green block", "green", True, 2.0, 0.01, "green", alternate=True),
    ]
    s = score("x", records)
    assert s.success_rate == 0.5 and s.prompt_following_rate == 1.0 and s.both_prompts_rate == 0.5
    assert s.wrong_block_rate == 0.25
    assert s.mean_time_to_success == 1.5


def test_expert_scores_full_marks_and_makes_a_video(tmp_path):
    from omni_ros.sim.env import SimEnv

    env = SimEnv(SimConfig())
    expert = ReachExpert(env.arm, env.home, horizon=16, dt=0.05)
    # The expert reads the target from the prompt it is shown, like a policy must.
    from omni_ros.sim.task import parse_target as target_of

    def policy(obs):
        return expert.chunk(obs["state"], env.scene.block(target_of(obs["prompt"])).xy)

    options = EvalOptions(episodes=3, seed=500, video_episodes=1)
    result, clips = evaluate("expert", policy, SimConfig(), options, action_dt=0.05, env=env)
    assert result.success_rate == 1.0 and result.prompt_following_rate == 1.0
    assert 0.5 < result.mean_time_to_success < 5.0
    assert len(clips) == 2 and clips[0].prompt != clips[1].prompt
    gif = write_video(clips, tmp_path / "demo.gif", scale=0.5)
    assert gif.stat().st_size > 1000
    import cv2

    frames = cv2.imreadanimation(str(gif))[1]
    assert len(frames.frames) == sum(len(c.frames) for c in clips)


def test_collect_train_eval_end_to_end(tmp_path, python, root):
    def cli(*args):
        return subprocess.run(
            [python, "-m", "omni_ros.cli", *map(str, args)], capture_output=True, text=True, cwd=root, timeout=240
        )

    data, run = tmp_path / "data", tmp_path / "run"
    c = cli("sim", "collect", "--episodes", 3, "--seed", 10, "--out", data)
    assert c.returncode == 0, c.stderr
    assert "3 episodes" in c.stdout and "collect [" in c.stderr
    again = cli("sim", "collect", "--episodes", 3, "--out", data)
    assert again.returncode == 2 and "--append" in again.stderr
    t = cli("train", "--config", root / "config/train_demo.yaml", "--data", data, "--out", run, "--steps", 4)
    assert t.returncode == 0, t.stderr
    assert "train [" in t.stderr and "4 steps" in t.stdout
    report = tmp_path / "report.json"
    e = cli(
        "sim", "eval", "--checkpoint", run, "--episodes", 1, "--video", tmp_path / "v.gif", "--video-episodes", 1,
        "--json", report, "--offline", data, "--offline-samples", 5, "--threads", 1,
    )  # fmt: skip
    assert e.returncode == 0, e.stderr
    out = json.loads(report.read_text())
    assert [r["name"] for r in out["results"]] == ["run", "demo (random weights)"]
    assert out["offline"]["run"]["samples"] == 5
    assert (tmp_path / "v.gif").stat().st_size > 0
    bad = cli("train", "--data", tmp_path / "nothing", "--out", tmp_path / "x", "--steps", 1)
    assert bad.returncode == 2 and "no meta.json" in bad.stderr


def test_train_config_overrides_preset_fields():
    from omni_ros.config import ConfigError
    from omni_ros.train.loop import _model_config

    cfg = _model_config(TrainConfig(preset="demo", model={"vision": {"image_size": 64}, "num_steps": 3}))
    assert cfg.vision.image_size == 64 and cfg.num_steps == 3
    assert cfg.vision.patch_size == preset("demo").vision.patch_size, "untouched nested fields keep the preset's"
    with pytest.raises((ConfigError, ValueError), match="imag_size"):
        _model_config(TrainConfig(preset="demo", model={"vision": {"imag_size": 64}}))


def test_collected_goals_are_the_poses_the_expert_reaches(tiny_data):
    path, _, _ = tiny_data
    from omni_ros.sim.collect import make_env

    samples = list(iter_samples(path))
    assert all(s.goal is not None and s.goal.shape == (3,) for s in samples)
    env, _ = make_env(SimConfig(), CollectOptions())
    for s in samples[:: max(1, len(samples) // 8)]:
        env.reset(s.episode)
        tip = env.arm.end_effector(np.asarray(s.goal, dtype=np.float64))
        np.testing.assert_allclose(tip, env.scene.block(s.target).xy, atol=1e-4)
    assert load_tiles([path], preset("demo")).goals.shape == (len(samples), 3)


def test_goal_head_loss_is_added_and_learned(tiny_data):
    from omni_ros.policy.pi0.modeling import Pi0Model
    from omni_ros.policy.pi0.processing import fit_norm_stats
    from omni_ros.policy.train import Trainer

    path, _, _ = tiny_data
    cfg = preset("demo")
    data = load_tiles([path], cfg)
    stats = fit_norm_stats(cfg, data.states, data.actions)
    torch.manual_seed(0)
    model = Pi0Model(cfg)
    trainer = Trainer(model, stats, lr=3e-3, seed=0, goal_weight=1.0)
    idx = np.arange(16)
    batch = trainer.batch(data.observations(idx), data.actions[idx], data.goals[idx])
    assert batch["goal"].shape == (16, 3)

    def losses():
        with torch.no_grad():
            kw = {k: v for k, v in batch.items() if k != "goal"}
            plain = float(model.loss(**kw, generator=torch.Generator().manual_seed(1)))
            both = float(model.loss(**batch, goal_weight=1.0, generator=torch.Generator().manual_seed(1)))
        return plain, both - plain

    _, goal_before = losses()
    assert goal_before > 0.1, "the goal term adds to the flow-matching loss"
    for _ in range(60):
        trainer.step(batch)
    assert losses()[1] < 0.3 * goal_before
    # The head is training-only: inference reads the action tokens alone.
    with pytest.raises(ValueError, match="goal head"):
        Trainer(Pi0Model(preset("tiny")), stats, goal_weight=1.0)
