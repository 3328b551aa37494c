"""Real-time chunking through a real policy (the shipped demo checkpoint) and training-time RTC."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from helpers.rtc_util import demo_policy, two_observations
from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.loading import from_model
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pi0.presets import preset
from omni_ros.policy.rtc import RtcError, RtcRequest, clean_prefix
from omni_ros.policy.train import Trainer

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def demo(root):
    return demo_policy(root)


@pytest.fixture(scope="module")
def observations():
    return two_observations(1_000_003, np.array([0.3, -0.2, 0.1]), 15)


def plan_from(demo, first, shift):
    """The first observation's chunk from action `shift` on: what the robot still executes at the second."""
    return demo.infer(first)["actions"][shift:]


def test_zero_beta_is_the_plain_chunk_exactly(demo, observations):
    first, second = observations
    plan = plan_from(demo, first, 6)
    plain = demo.infer(second)["actions"]
    out = demo.infer(second, rtc=RtcRequest(plan, inference_delay=6, max_guidance_weight=0.0))["actions"]
    np.testing.assert_array_equal(out, plain)
    none = demo.infer(second, rtc=RtcRequest(plan, inference_delay=0, schedule="zeros"))["actions"]
    np.testing.assert_array_equal(none, plain)


def test_guidance_makes_the_new_chunk_continue_the_plan(demo, observations):
    first, second = observations
    d = 6
    plan = plan_from(demo, first, d)  # 10 actions of the old plan remain
    plain = demo.infer(second)["actions"]
    guided = demo.infer(second, rtc=RtcRequest(plan, inference_delay=d))["actions"]
    before = np.abs(plain[:d] - plan[:d]).mean()
    after = np.abs(guided[:d] - plan[:d]).mean()
    assert before > 0.02, "the two chunks must disagree for this test to mean anything"
    # Guidance is a soft constraint: measured 0.14 of the disagreement with the demo's 5 steps (beta 5).
    assert after < 0.3 * before, (before, after)
    # Past the old plan the new chunk is the policy's own.
    assert np.abs(guided[len(plan) :] - plain[len(plan) :]).max() < np.abs(guided[:d] - plain[:d]).max() + 0.5


def test_inpainting_freezes_the_prefix_in_robot_units(demo, observations):
    first, second = observations
    plan = plan_from(demo, first, 6)
    out = demo.infer(second, rtc=RtcRequest(plan, inference_delay=4, method="inpaint"))["actions"]
    np.testing.assert_allclose(out[:4], plan[:4], atol=1e-5)  # through normalization and relative actions


def test_guided_rtc_under_a_callers_inference_mode_is_refused_cleanly(demo, observations):
    first, second = observations
    plan = plan_from(demo, first, 6)
    with torch.inference_mode(), pytest.raises(RtcError, match="inference_mode"):
        demo.infer(second, rtc=RtcRequest(plan, inference_delay=6))
    # Inpainting needs no gradient and runs there, giving what it gives outside: the plan's prefix, then the rest.
    inpaint = RtcRequest(plan, inference_delay=6, method="inpaint")
    with torch.inference_mode():
        inside = demo.infer(second, rtc=inpaint)["actions"]
    np.testing.assert_array_equal(inside, demo.infer(second, rtc=inpaint)["actions"])
    np.testing.assert_allclose(inside[:6], plan[:6], atol=1e-5)


def test_requests_that_do_not_fit_the_policy_are_refused(demo, observations):
    _, second = observations
    with pytest.raises(RtcError, match="joints"):
        demo.infer(second, rtc=RtcRequest(np.zeros((8, 5)), inference_delay=2))
    with pytest.raises(RtcError, match="longer than the chunk"):
        demo.infer(second, rtc=RtcRequest(np.zeros((8, 3)), inference_delay=40))


# ----- training-time RTC --------------------------------------------------------------------------------------


def test_clean_prefix_keeps_the_first_d_actions_clean_at_time_zero():
    actions = torch.randn(3, 8, 2)
    x_t = torch.randn(3, 8, 2)
    t = torch.tensor([0.9, 0.5, 0.2])
    x, times, weight = clean_prefix(actions, x_t, t, torch.tensor([0, 3, 8]))
    assert torch.equal(x[0], x_t[0]) and torch.equal(times[0], torch.full((8,), 0.9))
    assert torch.equal(x[1, :3], actions[1, :3]) and torch.equal(x[1, 3:], x_t[1, 3:])
    assert torch.equal(times[1], torch.tensor([0, 0, 0, 0.5, 0.5, 0.5, 0.5, 0.5]))
    assert torch.equal(weight[1], torch.tensor([0.0, 0, 0, 1, 1, 1, 1, 1])) and weight[2].sum() == 0


def test_training_time_rtc_puts_no_loss_on_the_prefix():
    cfg = preset("tiny")
    torch.manual_seed(0)
    model = Pi0Model(cfg)
    trainer = Trainer(model, NormStats.identity(cfg.state_dim, cfg.action_dim), rtc_max_delay=4)
    g = torch.Generator().manual_seed(0)
    b, h = 2, cfg.action_horizon
    s, c, t = cfg.vision.image_size, len(cfg.camera_names), cfg.tokenizer.max_tokens
    inputs = ModelInputs(
        images=torch.rand(b, c, 3, s, s, generator=g) * 2 - 1,
        image_masks=torch.ones(b, c, dtype=torch.bool),
        tokens=torch.randint(0, 256, (b, t), generator=g),
        token_mask=torch.ones(b, t, dtype=torch.bool),
        state=torch.randn(b, cfg.state_dim, generator=g),
    )
    batch = {"inputs": inputs, "actions": torch.randn(b, h, cfg.action_dim, generator=g)}
    delay = torch.tensor([3, 0])
    # The velocity predicted for the clean prefix gets no gradient: the loss does not look at it.
    seen = {}
    hook = model.expert.action_out_proj.register_forward_hook(lambda m, i, o: o.retain_grad() or seen.update(v=o))
    loss = model.loss(**batch, generator=torch.Generator().manual_seed(1), rtc_delay=delay)
    loss.backward()
    hook.remove()
    grad = seen["v"].grad
    assert torch.all(grad[0, :3] == 0) and torch.all(grad[0, 3:].abs().sum(-1) > 0) and torch.all(grad[1] != 0)
    # With every delay 0 it is the ordinary loss.
    plain = model.loss(**batch, generator=torch.Generator().manual_seed(1))
    zero = model.loss(**batch, generator=torch.Generator().manual_seed(1), rtc_delay=torch.zeros(b, dtype=torch.long))
    torch.testing.assert_close(zero, plain)
    assert trainer.step(batch) > 0
    with pytest.raises(ValueError, match="rtc_max_delay"):
        Trainer(model, NormStats.identity(cfg.state_dim, cfg.action_dim), rtc_max_delay=h)


def test_a_model_trained_with_rtc_inpaints_with_a_clean_prefix():
    cfg = dataclasses.replace(preset("tiny"), rtc_max_delay=3)
    torch.manual_seed(0)
    model = Pi0Model(cfg)
    policy = from_model(model, NormStats.identity(cfg.state_dim, cfg.action_dim))
    rng = np.random.default_rng(0)
    obs = {"images": {n: rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for n in cfg.camera_names}}
    obs |= {"state": rng.normal(size=cfg.state_dim), "prompt": "reach"}
    plan = rng.normal(size=(6, cfg.action_dim))
    seen = []
    hook = model.expert.register_forward_pre_hook(lambda m, args: seen.append(args[4].clone()))
    out = policy.infer(obs, rtc=RtcRequest(plan, inference_delay=2, method="inpaint"))["actions"]
    hook.remove()
    np.testing.assert_allclose(out[:2], plan[:2], atol=1e-5)
    # Every denoising step saw per-token times, 0 on the frozen prefix.
    assert len(seen) == cfg.num_steps and all(t.shape == (1, cfg.action_horizon) for t in seen)
    assert all(torch.all(t[0, :2] == 0) and torch.all(t[0, 2:] > 0) for t in seen)
    with pytest.raises(ValueError, match="rtc_max_delay"):
        dataclasses.replace(preset("tiny"), rtc_max_delay=cfg.action_horizon)


def test_omni_ros_train_rtc_max_delay_is_recorded_in_the_checkpoint(tmp_path):
    from omni_ros.policy.layouts.omni import load_checkpoint
    from omni_ros.sim.dataset import DatasetMeta
    from omni_ros.train.config import TrainConfig
    from omni_ros.train.data import TileDataset
    from omni_ros.train.loop import TrainError, train

    cfg = preset("tiny")
    rng = np.random.default_rng(0)
    n, s = 8, cfg.vision.image_size
    dataset = TileDataset(
        meta=DatasetMeta(list(cfg.camera_names), cfg.state_dim, cfg.action_dim, cfg.action_horizon, cfg.action_dt),
        tiles={c: rng.integers(0, 255, (n, s, s, 3), dtype=np.uint8) for c in cfg.camera_names},
        states=rng.normal(size=(n, cfg.state_dim)).astype(np.float32),
        actions=rng.normal(size=(n, cfg.action_horizon, cfg.action_dim)).astype(np.float32),
        prompts=["reach"] * n,
        episodes=np.arange(n),
    )
    recipe = TrainConfig(preset="tiny", steps=2, batch_size=4, warmup_steps=1, threads=1, rtc_max_delay=3)
    result = train(recipe, [], tmp_path / "run", dataset=dataset, log=lambda *a: None)
    assert result.steps == 2
    model, _, extra = load_checkpoint(tmp_path / "run")
    assert model.cfg.rtc_max_delay == 3 and extra["train_config"]["rtc_max_delay"] == 3
    too_long = TrainConfig(preset="tiny", steps=1, batch_size=4, rtc_max_delay=cfg.action_horizon)
    with pytest.raises(TrainError, match="rtc_max_delay"):
        train(too_long, [], tmp_path / "bad", dataset=dataset, log=lambda *a: None)
