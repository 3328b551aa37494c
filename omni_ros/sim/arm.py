"""A planar N-joint arm: forward kinematics, Jacobian, joint limits and first-order joint dynamics.

The arm lies in the table plane (seen from above, like a SCARA arm) with its
base at the origin; joint angles are relative, so link k points along the sum
of angles 0..k, measured from the +x axis.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike


def broadcast_per_joint(values: Iterable[float], n: int, what: str) -> np.ndarray:
    """One value for every joint, or exactly one per joint."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.ndim != 1 or arr.size not in (1, n):
        raise ValueError(f"{what}: expected 1 or {n} values, got {arr.size}")
    return np.broadcast_to(arr, (n,)).copy()


def default_home(n: int) -> np.ndarray:
    """A folded pose that points the arm into the table (+y) and keeps the tip near the base."""
    home = np.full(n, -0.9 if n > 2 else -1.4)
    home[0] = math.pi / 2 + 0.6
    return home


class PlanarArm:
    """Kinematics plus joints that follow commanded positions with a first-order lag.

    `step(dt)` moves each joint towards its target as x' = (target - x) / tau,
    integrated exactly (stable for any dt), then caps the speed at
    `max_velocity`: a servo neither jumps nor moves infinitely fast.
    """

    def __init__(
        self,
        link_lengths: Sequence[float],
        lower: ArrayLike = -math.pi,
        upper: ArrayLike = math.pi,
        time_constant: float = 0.08,
        max_velocity: float = 3.0,
    ) -> None:
        self.links = np.asarray(list(link_lengths), dtype=np.float64)
        if self.links.ndim != 1 or self.links.size < 1 or np.any(self.links <= 0):
            raise ValueError(f"link_lengths must be positive, got {list(link_lengths)}")
        n = self.links.size
        self.lower = broadcast_per_joint(np.atleast_1d(lower), n, "joint_lower")
        self.upper = broadcast_per_joint(np.atleast_1d(upper), n, "joint_upper")
        if np.any(self.lower >= self.upper):
            raise ValueError(f"joint_lower must be below joint_upper: {self.lower} vs {self.upper}")
        if time_constant <= 0 or max_velocity <= 0:
            raise ValueError("time_constant and max_velocity must be positive")
        self.time_constant = float(time_constant)
        self.max_velocity = float(max_velocity)
        self.q = np.clip(np.zeros(n), self.lower, self.upper)
        self.qd = np.zeros(n)
        self.target = self.q.copy()

    @property
    def n_joints(self) -> int:
        return int(self.links.size)

    @property
    def reach(self) -> float:
        return float(self.links.sum())

    def reset(self, q: ArrayLike) -> None:
        """Place the arm at rest at `q` (clipped to the limits), commanding it to stay."""
        self.q = self.clip(np.asarray(q, dtype=np.float64))
        self.qd = np.zeros(self.n_joints)
        self.target = self.q.copy()

    def clip(self, q: np.ndarray) -> np.ndarray:
        return np.clip(q, self.lower, self.upper)

    def command(self, target: ArrayLike) -> None:
        """Set the position the joints follow; out-of-range targets are clipped, non-finite ones refused."""
        target = np.asarray(target, dtype=np.float64)
        if target.shape != (self.n_joints,):
            raise ValueError(f"command has shape {target.shape}, expected ({self.n_joints},)")
        if not np.all(np.isfinite(target)):
            raise ValueError(f"command has non-finite values: {target.tolist()}")
        self.target = self.clip(target)

    def step(self, dt: float) -> None:
        if dt <= 0:
            return
        alpha = 1.0 - math.exp(-dt / self.time_constant)
        delta = (self.target - self.q) * alpha
        max_step = self.max_velocity * dt
        delta = np.clip(delta, -max_step, max_step)
        self.q = self.clip(self.q + delta)
        self.qd = delta / dt

    def joint_positions(self, q: np.ndarray | None = None) -> np.ndarray:
        """(N + 1, 2) positions of the base, every joint and the tip, metres."""
        q = self.q if q is None else np.asarray(q, dtype=np.float64)
        angles = np.cumsum(q)
        steps = self.links[:, None] * np.stack([np.cos(angles), np.sin(angles)], axis=1)
        return np.vstack([np.zeros((1, 2)), np.cumsum(steps, axis=0)])

    def end_effector(self, q: np.ndarray | None = None) -> np.ndarray:
        """(2,) tip position, metres."""
        return self.joint_positions(q)[-1]

    def tip_heading(self, q: np.ndarray | None = None) -> float:
        """Direction of the last link, radians from +x."""
        q = self.q if q is None else q
        return float(np.sum(q))

    def jacobian(self, q: np.ndarray | None = None) -> np.ndarray:
        """(2, N) d(tip)/d(q)."""
        q = self.q if q is None else np.asarray(q, dtype=np.float64)
        angles = np.cumsum(q)
        sx = self.links * np.sin(angles)
        cy = self.links * np.cos(angles)
        # Joint j moves every link from j onwards.
        return np.stack([-np.cumsum(sx[::-1])[::-1], np.cumsum(cy[::-1])[::-1]])
