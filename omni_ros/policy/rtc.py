"""Real-time chunking (RTC): sample the next chunk so that it continues the one being executed.

Black, Galliker, Levine 2025 (arXiv 2506.07339), in openpi's time convention: t runs from 1 (noise) to 0
(actions), x_t = t * noise + (1 - t) * actions, the model predicts u = noise - actions and the Euler step is
x <- x + dt * u with dt = -1 / n. The paper's tau is 1 - t.

While chunk k executes, chunk k + 1 is sampled from an observation taken `d` control steps (the inference
delay) before it can arrive. The previous chunk's actions from the new observation on, Y (shifted so that Y[0]
is due at the observation, zero-padded to the horizon H), are the target:

- the first d actions of the new chunk are the ones the robot executes from the old chunk anyway (weight 1);
- actions d .. H - s - 1 are pulled towards the old plan with a weight that decays (the soft mask); s is the
  execution horizon, the actions of the old chunk executed before this request, so the old plan covers H - s;
- actions from H - s on have no old plan (weight 0).

Guided RTC: at every step the clean estimate x0 = x_t - t * u(x_t) is compared with Y and the weighted error
is pulled back through the model's velocity (a vector-Jacobian product, torch.autograd):
g = [(Y - x0) * W]^T dx0/dx_t, and the step uses u - w(t) g with w(t) = min(beta, c(t)), the paper's
guidance weight. It needs autograd, so it cannot run under `torch.inference_mode`.

A sampler whose network predicts the clean action (X-VLA: x_t = t * noise + (1 - t) * x0_hat of the previous
step, x0_hat = f(x_t, t)) is guided in the same terms: its estimate implies the velocity u = (x_t - x0_hat) / t,
and the guided u - w(t) g gives back the clean estimate x_t - t (u - w g) = x0_hat + t w(t) g, with the same g
(`guided_clean`). The sampler then re-noises that guided estimate as it re-noises its own.

Hard prefix inpainting (no gradient): the first d actions are frozen to Y. For a model trained with
training-time RTC (arXiv 2512.05964) the prefix is clean with per-token time 0, exactly what it was trained
on; for any other model the prefix follows Y's own noising path t * noise + (1 - t) * Y at every step, so
the model sees a consistent prefix and the rest of the chunk attends to it.

`RtcRequest` is what a caller (the chunk executor, the bridge) hands a policy: the old plan in robot units
at the new chunk's action times, d, s and the knobs. Policies convert it into the model's normalized space.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from omni_ros.policy.rtc_request import (  # noqa: F401  (the request side, re-exported for the samplers' callers)
    DEFAULT_MAX_GUIDANCE_WEIGHT,
    METHODS,
    SCHEDULES,
    Method,
    RtcError,
    RtcRequest,
    Schedule,
    normalized_plan,
    supported_rtc_methods,
)

# (x_t (B, H, D), t (B,) or per-token (B, H)) -> velocity (B, H, D); `euler_sample`'s callable, generalized.
VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# ----- the math ---------------------------------------------------------------------------------------------


def prefix_weights(start: int, end: int, horizon: int, schedule: str, dtype: torch.dtype = torch.float32):
    """Soft mask W (horizon,): 1 below `start` (= d), decaying over [start, end), 0 from `end` (= H - s) on.

    exp:    W_i = c_i (e^{c_i} - 1) / (e - 1),   c_i = (end - i) / (end - start + 1)
    linear: W_i = c_i
    ones:   W_i = 1 for every i < end
    zeros:  W_i = 1 for i < start only
    `end` wins over `start`: start is lowered to end when it is larger.
    """
    if schedule not in SCHEDULES:
        raise RtcError(f"rtc schedule '{schedule}' unknown; choose one of {', '.join(SCHEDULES)}")
    end = max(0, min(int(end), horizon))
    start = max(0, min(int(start), end))
    i = torch.arange(horizon, dtype=torch.float64)
    if schedule == "ones":
        w = torch.ones(horizon, dtype=torch.float64)
    elif schedule == "zeros":
        w = (i < start).double()
    else:
        w = ((end - i) / (end - start + 1)).clamp(0.0, 1.0)
        if schedule == "exp":
            w = w * torch.expm1(w) / (math.e - 1.0)
        w = torch.where(i < start, torch.ones_like(w), w)
    return torch.where(i >= end, torch.zeros_like(w), w).to(dtype)


def guidance_weight(t: torch.Tensor, max_weight: float) -> torch.Tensor:
    """The paper's guidance weight min(beta, (1 - tau)/tau * (tau^2 + (1 - tau)^2) / (1 - tau)^2), tau = 1 - t.

    The product simplifies to (tau^2 + (1 - tau)^2) / (tau (1 - tau)): infinite at both ends (the clip at beta
    takes over; t = 1 is the first, pure-noise step) and 2 at t = 0.5.
    """
    tau = 1.0 - t.double()
    denom = tau * (1.0 - tau)
    w = torch.where(denom > 0, (tau**2 + (1.0 - tau) ** 2) / denom.clamp(min=1e-300), torch.full_like(tau, math.inf))
    return w.clamp(max=max_weight)


def _broadcast_weights(weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(H,) or (B, H) -> (B, H, 1) on x's device and dtype."""
    w = weights.to(x.device, x.dtype)
    if w.ndim == 1:
        w = w[None]
    return w[..., None]


def _refuse_inference_mode() -> None:
    if torch.is_inference_mode_enabled():
        raise RtcError(
            "guided RTC needs autograd (a vector-Jacobian product through the denoise step) and cannot run under "
            "torch.inference_mode(); compute the prefix under torch.no_grad() instead, or use method 'inpaint'"
        )


def guided_velocity(
    velocity: VelocityFn,
    x_t: torch.Tensor,
    t: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    max_weight: float,
) -> torch.Tensor:
    """The velocity of one guided Euler step: u - w(t) * [(Y - x0) * W]^T dx0/dx_t, x0 = x_t - t u.

    `velocity` must be differentiable in x_t (its other inputs, e.g. a prefix KV cache, may be constants);
    `target` Y (B, H, D) and `weights` W (H,) or (B, H) are in the model's normalized action space.
    """
    _refuse_inference_mode()
    w = guidance_weight(t.reshape(t.shape[0], -1)[:, 0], max_weight).to(x_t.device, x_t.dtype)
    if max_weight == 0 or not bool(torch.any(weights != 0)):
        # No guidance: exactly the plain step, and no backward pass to pay for.
        with torch.no_grad():
            return velocity(x_t, t)
    return _vjp_step(velocity, x_t, t, target, weights, w)


def _vjp_step(
    velocity: VelocityFn,
    x_t: torch.Tensor,
    t: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    w: torch.Tensor,
) -> torch.Tensor:
    """u - w * [(Y - x0) * W]^T dx0/dx_t by autograd, w (B,) the guidance weight, t (B,) or per token (B, H)."""
    with torch.enable_grad():
        x = x_t.detach().requires_grad_(True)
        u = velocity(x, t)
        x0 = x - t.reshape(t.shape[0], -1, 1).to(x.dtype) * u
        error = (target.to(x.dtype) - x0) * _broadcast_weights(weights, x)
        (g,) = torch.autograd.grad(x0, x, error)
    return (u - w.to(x.dtype)[:, None, None] * g).detach()


def autograd_guided_step(velocity: VelocityFn) -> GuidedStepFn:
    """`guided_velocity`'s step (forward and backward) as a GuidedStepFn: what a runner hands `rtc_sample` to run
    each whole guided step its own way (e.g. on the torch threads timed fastest for it, cpu_threads.StepThreads)."""

    def step(x: torch.Tensor, t: torch.Tensor, target: torch.Tensor, weights: torch.Tensor, w: torch.Tensor):
        _refuse_inference_mode()
        return _vjp_step(velocity, x, t, target, weights, w)

    return step


# (x_t (B, H, D), t (B,)) -> the network's clean estimate x0_hat (B, H, D): the network of a sampler that
# predicts the clean action rather than a velocity (X-VLA).
CleanFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (x_t, t, target, target_high, weights W, scale (B,)) -> x0_hat + scale * g: one guided clean estimate with its
# scale t w(t) computed outside (`autograd_guided_clean`, or a program's traced guided step).
GuidedCleanFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]


def autograd_guided_clean(clean: CleanFn) -> GuidedCleanFn:
    """`guided_clean`'s step by autograd: x0_hat + scale * [(Y - x0_hat) * W]^T dx0_hat/dx_t, Y x0_hat's
    projection onto [target, target_high] (target_high = target: Y = target). What a program traces as its
    guided step (export/rtc_step.py), and what `guided_clean` runs without one."""

    def step(x_t, t, target, target_high, weights, scale):
        _refuse_inference_mode()
        with torch.enable_grad():
            x = x_t.detach().requires_grad_(True)
            x0 = clean(x, t)
            y = torch.maximum(torch.minimum(x0.detach(), target_high.to(x0.dtype)), target.to(x0.dtype))
            error = (y - x0) * _broadcast_weights(weights, x0)
            (g,) = torch.autograd.grad(x0, x, error)
        return (x0 + scale.reshape(-1, 1, 1).to(x0.dtype) * g).detach()

    return step


def guided_clean(
    clean: CleanFn,
    x_t: torch.Tensor,
    t: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    max_weight: float,
    target_high: torch.Tensor | None = None,
    guided: GuidedCleanFn | None = None,
) -> torch.Tensor:
    """The guided clean estimate of one step of an x0-predicting sampler: x0_hat + t w(t) g,
    g = [(Y - x0_hat) * W]^T dx0_hat/dx_t (see the module docstring: `guided_velocity`'s step, in x0 terms).

    `target_high`: Y is the interval [target, target_high] per entry, the error is x0_hat's distance to it (0
    inside): a bound of -inf / +inf makes the pull one-sided, both infinite no pull (a channel the old plan says
    nothing about, or a logit whose sigmoid the plan has saturated). Without it, Y = target.
    `guided`: the step that computes x0_hat + scale g (a program's traced one); default autograd through `clean`.
    """
    if max_weight == 0 or not bool(torch.any(weights != 0)):
        with torch.no_grad():
            return clean(x_t, t)
    w = guidance_weight(t.reshape(t.shape[0], -1)[:, 0], max_weight).to(x_t.device, x_t.dtype)
    scale = t.reshape(t.shape[0], -1)[:, 0].to(x_t.dtype) * w
    high = target if target_high is None else target_high
    return (guided or autograd_guided_clean(clean))(x_t, t, target, high, weights, scale)


def inpainted_clean(
    x0: torch.Tensor, delay: int, target: torch.Tensor, target_high: torch.Tensor | None = None
) -> torch.Tensor:
    """Hard inpainting in an x0-predicting sampler: the first `delay` clean estimates replaced by the target
    (the estimate projected onto [target, target_high] where that is given, see `guided_clean`). Re-noised by
    the sampler, the prefix follows Y's own noising path t * noise + (1 - t) * Y, as `inpaint_sample`'s does."""
    y = target.to(x0.dtype)
    if target_high is not None:
        y = torch.maximum(torch.minimum(x0, target_high.to(x0.dtype)), y)
    prefix = torch.arange(x0.shape[1], device=x0.device)[None, :, None] < delay
    return torch.where(prefix, y, x0)


def guidance_mask(request: RtcRequest, horizon: int, num_steps: int) -> tuple[torch.Tensor, float]:
    """The soft mask W (horizon,) and beta a guided request asks for (beta None: the number of steps)."""
    start, end = request.mask_range(horizon)
    beta = request.max_guidance_weight
    return prefix_weights(start, end, horizon, request.schedule), float(num_steps) if beta is None else beta


def _times(batch: int, step: int, num_steps: int, like: torch.Tensor) -> tuple[float, torch.Tensor]:
    # The same time grid as `sampler.euler_sample`, so beta = 0 reproduces it bit for bit.
    dt = -1.0 / num_steps
    return dt, torch.full((batch,), 1.0 + step * dt, device=like.device, dtype=like.dtype)


# (x_t, t, target, weights (H,), guidance weight (B,)) -> guided velocity: the whole guided step computed
# elsewhere, e.g. by an ExecuTorch program's `guided_step` method (omni_ros.export.rtc_step).
GuidedStepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def guided_sample(
    velocity: VelocityFn,
    noise: torch.Tensor,
    num_steps: int,
    target: torch.Tensor,
    weights: torch.Tensor,
    max_weight: float,
    guided_step: GuidedStepFn | None = None,
) -> torch.Tensor:
    """`euler_sample` with every step guided towards `target` under the soft mask `weights`.

    `guided_step`, if given, computes the guided velocity instead of autograd (same math, see GuidedStepFn).
    """
    x = noise
    unguided = max_weight == 0 or not bool(torch.any(weights != 0))
    for step in range(num_steps):
        dt, t = _times(noise.shape[0], step, num_steps, noise)
        if guided_step is None or unguided:
            v = guided_velocity(velocity, x, t, target, weights, max_weight)
        else:
            v = guided_step(x, t, target, weights, guidance_weight(t, max_weight).to(x.dtype))
        x = x + dt * v
    return x


def inpaint_sample(
    velocity: VelocityFn,
    noise: torch.Tensor,
    num_steps: int,
    target: torch.Tensor,
    delay: int | torch.Tensor,
    clean_prefix: bool = False,
) -> torch.Tensor:
    """Euler sampling with the first `delay` actions (int, or (B,) per example) frozen to `target`.

    clean_prefix: the prefix is the clean target with per-token time 0 (a model trained with training-time
    RTC); otherwise it is the target noised to the current time along `noise`, with the model's usual time.
    No gradient is needed. The result's prefix equals the target exactly.
    """
    b, h = noise.shape[:2]
    delay = torch.as_tensor(delay, device=noise.device).reshape(-1).expand(b)
    prefix = torch.arange(h, device=noise.device)[None, :] < delay[:, None]  # (B, H)
    keep = prefix[..., None]
    target = target.to(noise.dtype)
    x = noise
    for step in range(num_steps):
        dt, t = _times(b, step, num_steps, noise)
        if clean_prefix:
            x = torch.where(keep, target, x)
            tt = t[:, None].expand(b, h).masked_fill(prefix, 0.0)
        else:
            x = torch.where(keep, t[:, None, None] * noise + (1.0 - t[:, None, None]) * target, x)
            tt = t
        x = x + dt * velocity(x, tt)
    return torch.where(keep, target, x)


def rtc_sample(
    velocity: VelocityFn,
    noise: torch.Tensor,
    num_steps: int,
    target: torch.Tensor,
    request: RtcRequest,
    clean_prefix: bool = False,
    guided_step: GuidedStepFn | None = None,
) -> torch.Tensor:
    """Sample one chunk continuing `target` (B, H, D, normalized, zero-padded) as `request` asks."""
    start, _ = request.mask_range(noise.shape[1])
    if request.method == "inpaint":
        return inpaint_sample(velocity, noise, num_steps, target, start, clean_prefix=clean_prefix)
    weights, beta = guidance_mask(request, noise.shape[1], num_steps)
    return guided_sample(velocity, noise, num_steps, target, weights, beta, guided_step)


@dataclass(frozen=True, eq=False)
class RtcPlan:
    """What `InferencePipeline` hands a runner's `sample(..., rtc=)`: the request, and its old plan in the
    model's normalized action space (1, H, D) on the runner's device (None where the runner passes the request
    on in robot units, e.g. to a remote server)."""

    request: RtcRequest
    target: torch.Tensor | None


def per_token_times(t: torch.Tensor, horizon: int, per_token: bool) -> torch.Tensor:
    """Times (B,) as a program of a training-time-RTC model takes them, (B, H), when `per_token`."""
    if per_token and t.ndim == 1:
        return t[:, None].expand(t.shape[0], horizon)
    return t


# ----- training-time RTC (arXiv 2512.05964) -------------------------------------------------------------------


def sample_delays(batch: int, max_delay: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-example delays d ~ U{0, ..., max_delay} (B,) int64, on the generator's device."""
    device = generator.device if generator is not None else "cpu"
    return torch.randint(0, max_delay + 1, (batch,), generator=generator, device=device)


def clean_prefix(
    actions: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, delay: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training-time RTC: the first delay[b] actions of x_t replaced by the clean actions with time 0.

    Returns (x_t (B, H, D), per-token time (B, H), loss weight (B, H): 0 on the clean prefix, 1 after it).
    """
    b, h = actions.shape[:2]
    prefix = torch.arange(h, device=actions.device)[None, :] < delay.to(actions.device)[:, None]
    x_t = torch.where(prefix[..., None], actions, x_t)
    times = t[:, None].expand(b, h).masked_fill(prefix, 0.0)
    return x_t, times, (~prefix).to(actions.dtype)
