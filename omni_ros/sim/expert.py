"""A scripted expert for the reach task: inverse kinematics to a goal pose, then action chunks towards it.

The goal pose depends only on the target block (the IK solution closest to the
home pose), and each chunk only on the current joint positions and the goal:
a policy that sees the same things can learn it. Chunks move every joint
together towards the goal at a bounded speed, slowing exponentially near it,
and run `lead` seconds ahead of the measured position to cancel the lag of
the joints' first-order dynamics.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from omni_ros.sim.arm import PlanarArm


def _nearest_turn(angle: float, lower: float, upper: float, reference: float) -> float | None:
    """Of `angle` + 2 pi k, the value within [lower, upper] closest to `reference` (None if none fits)."""
    options = [angle + 2 * math.pi * k for k in range(-2, 3)]
    options = [a for a in options if lower - 1e-9 <= a <= upper + 1e-9]
    return min(options, key=lambda a: abs(a - reference)) if options else None


def solve_ik(arm: PlanarArm, target: ArrayLike, home: np.ndarray) -> np.ndarray:
    """Joint positions putting the tip on `target` (metres), within limits, closest to `home`.

    Three joints: exact, with the last link pointing radially away from the
    base (a natural reaching pose), trying both elbows. Other joint counts:
    damped least squares started from and pulled towards `home`.
    """
    target = np.asarray(target, dtype=np.float64)
    if arm.n_joints in (2, 3):
        candidates = _analytic(arm, target, home)
        valid = [q for q in candidates if np.linalg.norm(arm.end_effector(q) - target) < 1e-6]
        if valid:
            return min(valid, key=lambda q: float(np.linalg.norm(q - home)))
    return _dls(arm, target, home)


def _analytic(arm: PlanarArm, target: np.ndarray, home: np.ndarray) -> list[np.ndarray]:
    links = arm.links
    if arm.n_joints == 3:
        phi = math.atan2(target[1], target[0])
        wrist = target - links[2] * np.array([math.cos(phi), math.sin(phi)])
    else:
        wrist = target
    l1, l2 = links[0], links[1]
    c2 = (wrist @ wrist - l1**2 - l2**2) / (2 * l1 * l2)
    if abs(c2) > 1:
        return []
    out = []
    lo, hi = arm.lower, arm.upper
    for sign in (-1.0, 1.0):
        q2 = sign * math.acos(c2)
        q1 = math.atan2(wrist[1], wrist[0]) - math.atan2(l2 * math.sin(q2), l1 + l2 * math.cos(q2))
        # float | None per joint (None: no turn within the limits), checked before use.
        q: list[Any] = [_nearest_turn(q1, lo[0], hi[0], home[0]), _nearest_turn(q2, lo[1], hi[1], home[1])]
        if arm.n_joints == 3 and None not in q:
            q.append(_nearest_turn(phi - q[0] - q[1], lo[2], hi[2], home[2]))
        if None not in q:
            out.append(np.array(q))
    return out


def _dls(arm: PlanarArm, target: np.ndarray, home: np.ndarray, restarts: int = 16) -> np.ndarray:
    """Damped least squares from home, then from fixed pseudo-random starts; the solution closest to home."""
    rng = np.random.default_rng(0)  # fixed: the same target always gives the same pose
    starts = [home] + [rng.uniform(arm.lower, arm.upper) for _ in range(restarts)]
    best, best_err = arm.clip(home.copy()), math.inf
    for start in starts:
        q = _dls_from(arm, target, home, np.asarray(start, dtype=np.float64))
        err = float(np.linalg.norm(arm.end_effector(q) - target))
        if err < 1e-6:
            return q
        if err < best_err:
            best, best_err = q, err
    return best


def _dls_from(arm: PlanarArm, target: np.ndarray, home: np.ndarray, q: np.ndarray, iters: int = 200) -> np.ndarray:
    q = arm.clip(q.copy())
    for i in range(iters):
        err = target - arm.end_effector(q)
        if np.linalg.norm(err) < 1e-9:
            break
        jac = arm.jacobian(q)
        inv = jac.T @ np.linalg.inv(jac @ jac.T + 0.05**2 * np.eye(2))
        # The null-space pull keeps the redundant joints near home (a unique, tidy pose); the
        # last iterations drop it so that it cannot hold the tip off target against a joint limit.
        pull = 0.1 if i < iters // 2 else 0.0
        null = (np.eye(arm.n_joints) - inv @ jac) @ (home - q)
        q = arm.clip(q + inv @ err + pull * null)
    return q


class ReachExpert:
    """Produces (horizon, n_joints) joint position chunks at `dt` that bring the tip to a target.

    `arm` may be None for a subclass that brings its own `goal` and `lead` (the SO-101's expert).
    """

    def __init__(
        self,
        arm: PlanarArm | None,
        home: np.ndarray,
        horizon: int = 50,
        dt: float = 0.02,
        max_speed: float = 1.2,
        gain: float = 4.0,
        lead: float | None = None,
    ) -> None:
        if horizon < 1 or dt <= 0 or max_speed <= 0 or gain <= 0:
            raise ValueError("horizon, dt, max_speed and gain must be positive")
        self.arm = arm
        self.home = np.asarray(home, dtype=np.float64)
        self.horizon = int(horizon)
        self.dt = float(dt)
        self.max_speed = float(max_speed)
        self.gain = float(gain)
        if lead is None:
            assert arm is not None, "without an arm, give the lead"
            lead = arm.time_constant
        self.lead_steps = max(0, round(lead / dt))

    def goal(self, target: ArrayLike) -> np.ndarray:
        assert self.arm is not None, "without an arm, override goal()"
        return solve_ik(self.arm, target, self.home)

    def chunk(self, q: ArrayLike, target: ArrayLike) -> np.ndarray:
        """Action chunk from measured positions `q`: action i is the position target at t0 + i * dt."""
        goal = self.goal(target)
        pos = np.asarray(q, dtype=np.float64).copy()
        out = np.empty((self.lead_steps + self.horizon, pos.size))
        max_step = self.max_speed * self.dt
        factor = 1.0 - math.exp(-self.gain * self.dt)
        for i in range(out.shape[0]):
            out[i] = pos
            step = (goal - pos) * factor
            # Joints move together: scale the whole step so the fastest joint stays under max_speed.
            peak = float(np.max(np.abs(goal - pos)))
            if peak * factor > max_step:
                step = (goal - pos) * (max_step / peak)
            pos = pos + step
        return out[self.lead_steps :].astype(np.float32)
