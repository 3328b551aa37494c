"""Real-time chunking in X-VLA's x0 form, shared by the eager runner and the runtimes' staged loop.

The network predicts the clean action, so a continued chunk is made by changing each step's clean estimate
(`EstimateHook`): guided RTC moves it by t w(t) [(Y - x0_hat) * W]^T dx0_hat/dx_t (`rtc.guided_clean`: autograd
through the step on the torch backend, a program's traced guided step in a runtime), inpainting sets the first
`d` estimates to the old plan (`rtc.inpainted_clean`). Y is the old plan before the action space's
postprocess (`ActionSpace.clean_target`: gripper logits, one-sided where the plan's sigmoid is saturated; the
channels past the real width free).
"""

from __future__ import annotations

import torch

from omni_ros.policy.rtc import GuidedCleanFn, RtcPlan, guidance_mask, guided_clean, inpainted_clean
from omni_ros.policy.xvla.action_space import ActionSpace
from omni_ros.policy.xvla.modeling import CleanStep, EstimateHook


def estimate_hook(
    space: ActionSpace,
    action_dim: int,
    rtc: RtcPlan,
    horizon: int,
    num_steps: int,
    dtype: torch.dtype,
    guided: GuidedCleanFn | None = None,
) -> EstimateHook:
    """The hook that makes each step's clean estimate continue `rtc`'s old plan (its method: guided or inpaint).
    `guided`: a program's guided step (context bound), in place of autograd through the clean step."""
    if rtc.target is None:
        raise ValueError("X-VLA's real-time chunking needs the RTC plan in model units (RtcPlan.target)")
    low, high = (b.to(dtype) for b in space.clean_target(rtc.target.float(), action_dim))
    if rtc.request.method == "inpaint":
        delay = rtc.request.mask_range(horizon)[0]

        def inpaint(clean: CleanStep, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return inpainted_clean(clean(x_t, t), delay, low, high)

        return inpaint
    weights, beta = guidance_mask(rtc.request, horizon, num_steps)

    def guide(clean: CleanStep, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return guided_clean(clean, x_t, t, low, weights, beta, target_high=high, guided=guided)

    return guide


def keep_old_prefix(chunk: torch.Tensor, rtc: RtcPlan, action_dim: int) -> torch.Tensor:
    """An inpainted chunk (after the postprocess) with its frozen actions set to the old plan exactly, also where
    a saturated gripper's logit only bounded the estimate (in place; returned). Guided chunks are left as made."""
    if rtc.request.method == "inpaint" and rtc.target is not None:
        d, known = rtc.request.mask_range(chunk.shape[1])[0], min(action_dim, chunk.shape[-1])
        chunk[:, :d, :known] = rtc.target[:, :d, :known].to(chunk.dtype)
    return chunk
