"""Inverse kinematics of the SO-101 for the touch task: fingertips on a point, fingers pointing down.

Damped least squares on MuJoCo's own kinematics (mj_kinematics + mj_jacSite on a private MjData, so
the simulation is never disturbed) over the four joints that place the tool: shoulder_pan,
shoulder_lift, elbow_flex, wrist_flex. wrist_roll and the gripper keep the values given. Every solve
starts from the same reference pose, so a target always gives the same joints and nearby targets
give nearby joints: a policy can learn the map from what it sees to where the arm goes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from omni_ros.sim.so101.assets import JOINTS, TOOL_SITE
from omni_ros.sim.so101.model import mujoco

# The joints IK moves (indices into JOINTS).
IK_JOINTS = (0, 1, 2, 3)
DOWN = np.array([0.0, 0.0, -1.0])


@dataclass(frozen=True)
class IkResult:
    q: np.ndarray  # (6,) joint positions, JOINTS order
    position_error: float  # m
    direction_error: float  # rad between the fingers and the asked direction


class So101Kinematics:
    """Forward and inverse kinematics of the arm in `model` (the simulator's compiled world)."""

    def __init__(self, model: mujoco.MjModel) -> None:
        self.model = model
        self.data = mujoco.MjData(model)
        self.site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, TOOL_SITE)
        joints = [model.joint(name) for name in JOINTS]
        self.qpos_adr = np.array([int(j.qposadr[0]) for j in joints])
        self.dof_adr = np.array([int(j.dofadr[0]) for j in joints])
        self.lower = np.array([float(j.range[0]) for j in joints])
        self.upper = np.array([float(j.range[1]) for j in joints])

    def _set(self, q: np.ndarray) -> None:
        self.data.qpos[self.qpos_adr] = q
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_comPos(self.model, self.data)  # the joint axes (cdof) mj_jacSite reads

    def tool(self, q: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """Tool point (3,) and finger direction (3,) in the world for joint positions `q` (6,)."""
        self._set(np.asarray(q, dtype=np.float64))
        return self.data.site_xpos[self.site].copy(), self.data.site_xmat[self.site].reshape(3, 3)[:, 0].copy()

    def solve(
        self,
        target: ArrayLike,
        reference: ArrayLike,
        direction: ArrayLike = DOWN,
        direction_weight: float = 0.05,
        iterations: int = 150,
    ) -> IkResult:
        """Joints (within limits) putting the tool point on `target` with the fingers along `direction`.

        `direction_weight` (m per rad) trades orientation for position where both cannot be met.
        """
        target = np.asarray(target, dtype=np.float64)
        want = np.asarray(direction, dtype=np.float64)
        want = want / np.linalg.norm(want)
        q = np.clip(np.asarray(reference, dtype=np.float64).copy(), self.lower, self.upper)
        cols = self.dof_adr[list(IK_JOINTS)]
        idx = list(IK_JOINTS)
        jacp = np.zeros((3, self.model.nv))
        jacr = np.zeros((3, self.model.nv))
        damping = 1e-4
        for _ in range(iterations):
            self._set(q)
            pos = self.data.site_xpos[self.site]
            axis = self.data.site_xmat[self.site].reshape(3, 3)[:, 0]
            e_pos = target - pos
            # Rotation that turns the fingers onto `want`, as an angular velocity (axis * sin(angle)).
            e_rot = np.cross(axis, want)
            if np.linalg.norm(e_pos) < 1e-6 and np.linalg.norm(e_rot) < 1e-5:
                break
            mujoco.mj_jacSite(self.model, self.data, jacp, jacr, self.site)
            jac = np.vstack([jacp[:, cols], direction_weight * jacr[:, cols]])
            err = np.concatenate([e_pos, direction_weight * e_rot])
            step = jac.T @ np.linalg.solve(jac @ jac.T + damping * np.eye(6), err)
            # Limit the step (rad) so the linearisation stays valid far from the solution.
            peak = np.max(np.abs(step))
            if peak > 0.2:
                step *= 0.2 / peak
            q[idx] = np.clip(q[idx] + step, self.lower[idx], self.upper[idx])
        pos, axis = self.tool(q)
        cos = float(np.clip(axis @ want, -1.0, 1.0))
        return IkResult(q, float(np.linalg.norm(target - pos)), float(np.arccos(cos)))
