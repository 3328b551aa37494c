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
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from omni_ros.errors import OmniRosError

# (x_t (B, H, D), t (B,) or per-token (B, H)) -> velocity (B, H, D); `euler_sample`'s callable, generalized.
VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

SCHEDULES = ("exp", "linear", "ones", "zeros")
METHODS = ("guided", "inpaint")
Schedule = Literal["exp", "linear", "ones", "zeros"]
Method = Literal["guided", "inpaint"]
# The paper's (and PI's kinetix reference's) maximum guidance weight, for 5 denoising steps. The weight is
# clipped to beta at the first, pure-noise step, where the step moves the clean estimate by beta / n of its
# error: beta = n lands it on the old plan, beta > 2 n overshoots and oscillates (measured: test_rtc.py). So
# a request without beta uses n (LeRobot uses 10 for 10 steps).
DEFAULT_MAX_GUIDANCE_WEIGHT = 5.0


class RtcError(OmniRosError, ValueError):
    """An RTC request is malformed, or this policy or context cannot serve it."""


def supported_rtc_methods(policy: Any) -> tuple[str, ...]:
    """RTC methods a policy (any backend) can serve; () when it cannot continue a chunk at all."""
    methods = getattr(policy, "rtc_methods", ())
    return tuple(m for m in methods if m in METHODS)


@dataclass(frozen=True, eq=False)
class RtcRequest:
    """Continue the plan being executed: what `Policy.infer(obs, rtc=...)` takes.

    `prev_actions` (R, action_dim), robot units: the old plan at the new chunk's action times, i.e. row i is
    due at the observation's stamp + i * action_dt. R may be shorter than the horizon (zero-padded) or longer
    (cut). `inference_delay` d: actions of the new chunk that will have passed (executed from the old plan)
    when it arrives. `execution_horizon` s (the paper's s, NOT LeRobot's `execution_horizon`, which is H - s):
    actions of the old chunk executed before this request; the soft mask ends at H - s. None: the old plan's
    own length R decides (end = R).
    """

    prev_actions: np.ndarray
    inference_delay: int
    execution_horizon: int | None = None
    schedule: Schedule = "exp"
    # beta; None: the policy's number of denoising steps (see DEFAULT_MAX_GUIDANCE_WEIGHT).
    max_guidance_weight: float | None = None
    method: Method = "guided"
    # Filled in by __post_init__: the validated float32 copy.
    _actions: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            actions = np.array(self.prev_actions, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise RtcError(f"rtc prev_actions must be a numeric (R, action_dim) array: {exc}") from exc
        if actions.ndim != 2:
            raise RtcError(f"rtc prev_actions must be 2-D (R, action_dim), got shape {actions.shape}")
        if not np.all(np.isfinite(actions)):
            raise RtcError("rtc prev_actions contain NaN or inf")
        object.__setattr__(self, "_actions", actions)
        if not _is_int(self.inference_delay) or self.inference_delay < 0:
            raise RtcError(f"rtc inference_delay must be an integer >= 0 (control steps), got {self.inference_delay!r}")
        object.__setattr__(self, "inference_delay", int(self.inference_delay))
        if self.execution_horizon is not None:
            if not _is_int(self.execution_horizon) or self.execution_horizon < 0:
                raise RtcError(f"rtc execution_horizon must be an integer >= 0, got {self.execution_horizon!r}")
            object.__setattr__(self, "execution_horizon", int(self.execution_horizon))
        if self.schedule not in SCHEDULES:
            raise RtcError(f"rtc schedule '{self.schedule}' unknown; choose one of {', '.join(SCHEDULES)}")
        beta = self.max_guidance_weight
        if beta is not None:
            if isinstance(beta, np.generic):
                beta = beta.item()
            if not isinstance(beta, (int, float)) or isinstance(beta, bool) or not math.isfinite(beta) or beta < 0:
                raise RtcError(f"rtc max_guidance_weight must be a finite number >= 0, got {beta!r}")
            object.__setattr__(self, "max_guidance_weight", float(beta))
        if self.method not in METHODS:
            raise RtcError(f"rtc method '{self.method}' unknown; choose one of {', '.join(METHODS)}")

    @property
    def actions(self) -> np.ndarray:
        """The validated old plan, float32 (R, action_dim)."""
        return self._actions

    def mask_range(self, horizon: int) -> tuple[int, int]:
        """(start, end) of the soft mask for a chunk of `horizon`: frozen below start, no old plan from end."""
        end = min(horizon, len(self._actions))
        if self.execution_horizon is not None:
            end = min(end, max(0, horizon - self.execution_horizon))
        return min(self.inference_delay, end), end

    def check(self, horizon: int, action_dim: int) -> None:
        """Refuse a request that does not fit a policy of this chunk shape."""
        if self._actions.shape[1] != action_dim:
            raise RtcError(f"rtc prev_actions have {self._actions.shape[1]} joints, the policy acts on {action_dim}")
        if self.inference_delay > horizon:
            raise RtcError(f"rtc inference_delay {self.inference_delay} is longer than the chunk ({horizon} actions)")


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


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
    if torch.is_inference_mode_enabled():
        raise RtcError(
            "guided RTC needs autograd (a vector-Jacobian product through the denoise step) and cannot run under "
            "torch.inference_mode(); compute the prefix under torch.no_grad() instead, or use method 'inpaint'"
        )
    w = guidance_weight(t.reshape(t.shape[0], -1)[:, 0], max_weight).to(x_t.device, x_t.dtype)
    if max_weight == 0 or not bool(torch.any(weights != 0)):
        # No guidance: exactly the plain step, and no backward pass to pay for.
        with torch.no_grad():
            return velocity(x_t, t)
    with torch.enable_grad():
        x = x_t.detach().requires_grad_(True)
        u = velocity(x, t)
        x0 = x - t.reshape(t.shape[0], 1, 1).to(x.dtype) * u
        error = (target.to(x.dtype) - x0) * _broadcast_weights(weights, x)
        (g,) = torch.autograd.grad(x0, x, error)
    return (u - w[:, None, None] * g).detach()


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
    start, end = request.mask_range(noise.shape[1])
    if request.method == "inpaint":
        return inpaint_sample(velocity, noise, num_steps, target, start, clean_prefix=clean_prefix)
    weights = prefix_weights(start, end, noise.shape[1], request.schedule)
    beta = request.max_guidance_weight
    beta = float(num_steps) if beta is None else beta
    return guided_sample(velocity, noise, num_steps, target, weights, beta, guided_step)


@dataclass(frozen=True, eq=False)
class RtcPlan:
    """What `InferencePipeline` hands a runner's `sample(..., rtc=)`: the request, and its old plan in the
    model's normalized action space (1, H, D) on the runner's device (None where the runner passes the request
    on in robot units, e.g. to a remote server)."""

    request: RtcRequest
    target: torch.Tensor | None


def normalized_plan(
    request: RtcRequest,
    horizon: int,
    action_dim: int,
    width: int,
    normalize: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """The old plan (robot units) cut or zero-padded to the horizon, through a processor's `normalize`
    ((H, action_dim) robot units -> (H, action_dim) model units), zero-padded to the model's action `width`:
    (H, width) float32. Rows past the old plan are 0 (their mask weight is 0 too). Every processor uses this."""
    request.check(horizon, action_dim)
    rows = min(horizon, len(request.actions))
    plan = np.zeros((horizon, action_dim), dtype=np.float32)
    plan[:rows] = request.actions[:rows]
    target = np.zeros((horizon, width), dtype=np.float32)
    target[:rows, :action_dim] = np.asarray(normalize(plan), dtype=np.float32).reshape(horizon, action_dim)[:rows]
    return target


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
