"""The eager runner of X-VLA: encode once, then the head `num_steps` times (its own sampler, not Euler on a
velocity: the network predicts the clean action and x_t is rebuilt from the noise every step).

Real-time chunking: guided RTC in the x0 form (omni_ros.policy.rtc.guided_clean: each step's clean estimate
moved by t w(t) [(Y - x0_hat) * W]^T dx0_hat/dx_t, which is the velocity correction of the paper), and hard
inpainting of the prefix's clean estimates. Y is the old plan before the action space's postprocess
(ActionSpace.clean_target: gripper logits, one-sided where the plan's sigmoid is saturated; the channels past
the real width free), so every action space LeRobot 0.6.1 registers is served.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_ros.policy.pipeline import Sampled, StageClock
from omni_ros.policy.rtc import RtcPlan, guidance_mask, guided_clean, inpainted_clean
from omni_ros.policy.torch_runner import TorchRunner
from omni_ros.policy.xvla.modeling import CleanStep, EstimateHook


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
            estimate = None if rtc is None else self._rtc_estimate(rtc, noise.shape[1], num_steps)
            chunk = model.denoise(context, inputs.domain_id, proprio, noise, num_steps, estimate)
            if rtc is not None and rtc.target is not None and rtc.request.method == "inpaint":
                # The frozen actions are the old plan exactly, also where a saturated gripper's logit only
                # bounded the estimate.
                d, known = rtc.request.mask_range(chunk.shape[1])[0], min(model.cfg.action_dim, chunk.shape[-1])
                chunk[:, :d, :known] = rtc.target[:, :d, :known].to(chunk.dtype)
            actions = chunk.float().cpu().numpy()
            clock.lap("denoise_ms")
        return Sampled(actions, clock.ms)

    def _rtc_estimate(self, rtc: RtcPlan, horizon: int, num_steps: int) -> EstimateHook:
        model: Any = self.model
        assert rtc.target is not None
        bounds = model.action_space.clean_target(rtc.target.float(), model.cfg.action_dim)
        low, high = (b.to(self.dtype) for b in bounds)
        if rtc.request.method == "inpaint":
            delay = rtc.request.mask_range(horizon)[0]

            def inpaint(clean: CleanStep, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                return inpainted_clean(clean(x_t, t), delay, low, high)

            return inpaint
        weights, beta = guidance_mask(rtc.request, horizon, num_steps)

        def guide(clean: CleanStep, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return guided_clean(clean, x_t, t, low, weights, beta, target_high=high)

        return guide
