"""The MuJoCo world: the SO-101 on a table with coloured cubes, a fixed camera and a wrist camera.

Built with `mujoco.MjSpec` from the packaged MJCF (joints, servos, inertias untouched) plus what the
task needs. Rendering is set up for a software rasterizer: no shadows, no multi-sampling, decimated
meshes (omni_ros.sim.so101.assets). Frames: x points away from the robot, z up, the table top at z=0
with the base on it; positive shoulder_pan turns the arm to -y.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from omni_ros.sim.scene import COLORS, FLOOR_RGB, TABLE_RGB
from omni_ros.sim.so101.assets import ROBOT_XML, asset_dir, decimated_meshes
from omni_ros.sim.so101.config import So101Config
from omni_ros.sim.so101.gl import select_gl_backend

select_gl_backend()
import mujoco  # noqa: E402  (after the GL backend is chosen)

CAMERAS = ("base", "wrist")
# Table top (x, y extents, m); the base sits near the edge closest to -x.
TABLE_X = (-0.12, 0.42)
TABLE_Y = (-0.33, 0.33)
TABLE_THICKNESS = 0.02
# The fixed camera: in front of the robot, above the table, looking back at the workspace.
BASE_CAMERA_POS = (0.5, 0.0, 0.45)
BASE_CAMERA_TARGET = (0.15, 0.0, 0.0)
# The wrist camera, in the gripper body's frame (its -z axis is the fingers' direction): beside the fixed
# jaw, looking along the fingers, so the fingertips are in view at the bottom of the image.
WRIST_CAMERA_POS = (0.0, -0.045, -0.035)
ARM_BODIES = ("shoulder", "upper_arm", "lower_arm", "wrist", "gripper", "moving_jaw_so101_v1")


def _rgba(rgb: Sequence[int]) -> list[float]:
    return [c / 255.0 for c in rgb] + [1.0]


def look_at(position: Sequence[float], target: Sequence[float], up: Sequence[float] = (0.0, 0.0, 1.0)) -> list[float]:
    """Quaternion (w, x, y, z) of a MuJoCo camera at `position` looking at `target` (cameras look along -z)."""
    pos = np.asarray(position, dtype=np.float64)
    forward = np.asarray(target, dtype=np.float64) - pos
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, up)
    right /= np.linalg.norm(right)
    true_up = np.cross(right, forward)
    rotation = np.stack([right, true_up, -forward], axis=1)
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, rotation.flatten())
    return quat.tolist()


def build_spec(config: So101Config, n_cubes: int, cube_size: float, width: int, height: int) -> mujoco.MjSpec:
    """The world as an MjSpec with `n_cubes` free cubes named cube_0.. (placed and coloured at reset)."""
    spec = mujoco.MjSpec.from_file(str(asset_dir() / ROBOT_XML))
    spec.modelname = "so101_cubes"
    if config.mesh_cell > 0:
        meshes = decimated_meshes(config.mesh_cell)
        for mesh in spec.meshes:
            vertices, faces = meshes[mesh.file]
            mesh.name = mesh.name or mesh.file.rsplit(".", 1)[0]
            mesh.file = ""
            mesh.uservert = vertices.astype(np.float32).ravel().tolist()
            mesh.userface = faces.ravel().tolist()
    spec.option.timestep = config.physics_dt
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    if config.gravity_compensation:
        for name in ARM_BODIES:
            spec.body(name).gravcomp = 1.0

    spec.visual.global_.offwidth = max(width, 64)
    spec.visual.global_.offheight = max(height, 64)
    spec.visual.quality.offsamples = 0
    spec.visual.quality.shadowsize = 0
    spec.visual.headlight.ambient = [0.35, 0.35, 0.35]
    spec.visual.headlight.diffuse = [0.45, 0.45, 0.45]
    spec.visual.headlight.specular = [0.0, 0.0, 0.0]
    spec.visual.map.znear = 0.005

    world = spec.worldbody
    light = world.add_light()
    light.name = "sun"
    light.pos = [0.2, 0.3, 1.2]
    light.dir = [-0.1, -0.25, -1.0]
    light.type = mujoco.mjtLightType.mjLIGHT_DIRECTIONAL
    light.diffuse = [0.6, 0.6, 0.6]
    light.specular = [0.1, 0.1, 0.1]
    light.castshadow = False

    floor = world.add_geom()
    floor.name = "floor"
    floor.type = mujoco.mjtGeom.mjGEOM_PLANE
    floor.size = [2.0, 2.0, 0.05]
    floor.pos = [0.0, 0.0, -0.75]
    floor.rgba = _rgba(FLOOR_RGB)
    table = world.add_geom()
    table.name = "table"
    table.type = mujoco.mjtGeom.mjGEOM_BOX
    table.size = [(TABLE_X[1] - TABLE_X[0]) / 2, (TABLE_Y[1] - TABLE_Y[0]) / 2, TABLE_THICKNESS / 2]
    table.pos = [(TABLE_X[0] + TABLE_X[1]) / 2, (TABLE_Y[0] + TABLE_Y[1]) / 2, -TABLE_THICKNESS / 2]
    table.rgba = _rgba(TABLE_RGB)
    table.friction = [0.8, 0.005, 0.0001]

    for i in range(n_cubes):
        body = world.add_body()
        body.name = f"cube_{i}"
        body.pos = [0.2, 0.1 * i, cube_size / 2]
        body.add_freejoint().name = f"cube_{i}"
        geom = body.add_geom()
        geom.name = f"cube_{i}"
        geom.type = mujoco.mjtGeom.mjGEOM_BOX
        geom.size = [cube_size / 2] * 3
        geom.mass = 0.03
        geom.friction = [0.8, 0.005, 0.0001]
        geom.rgba = _rgba(COLORS["red"])

    base = world.add_camera()
    base.name = "base"
    base.pos = list(BASE_CAMERA_POS)
    base.quat = look_at(BASE_CAMERA_POS, BASE_CAMERA_TARGET)
    base.fovy = config.base_fovy
    wrist = spec.body("gripper").add_camera()
    wrist.name = "wrist"
    wrist.pos = list(WRIST_CAMERA_POS)
    # Tilted 12 degrees towards the fingers (about the camera's x axis) so the fingertips stay in view.
    tilt = math.radians(12.0)
    wrist.quat = [math.cos(tilt / 2), math.sin(tilt / 2), 0.0, 0.0]
    wrist.fovy = config.wrist_fovy
    return spec


def compile_model(spec: mujoco.MjSpec) -> mujoco.MjModel:
    model = spec.compile()
    model.light_castshadow[:] = 0
    return model
