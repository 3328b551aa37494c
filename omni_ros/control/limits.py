"""Per-joint position and velocity limits applied to every command."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def per_joint(values: Sequence[float], dim: int, what: str) -> np.ndarray | None:
    """Empty -> None (no limit), one value -> every joint, else exactly one per joint."""
    if len(values) == 0:
        return None
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size not in (1, dim):
        raise ValueError(f"{what}: expected 0, 1 or {dim} values (one per joint), got {arr.size}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what}: values must be finite, got {arr.tolist()}")
    return np.broadcast_to(arr, (dim,)).copy()


@dataclass
class JointLimits:
    """Clamp a target into [lower, upper], then to at most `max_step` from the previous command."""

    lower: np.ndarray | None = None
    upper: np.ndarray | None = None
    max_step: np.ndarray | None = None

    @classmethod
    def build(
        cls,
        dim: int,
        lower: Sequence[float] = (),
        upper: Sequence[float] = (),
        max_velocity: Sequence[float] = (),
        control_rate_hz: float = 50.0,
    ) -> JointLimits:
        """Limits for `dim` joints; velocities (units/s) become a step per control tick."""
        if control_rate_hz <= 0:
            raise ValueError(f"control rate must be positive, got {control_rate_hz}")
        lo = per_joint(lower, dim, "position_lower")
        hi = per_joint(upper, dim, "position_upper")
        if lo is not None and hi is not None and np.any(lo > hi):
            raise ValueError(f"position_lower must not exceed position_upper: {lo.tolist()} vs {hi.tolist()}")
        vel = per_joint(max_velocity, dim, "max_velocity")
        if vel is not None and np.any(vel <= 0):
            raise ValueError(f"max_velocity must be positive, got {vel.tolist()}")
        return cls(lo, hi, None if vel is None else vel / control_rate_hz)

    def clamp(self, target: np.ndarray, previous: np.ndarray | None) -> tuple[np.ndarray, bool]:
        """The command to send for `target`, and whether any limit changed it."""
        out = np.asarray(target, dtype=np.float64).copy()
        if self.lower is not None:
            out = np.maximum(out, self.lower)
        if self.upper is not None:
            out = np.minimum(out, self.upper)
        # Speed last: from a previous command outside the position range (say, the measured start
        # pose) the command walks back into range instead of jumping there.
        if self.max_step is not None and previous is not None:
            out = np.clip(out, previous - self.max_step, previous + self.max_step)
        return out, bool(np.any(out != target))
