"""Flow matching, openpi's convention.

x_t = t * noise + (1 - t) * actions, and the model predicts the velocity
u = noise - actions. Sampling integrates dx/dt from t = 1 (pure noise) to
t = 0 (actions) with `num_steps` Euler steps of dt = -1 / num_steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import torch

# How the sampler steps t: "exact" computes t = 1 + step * dt; "float32_accumulated" keeps t in float32 and adds dt
# each step, as LeRobot <= 0.3 did (`time += dt`). The accumulated t is off by up to ~1e-7, which the time
# embedding's shortest period (4e-3) amplifies to ~1e-4 in the actions (measured on LeRobot 0.3.3 fixtures).
EulerTime = Literal["exact", "float32_accumulated"]

VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x_t, t of shape (B,)) -> velocity


def euler_times(num_steps: int, rule: EulerTime = "exact") -> list[float]:
    """The t of every Euler step, from 1 down (see EulerTime)."""
    dt = -1.0 / num_steps
    if rule == "exact":
        return [1.0 + step * dt for step in range(num_steps)]
    if rule != "float32_accumulated":
        raise ValueError(f"unknown Euler time rule '{rule}'")
    times, t, step32 = [], np.float32(1.0), np.float32(dt)
    for _ in range(num_steps):
        times.append(float(t))
        t = np.float32(t + step32)
    return times


def euler_sample(velocity: VelocityFn, noise: torch.Tensor, num_steps: int, rule: EulerTime = "exact") -> torch.Tensor:
    """Integrate from noise at t=1 to actions at t=0."""
    dt = -1.0 / num_steps
    x = noise
    for value in euler_times(num_steps, rule):
        t = torch.full((noise.shape[0],), value, device=noise.device, dtype=noise.dtype)
        x = x + dt * velocity(x, t)
    return x


def sample_time(batch: int, generator: torch.Generator | None = None, device: str | torch.device = "cpu"):
    """Training times t ~ Beta(1.5, 1) * 0.999 + 0.001, which favours the noisy end."""
    # Beta(a, 1) has CDF x**a, so inverse-CDF sampling needs only a uniform draw.
    u = torch.rand(batch, generator=generator, device=device)
    return u ** (1.0 / 1.5) * 0.999 + 0.001


def noisy_actions(actions: torch.Tensor, noise: torch.Tensor, t: torch.Tensor):
    """(x_t, target velocity) for clean actions, noise and times t (B,)."""
    t = t[:, None, None]
    return t * noise + (1.0 - t) * actions, noise - actions
