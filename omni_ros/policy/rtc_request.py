"""The request side of real-time chunking (omni_ros.policy.rtc has the sampling): what a caller (the chunk
executor, the bridge, a remote client) hands a policy to continue the plan being executed, and the checks on it.

Torch-free on purpose: the executor, the nodes and the server import it before anything loads torch (the thread
settings must be in place first, omni_ros.cpu_threads).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from omni_ros.errors import OmniRosError

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
