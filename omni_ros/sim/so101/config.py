"""Settings of the MuJoCo SO-101 simulator only (the `sim.so101:` section; `sim.engine: so101` selects it).

Everything the two simulators share (cameras, image size, rates, cube colours and count, success
radius and hold time, episode length, topics) stays in the `sim:` section itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omni_ros.typed_config import FieldError

# The SO-101's joints, base to gripper, as its MJCF names them.
SO101_JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")


@dataclass
class So101Config:
    # Physics time step, s (MuJoCo integrates the arm, its position servos and the cubes at this rate).
    physics_dt: float = 0.002
    # The fingertips count as touching a cube when at most this far above its top face, m.
    touch_height: float = 0.02
    # Cubes are laid out in a ring sector in front of the base: distance from the base (m) ...
    reach: list[float] = field(default_factory=lambda: [0.15, 0.27])
    # ... and bearing from straight ahead, degrees (positive to the robot's left).
    bearing_deg: float = 50.0
    # Minimum distance between cube centres, m.
    min_separation: float = 0.07
    # Grid cell of the mesh decimation for rendering, m (0: the full CAD meshes, ~20x slower to render).
    mesh_cell: float = 0.003
    # The STS3215 servo's own position loop holds its pose against gravity; MuJoCo's gravity compensation
    # of the arm's links stands in for it (off: the P-controller of the MJCF sags a few millimetres).
    gravity_compensation: bool = True
    # Vertical field of view of the fixed camera and the wrist camera, degrees.
    base_fovy: float = 45.0
    wrist_fovy: float = 70.0

    def __post_init__(self) -> None:
        if not 0 < self.physics_dt <= 0.01:
            raise FieldError("physics_dt", f"must be in (0, 0.01] s, got {self.physics_dt}")
        if len(self.reach) != 2 or not 0 < self.reach[0] < self.reach[1]:
            raise FieldError("reach", f"must be [near, far] with 0 < near < far, got {self.reach}")
        for key in ("min_separation", "base_fovy", "wrist_fovy"):
            if not getattr(self, key) > 0:
                raise FieldError(key, f"must be positive, got {getattr(self, key)}")
        if self.mesh_cell < 0:
            raise FieldError("mesh_cell", f"must be >= 0 (0: the full meshes), got {self.mesh_cell}")
