"""The scripted expert of the SO-101 touch task: IK to a pose over the cube, then chunks towards it.

The goal pose depends only on the cube's position (IK from the fixed home pose, fingers pointing
down, fingertips `clearance` above the top face), and each chunk only on the measured joints and
that goal, with the planar expert's profile (omni_ros.sim.expert.ReachExpert): all joints move
together at a bounded speed, slowing exponentially near the goal, `lead` seconds ahead of the
measured position to cancel the servos' lag.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from omni_ros.sim.expert import ReachExpert
from omni_ros.sim.so101.env import GRIPPER_CLOSED, So101Env

# Seconds the STS3215 position servos of the MJCF (kp 17.8, damping 0.6) lag behind a moving target.
SERVO_LEAD_S = 0.1


class So101Expert(ReachExpert):
    def __init__(
        self,
        env: So101Env,
        horizon: int = 16,
        dt: float = 0.05,
        max_speed: float = 1.0,
        gain: float = 4.0,
        lead: float = SERVO_LEAD_S,
        clearance: float = 0.008,
    ) -> None:
        super().__init__(None, env.home, horizon=horizon, dt=dt, max_speed=max_speed, gain=gain, lead=lead)
        self.env = env
        self.clearance = float(clearance)
        self._cache: dict[tuple[float, float], np.ndarray] = {}

    def goal(self, target: ArrayLike) -> np.ndarray:
        """(6,) joints with the fingertips `clearance` above the top of a cube centred at `target` (x, y)."""
        x, y = (float(v) for v in np.asarray(target, dtype=np.float64)[:2])
        key = (round(x, 4), round(y, 4))  # 0.1 mm: a cube that has not moved hits the cache
        if key not in self._cache:
            if len(self._cache) > 4096:
                self._cache.clear()
            point = (key[0], key[1], self.env.config.block_size + self.clearance)
            q = self.env.kinematics.solve(point, self.home).q.copy()
            q[5] = GRIPPER_CLOSED
            self._cache[key] = q
        return self._cache[key].copy()
