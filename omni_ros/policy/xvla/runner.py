"""The eager runner of X-VLA: encode once, then the head `num_steps` times (its own sampler, not Euler on a
velocity: the network predicts the clean action and x_t is rebuilt from the noise every step).

Real-time chunking in the x0 form, both methods (omni_ros.policy.xvla.rtc_hooks): guided RTC moves each step's
clean estimate along the vector-Jacobian product of the head (autograd, here), inpainting sets the prefix's
estimates to the old plan. Every action space LeRobot 0.6.1 registers is served.

Each step runs on the torch threads timed fastest for it (omni_ros.cpu_threads.StepThreads, as the other families'
steps; guided steps timed apart): on the Intel Xeon with AMX the full-size head's ten int8 steps took 3.21 s on
two threads against 2.99 on one, while bf16's took 2.14 s on two against 2.65 on one
(bench/results/xvla_amx_layouts.json and xvla_amx.json, each thread count its own row).
"""

from __future__ import annotations

from typing import Any

import torch

from omni_ros.cpu_threads import StepThreads
from omni_ros.policy.pipeline import Sampled, StageClock
from omni_ros.policy.rtc import RtcPlan
from omni_ros.policy.torch_runner import TorchRunner
from omni_ros.policy.xvla.modeling import CleanStep, EstimateHook
from omni_ros.policy.xvla.rtc_hooks import estimate_hook, keep_old_prefix


class XVLATorchRunner(TorchRunner):
    stages_compilable = False  # the head runs inside model.denoise (X-VLA's own sampler)

    def sample(self, inputs: Any, noise: torch.Tensor | None, num_steps: int | None, rtc: RtcPlan | None = None):
        if noise is None or num_steps is None:
            raise ValueError("the X-VLA runner needs the sampling noise and step count")
        if rtc is not None and rtc.target is None:
            raise ValueError("the X-VLA runner needs the RTC plan in model units (RtcPlan.target)")
        model: Any = self.model
        # Guided RTC takes a vector-Jacobian product through the head each step: no inference_mode.
        guided = rtc is not None and rtc.request.method == "guided"
        with torch.no_grad() if guided else torch.inference_mode():
            clock = StageClock(self._sync)
            context = model.encode(inputs, inputs.domain_id)
            clock.lap("embed_prefix_ms")
            clock.lap("prefill_ms")
            proprio = model.proprio(inputs.state)
            noise = noise.to(self.dtype)
            estimate = None
            if rtc is not None:
                space, horizon = model.action_space, noise.shape[1]
                estimate = estimate_hook(space, model.cfg.action_dim, rtc, horizon, num_steps, self.dtype)
            step = on_timed_threads(estimate, self.guided_step_threads if guided else self.step_threads)
            chunk = model.denoise(context, inputs.domain_id, proprio, noise, num_steps, step)
            if rtc is not None:
                keep_old_prefix(chunk, rtc, model.cfg.action_dim)
            actions = chunk.float().cpu().numpy()
            clock.lap("denoise_ms")
        return Sampled(actions, clock.ms)


def on_timed_threads(estimate: EstimateHook | None, threads: StepThreads | None) -> EstimateHook | None:
    """The step hook that runs each step (the network's clean estimate, with its RTC correction if any) on the
    threads `threads` picks, timed; None where nothing is timed (one torch thread) and there is no RTC."""
    if threads is None:
        return estimate

    def step(clean: CleanStep, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return threads.step(lambda: clean(x_t, t) if estimate is None else estimate(clean, x_t, t))

    return step
