"""Real-time chunking math (omni_ros.policy.rtc): soft masks, guidance weight, guided and inpainted sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pi0.presets import preset
from omni_ros.policy.rtc import (
    RtcError,
    RtcRequest,
    guidance_weight,
    guided_sample,
    guided_velocity,
    inpaint_sample,
    prefix_weights,
    rtc_sample,
)
from omni_ros.policy.sampler import euler_sample

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def paper_mask(d: int, end: int, horizon: int, schedule: str) -> list[float]:
    """DESIGN.md section 9, written out element by element (end = H - s)."""
    d = min(d, end)
    out = []
    for i in range(horizon):
        if i >= end:
            out.append(0.0)
        elif schedule == "ones" or i < d:
            out.append(1.0)
        elif schedule == "zeros":
            out.append(0.0)
        else:
            c = (end - i) / (end - d + 1)
            out.append(c if schedule == "linear" else c * (math.exp(c) - 1) / (math.e - 1))
    return out


@pytest.mark.parametrize("schedule", ["exp", "linear", "ones", "zeros"])
@pytest.mark.parametrize("d,end,horizon", [(2, 6, 10), (0, 10, 10), (3, 16, 16), (5, 11, 16), (7, 4, 10), (0, 0, 8)])
def test_soft_mask_equals_the_formula(schedule, d, end, horizon):
    w = prefix_weights(d, end, horizon, schedule, dtype=torch.float64)
    np.testing.assert_allclose(w.numpy(), paper_mask(d, end, horizon, schedule), rtol=0, atol=1e-12)


def test_soft_mask_of_the_papers_example():
    # kinetix's docstring example: start 2, end 6, total 10 -> 1 1 4/5 3/5 2/5 1/5 0 0 0 0 (linear).
    np.testing.assert_allclose(
        prefix_weights(2, 6, 10, "linear", torch.float64).numpy(), [1, 1, 0.8, 0.6, 0.4, 0.2, 0, 0, 0, 0], atol=1e-12
    )
    exp = prefix_weights(2, 6, 10, "exp", torch.float64).numpy()
    assert exp[0] == exp[1] == 1.0 and np.all(np.diff(exp[1:6]) < 0) and np.all(exp[6:] == 0)


def test_unknown_schedule_is_refused():
    with pytest.raises(RtcError, match="schedule"):
        prefix_weights(1, 4, 8, "cosine")


def test_guidance_weight_is_the_papers_expression_clipped_at_beta():
    t = torch.linspace(0.05, 0.95, 19, dtype=torch.float64)
    tau = 1 - t
    paper = (1 - tau) / tau * (tau**2 + (1 - tau) ** 2) / (1 - tau) ** 2
    np.testing.assert_allclose(guidance_weight(t, 1e9).numpy(), paper.numpy(), rtol=1e-12)
    np.testing.assert_allclose(guidance_weight(t, 5.0).numpy(), np.minimum(paper.numpy(), 5.0), rtol=1e-12)
    # t = 1 (the first, pure-noise step) is infinite before the clip.
    assert guidance_weight(torch.tensor([1.0]), 5.0).item() == 5.0
    assert guidance_weight(torch.tensor([0.5]), 5.0).item() == pytest.approx(2.0)


# ----- sampling with a real (random-weight) model -----------------------------------------------------------


@pytest.fixture(scope="module")
def velocity():
    """The denoise step of a tiny random model at a fixed observation, prefix KV cache computed once."""
    cfg = preset("tiny")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Pi0Model(cfg).eval()
    g = torch.Generator().manual_seed(1)
    s, c, t = cfg.vision.image_size, len(cfg.camera_names), cfg.tokenizer.max_tokens
    images = torch.rand(1, c, 3, s, s, generator=g) * 2 - 1
    masks = torch.ones(1, c, dtype=torch.bool)
    tokens = torch.randint(0, 256, (1, t), generator=g)
    token_mask = torch.ones(1, t, dtype=torch.bool)
    state = torch.randn(1, cfg.state_dim, generator=g)
    with torch.no_grad():
        prefix, prefix_mask = model.embed_prefix(ModelInputs(images, masks, tokens, token_mask, state))
        cache = model.prefill(prefix, prefix_mask)

    def fn(x, time):
        return model.denoise_step(cache, prefix_mask, state, x, time)

    return cfg, fn


def noise_and_target(cfg, seed=2):
    g = torch.Generator().manual_seed(seed)
    shape = (1, cfg.action_horizon, cfg.action_dim)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def test_zero_guidance_weight_equals_plain_sampling_exactly(velocity):
    cfg, fn = velocity
    noise, target = noise_and_target(cfg)
    with torch.no_grad():
        plain = euler_sample(fn, noise, cfg.num_steps)
    weights = prefix_weights(3, 6, cfg.action_horizon, "exp")
    guided = guided_sample(fn, noise, cfg.num_steps, target, weights, max_weight=0.0)
    assert torch.equal(guided, plain)
    # d = 0 with the `zeros` schedule masks nothing: plain sampling again.
    none = guided_sample(fn, noise, cfg.num_steps, target, prefix_weights(0, 6, cfg.action_horizon, "zeros"), 5.0)
    assert torch.equal(none, plain)


def test_guidance_is_continuous_in_beta(velocity):
    """The autograd path itself (not a shortcut) with a tiny beta stays next to the plain chunk."""
    cfg, fn = velocity
    noise, target = noise_and_target(cfg)
    with torch.no_grad():
        plain = euler_sample(fn, noise, cfg.num_steps)
    weights = prefix_weights(3, 6, cfg.action_horizon, "exp")
    tiny = guided_sample(fn, noise, cfg.num_steps, target, weights, max_weight=1e-6)
    assert not torch.equal(tiny, plain)
    assert (tiny - plain).abs().max() < 1e-5


def test_large_beta_makes_the_frozen_prefix_match_the_previous_chunk(velocity):
    cfg, fn = velocity
    noise, target = noise_and_target(cfg)
    d, end, steps = 3, 6, 10
    with torch.no_grad():
        plain = euler_sample(fn, noise, steps)
    weights = prefix_weights(d, end, cfg.action_horizon, "exp")
    # beta = the number of steps: the largest weight that does not overshoot at the first step.
    guided = guided_sample(fn, noise, steps, target, weights, max_weight=float(steps))
    before = (plain[:, :d] - target[:, :d]).abs().max().item()
    after = (guided[:, :d] - target[:, :d]).abs().max().item()
    assert after < 0.01 and after < 0.005 * before, (before, after)
    # Past the old plan (i >= end) nothing pulls: the guided chunk is free there, and stays a chunk of the
    # model (it differs from the target much more than the prefix does).
    assert (guided[:, end:] - target[:, end:]).abs().max().item() > 10 * after


def test_beta_far_above_the_step_count_overshoots(velocity):
    """The trap behind the default beta = num_steps: at t = 1 the step moves by beta / n of the error."""
    cfg, fn = velocity
    noise, target = noise_and_target(cfg)
    weights = prefix_weights(3, 6, cfg.action_horizon, "exp")
    errors = {
        beta: (guided_sample(fn, noise, 10, target, weights, beta)[:, :3] - target[:, :3]).abs().max().item()
        for beta in (10.0, 100.0)
    }
    assert errors[100.0] > 10 * errors[10.0], errors


def test_guided_step_refuses_inference_mode_with_a_clear_error(velocity):
    cfg, fn = velocity
    noise, target = noise_and_target(cfg)
    weights = prefix_weights(2, 6, cfg.action_horizon, "exp")
    with torch.inference_mode(), pytest.raises(RtcError, match="inference_mode"):
        guided_velocity(fn, noise, torch.ones(1), target, weights, 5.0)


def test_inpainting_freezes_the_prefix_exactly(velocity):
    cfg, fn = velocity
    noise, target = noise_and_target(cfg)
    with torch.no_grad():
        plain = euler_sample(fn, noise, cfg.num_steps)
        for clean in (False, True):
            out = inpaint_sample(fn, noise, cfg.num_steps, target, 3, clean_prefix=clean)
            assert torch.equal(out[:, :3], target[:, :3])
            assert not torch.allclose(out[:, 3:], plain[:, 3:])  # the rest attends to the frozen prefix
        assert torch.equal(inpaint_sample(fn, noise, cfg.num_steps, target, 0), plain)


def test_rtc_sample_dispatches_on_the_request(velocity):
    cfg, fn = velocity
    noise, target = noise_and_target(cfg)
    h = cfg.action_horizon
    request = RtcRequest(np.zeros((6, cfg.action_dim)), inference_delay=2, method="inpaint")
    with torch.no_grad():
        out = rtc_sample(fn, noise, cfg.num_steps, target, request)
    assert torch.equal(out[:, :2], target[:, :2])
    guided = RtcRequest(np.zeros((6, cfg.action_dim)), inference_delay=2, max_guidance_weight=0.0)
    with torch.no_grad():
        plain = euler_sample(fn, noise, cfg.num_steps)
    assert torch.equal(rtc_sample(fn, noise, cfg.num_steps, target, guided), plain)
    assert request.mask_range(h) == (2, 6)


# ----- the request ------------------------------------------------------------------------------------------


def test_request_mask_range_follows_the_old_plan_and_the_execution_horizon():
    plan = np.zeros((10, 3))
    assert RtcRequest(plan, 4).mask_range(16) == (4, 10)  # end = R: no old plan beyond it
    assert RtcRequest(plan, 4, execution_horizon=8).mask_range(16) == (4, 8)  # end = H - s
    assert RtcRequest(plan, 4, execution_horizon=2).mask_range(16) == (4, 10)  # never past the plan itself
    assert RtcRequest(plan, 12).mask_range(16) == (10, 10)  # d beyond the plan: only the plan is frozen
    assert RtcRequest(np.zeros((30, 3)), 4).mask_range(16) == (4, 16)  # a longer plan is cut


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"prev_actions": np.zeros(5)}, "2-D"),
        ({"prev_actions": np.full((4, 3), np.nan)}, "NaN"),
        ({"prev_actions": [["a", "b"]]}, "numeric"),
        ({"inference_delay": -1}, "inference_delay"),
        ({"inference_delay": 1.5}, "inference_delay"),
        ({"inference_delay": True}, "inference_delay"),
        ({"execution_horizon": -2}, "execution_horizon"),
        ({"schedule": "cosine"}, "schedule"),
        ({"max_guidance_weight": -1.0}, "max_guidance_weight"),
        ({"max_guidance_weight": float("inf")}, "max_guidance_weight"),
        ({"method": "magic"}, "method"),
    ],
)
def test_malformed_requests_are_refused(kwargs, match):
    args = {"prev_actions": np.zeros((4, 3)), "inference_delay": 2, **kwargs}
    with pytest.raises(RtcError, match=match):
        RtcRequest(**args)


def test_request_must_fit_the_policy():
    request = RtcRequest(np.zeros((4, 3)), 2)
    request.check(horizon=8, action_dim=3)
    with pytest.raises(RtcError, match="joints"):
        request.check(horizon=8, action_dim=4)
    with pytest.raises(RtcError, match="longer than the chunk"):
        RtcRequest(np.zeros((4, 3)), 9).check(horizon=8, action_dim=3)


# ----- the x0 form (a network that predicts the clean action: X-VLA) -------------------------------------------


def _clean_net(seed: int = 0):
    """A small nonlinear x0-predicting network (x_t (B, H, D), t (B,)) -> x0_hat, mixing actions and channels."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(6 * 3, 6 * 3, generator=g) * 0.4, torch.randn(6 * 3, generator=g) * 0.2

    def clean(x, t):
        flat = x.reshape(x.shape[0], -1)
        return (torch.tanh(flat @ a + b) + 0.3 * flat * t[:, None]).reshape(x.shape)

    return clean


def test_the_x0_form_is_the_velocity_correction_of_the_paper():
    # u = (x_t - x0_hat) / t is the velocity the estimate implies; guided_velocity's u - w g, turned back into
    # a clean estimate x_t - t (u - w g), must be guided_clean's x0_hat + t w g (float32 round-off: 1e-5).
    from omni_ros.policy.rtc import guided_clean

    clean = _clean_net()
    x = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(1))
    target = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(2))
    weights = prefix_weights(2, 5, 6, "exp")
    for tv in (1.0, 0.7, 0.3, 0.1):
        t = torch.full((2,), tv)

        def velocity(x_t, tt):
            return (x_t - clean(x_t, tt)) / tt[:, None, None]

        via_velocity = x - t[:, None, None] * guided_velocity(velocity, x, t, target, weights, 5.0)
        guided = guided_clean(clean, x, t, target, weights, 5.0)
        np.testing.assert_allclose(guided.numpy(), via_velocity.numpy(), rtol=0, atol=1e-5)
        assert float((guided - clean(x, t)).abs().max()) > 1e-2  # the correction is not nothing


def _x0_sample(clean, noise, steps, guide=None):
    """X-VLA's sampler: x_t = t noise + (1 - t) x0_hat of the previous step, t = i / steps from 1 down."""
    action = torch.zeros_like(noise)
    for i in range(steps, 0, -1):
        t = torch.full((noise.shape[0],), i / steps)
        x_t = noise * t[:, None, None] + action * (1 - t)[:, None, None]
        action = clean(x_t, t) if guide is None else guide(x_t, t)
    return action


def test_the_x0_form_lands_a_unit_jacobian_network_on_the_plan():
    # x0_hat = x_t + c: the Jacobian a trained denoiser has near the data (about the identity). Measured with
    # 10 steps, beta 10: the prefix's largest error falls to 0.076 of the unguided one (a scalar version with
    # every weight 1: 0.015, the Euler form of the same network 0.026). Asserted: below 0.2 of it, and the
    # actions past the soft mask untouched.
    from omni_ros.policy.rtc import guided_clean

    def clean(x, t):
        return x + 0.3

    noise = torch.zeros(1, 8, 2)
    target = torch.full((1, 8, 2), 1.3)
    weights = prefix_weights(3, 5, 8, "exp")
    plain = _x0_sample(clean, noise, 10)
    guided = _x0_sample(clean, noise, 10, lambda x, t: guided_clean(clean, x, t, target, weights, 10.0))
    before, after = (target - plain)[:, :3].abs().max(), (target - guided)[:, :3].abs().max()
    assert after < 0.2 * before, (before, after)
    torch.testing.assert_close(guided[:, 5:], plain[:, 5:], rtol=0, atol=0)


def test_an_interval_target_pulls_only_what_lies_outside_it():
    # target_high: the estimate's distance to [target, target_high]; inside it there is nothing to correct.
    from omni_ros.policy.rtc import guided_clean

    clean = _clean_net(3)
    x = torch.randn(1, 6, 3, generator=torch.Generator().manual_seed(4))
    t = torch.full((1,), 0.5)
    x0 = clean(x, t)
    weights = torch.ones(6)
    inside = guided_clean(clean, x, t, x0 - 1.0, weights, 5.0, target_high=x0 + 1.0)
    torch.testing.assert_close(inside, x0, rtol=0, atol=1e-6)
    free = guided_clean(
        clean, x, t, torch.full_like(x0, -math.inf), weights, 5.0, target_high=torch.full_like(x0, math.inf)
    )
    torch.testing.assert_close(free, x0, rtol=0, atol=1e-6)
    point = guided_clean(clean, x, t, x0 + 1.0, weights, 5.0)
    one_sided = guided_clean(clean, x, t, x0 + 1.0, weights, 5.0, target_high=torch.full_like(x0, math.inf))
    torch.testing.assert_close(one_sided, point, rtol=0, atol=1e-6)  # below the lower bound: pulled up as to a point
