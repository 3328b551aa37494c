"""The eager runner of X-VLA: encode once, then the head `num_steps` times (its own sampler, not Euler on a
velocity: the network predicts the clean action and x_t is rebuilt from the noise every step)."""

from __future__ import annotations

from typing import Any

import torch

from omni_ros.policy.pipeline import Sampled, StageClock
from omni_ros.policy.rtc import RtcPlan
from omni_ros.policy.torch_runner import TorchRunner


class XVLATorchRunner(TorchRunner):
    # Guided RTC differentiates a velocity field; X-VLA's steps re-noise a clean estimate: not served.
    rtc_methods: tuple[str, ...] = ()

    def sample(self, inputs: Any, noise: torch.Tensor | None, num_steps: int | None, rtc: RtcPlan | None = None):
        if noise is None or num_steps is None:
            raise ValueError("the X-VLA runner needs the sampling noise and step count")
        if rtc is not None:
            raise ValueError("X-VLA serves no real-time chunking")
        model: Any = self.model
        with torch.inference_mode():
            clock = StageClock(self._sync)
            context = model.encode(inputs, inputs.domain_id)
            clock.lap("embed_prefix_ms")
            clock.lap("prefill_ms")
            proprio = model.proprio(inputs.state)
            chunk = model.denoise(context, inputs.domain_id, proprio, noise.to(self.dtype), num_steps)
            actions = chunk.float().cpu().numpy()
            clock.lap("denoise_ms")
        return Sampled(actions, clock.ms)
