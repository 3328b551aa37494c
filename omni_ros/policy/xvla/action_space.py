"""LeRobot 0.6.1's X-VLA action spaces (its `action_hub` registry), at inference.

Each names the model's action width, the gripper channels zeroed in proprio and x_t before every step (the
network never sees them) and passed through a sigmoid at the end, and the real width the output is cut to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from omni_ros.errors import OmniRosError

# A sigmoid gripper within this of 0 or 1 is saturated (logit beyond -/+9.2): real-time chunking's target
# for its logit is one-sided there (ActionSpace.clean_target).
GRIPPER_EPS = 1e-4


class ActionSpaceError(OmniRosError, ValueError):
    """A checkpoint names an X-VLA action space omni_ros does not implement."""


@dataclass(frozen=True)
class ActionSpace:
    name: str
    dim_action: int
    gripper_idx: tuple[int, ...] = ()
    zero_grippers: bool = False  # zero them in proprio and x_t before each step
    sigmoid_grippers: bool = False  # sigmoid on them at the end
    real_dim: int | None = None  # the output cut to this width (None: dim_action)
    # so101_bimanual pads a 12-wide proprio to 20 and refuses other widths but 20 (LeRobot does the same).
    proprio_widths: tuple[int, ...] = ()

    def preprocess(self, proprio: torch.Tensor, x_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.proprio_widths and proprio.shape[-1] not in self.proprio_widths:
            raise ActionSpaceError(
                f"action space '{self.name}' needs a proprio of width {' or '.join(map(str, self.proprio_widths))}, "
                f"got {proprio.shape[-1]} (max_state_dim)"
            )
        if self.proprio_widths and proprio.shape[-1] < self.dim_action:
            proprio = torch.nn.functional.pad(proprio, (0, self.dim_action - proprio.shape[-1]))
        if not self.zero_grippers:
            return proprio, x_t
        idx = list(self.gripper_idx)
        proprio, x_t = proprio.clone(), x_t.clone()
        proprio[..., idx] = 0.0
        x_t[..., idx] = 0.0
        return proprio, x_t

    def postprocess(self, action: torch.Tensor) -> torch.Tensor:
        if self.sigmoid_grippers and action.shape[-1] > max(self.gripper_idx):
            idx = list(self.gripper_idx)
            action = action.clone()
            action[..., idx] = torch.sigmoid(action[..., idx])
        return action[..., : self.real_dim] if self.real_dim is not None else action

    def clean_target(self, plan: torch.Tensor, known: int) -> tuple[torch.Tensor, torch.Tensor]:
        """An old plan after `postprocess` (..., dim_action; its first `known` channels given) -> the interval
        [low, high] of the network's clean estimates that reproduce it, for real-time chunking's target.

        A channel past `known` (cut off by the real width: trained on nothing, e.g. franka_joint7's 13 padded
        ones) is free: (-inf, inf). A sigmoid gripper's target is the logit of the plan; where the plan is
        within GRIPPER_EPS of 0 or 1 the sigmoid is saturated and every larger logit gives the same action, so
        the bound on that side is open (one-sided: only an estimate on the wrong side is pulled back).
        """
        known = min(known, self.dim_action if self.real_dim is None else self.real_dim)
        low, high = plan.clone(), plan.clone()
        low[..., known:], high[..., known:] = -math.inf, math.inf
        if self.sigmoid_grippers:
            idx = [i for i in self.gripper_idx if i < known]
            y = plan[..., idx]
            logit = torch.logit(y.clamp(GRIPPER_EPS, 1.0 - GRIPPER_EPS))
            low[..., idx] = torch.where(y <= GRIPPER_EPS, -math.inf, logit)
            high[..., idx] = torch.where(y >= 1.0 - GRIPPER_EPS, math.inf, logit)
        return low, high


def build_action_space(name: str, action_dim: int, max_action_dim: int) -> ActionSpace:
    """LeRobot's `build_action_space(name)` (`auto`: the real width from the action feature, max_action_dim wide)."""
    key = name.lower()
    if key == "ee6d":
        return ActionSpace(key, 20, (9, 19), zero_grippers=True, sigmoid_grippers=True)
    if key == "joint":
        return ActionSpace(key, 14, (6, 13), zero_grippers=True, sigmoid_grippers=True)
    if key == "agibot_ee6d":
        return ActionSpace(key, 20, (9, 19))
    if key == "franka_joint7":
        return ActionSpace(key, 20, real_dim=7)
    if key == "auto":
        return ActionSpace(key, max_action_dim, real_dim=action_dim)
    if key == "so101_bimanual":
        return ActionSpace(
            key, 20, (5, 11), zero_grippers=True, sigmoid_grippers=True, real_dim=12, proprio_widths=(12, 20)
        )
    raise ActionSpaceError(
        f"X-VLA action_mode '{name}' is not implemented by omni_ros "
        "(known: ee6d, joint, agibot_ee6d, franka_joint7, auto, so101_bimanual)"
    )
