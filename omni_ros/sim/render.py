"""OpenCV camera views of the table, the blocks and the arm (RGB uint8).

Each camera is an affine map from table metres to pixels: "base" looks
straight down on the whole table from above the arm's base (far side of the
table at the top of the image); "wrist" looks down from the gripper, turned
with it so the gripper always points up, zoomed in on what lies ahead.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import cv2
import numpy as np

from omni_ros.sim.arm import PlanarArm
from omni_ros.sim.config import CAMERAS
from omni_ros.sim.scene import FLOOR_RGB, TABLE_RGB, TABLE_X, TABLE_Y, Scene

LINK_RGB = (125, 128, 140)
JOINT_RGB = (35, 35, 40)
GRIPPER_RGB = (235, 235, 235)
LINK_WIDTH = 0.03  # metres
# Fixed-point drawing (4 fractional bits) keeps sub-pixel positions exact.
_SHIFT = 4
_ONE = 1 << _SHIFT


def base_transform(width: int, height: int) -> np.ndarray:
    """World -> pixel for the top-down base camera: the table fills the view, +y points up."""
    center = np.array([(TABLE_X[0] + TABLE_X[1]) / 2, (TABLE_Y[0] + TABLE_Y[1]) / 2])
    half = 0.5 * max(TABLE_X[1] - TABLE_X[0], TABLE_Y[1] - TABLE_Y[0]) + 0.03
    return _view(center, 0.0, half, width, height)


def wrist_transform(arm: PlanarArm, width: int, height: int, half_extent: float = 0.16) -> np.ndarray:
    """World -> pixel for the wrist camera: centred a little ahead of the tip, gripper pointing up."""
    heading = arm.tip_heading()
    direction = np.array([math.cos(heading), math.sin(heading)])
    center = arm.end_effector() + direction * (0.6 * half_extent)
    # Rotate the world so the heading becomes +y (image up).
    return _view(center, math.pi / 2 - heading, half_extent, width, height)


def _view(center: np.ndarray, rotation: float, half_extent: float, width: int, height: int) -> np.ndarray:
    scale = min(width, height) / (2 * half_extent)
    c, s = math.cos(rotation), math.sin(rotation)
    rot = np.array([[c, -s], [s, c]])
    # Image rows grow downwards: flip y.
    linear = np.array([[scale, 0.0], [0.0, -scale]]) @ rot
    offset = np.array([width / 2, height / 2]) - linear @ center
    return np.hstack([linear, offset[:, None]])


def project(transform: np.ndarray, points: np.ndarray) -> np.ndarray:
    """(K, 2) metres -> (K, 2) pixel coordinates (x = column, y = row), float."""
    points = np.atleast_2d(np.asarray(points, dtype=np.float64))
    return points @ transform[:, :2].T + transform[:, 2]


def _fixed(transform: np.ndarray, points: np.ndarray) -> np.ndarray:
    return np.round(project(transform, points) * _ONE).astype(np.int32)


def draw(
    image: np.ndarray,
    transform: np.ndarray,
    scene: Scene,
    arm: PlanarArm | None,
    links: bool = True,
) -> np.ndarray:
    """Draw floor, table, blocks and (unless None) the arm into `image` through `transform`.

    `links=False` draws only the gripper, as a camera on the wrist sees it.
    """
    image[:] = FLOOR_RGB
    scale = float(np.sqrt(abs(np.linalg.det(transform[:, :2]))))
    table = np.array(
        [[TABLE_X[0], TABLE_Y[0]], [TABLE_X[1], TABLE_Y[0]], [TABLE_X[1], TABLE_Y[1]], [TABLE_X[0], TABLE_Y[1]]]
    )
    cv2.fillPoly(image, [_fixed(transform, table)], TABLE_RGB, cv2.LINE_AA, _SHIFT)
    for block in scene.blocks:
        cv2.fillPoly(image, [_fixed(transform, block.corners())], block.rgb, cv2.LINE_AA, _SHIFT)
    if arm is not None:
        _draw_arm(image, transform, arm, scale, links)
    return image


def _draw_arm(image: np.ndarray, transform: np.ndarray, arm: PlanarArm, scale: float, links: bool) -> None:
    heading = arm.tip_heading()
    fwd = np.array([math.cos(heading), math.sin(heading)])
    side = np.array([-fwd[1], fwd[0]])
    tip = arm.end_effector()
    palm = tip - 0.025 * fwd
    if links:
        # The last link ends at the palm, so what lies under the tool point stays visible.
        points = arm.joint_positions()
        points[-1] = palm
        joints = _fixed(transform, points)
        width = max(1, round(LINK_WIDTH * scale))
        for a, b in itertools.pairwise(joints):
            cv2.line(image, tuple(a), tuple(b), LINK_RGB, width, cv2.LINE_AA, _SHIFT)
        radius = round(0.6 * LINK_WIDTH * scale * _ONE)
        for p in joints[:-1]:
            cv2.circle(image, tuple(p), radius, JOINT_RGB, -1, cv2.LINE_AA, _SHIFT)
    # A two-finger gripper whose fingertips straddle the tool point.
    finger = max(1, round(0.008 * scale))
    points = [palm - 0.025 * side, palm + 0.025 * side]
    for end in points:
        cv2.line(image, *_pts(transform, end, end + 0.035 * fwd), GRIPPER_RGB, finger, cv2.LINE_AA, _SHIFT)
    cv2.line(image, *_pts(transform, points[0], points[1]), GRIPPER_RGB, finger, cv2.LINE_AA, _SHIFT)


def _pts(transform: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[tuple[int, int], tuple[int, int]]:
    fa, fb = _fixed(transform, np.stack([a, b]))
    return (int(fa[0]), int(fa[1])), (int(fb[0]), int(fb[1]))


class Renderer:
    """Renders the configured cameras into reused buffers."""

    def __init__(self, cameras: Sequence[str] = CAMERAS, width: int = 224, height: int = 224) -> None:
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown or not cameras:
            raise ValueError(f"unknown cameras {unknown}; available: {list(CAMERAS)}")
        if width < 16 or height < 16:
            raise ValueError(f"image size {width}x{height} is too small (min 16x16)")
        self.cameras = tuple(cameras)
        self.width, self.height = int(width), int(height)
        self._base = base_transform(self.width, self.height)

    def transform(self, camera: str, arm: PlanarArm) -> np.ndarray:
        return self._base if camera == "base" else wrist_transform(arm, self.width, self.height)

    def render(self, camera: str, scene: Scene, arm: PlanarArm | None) -> np.ndarray:
        """A fresh (H, W, 3) RGB uint8 frame of `camera`."""
        image = np.empty((self.height, self.width, 3), np.uint8)
        if camera == "wrist" and arm is None:
            raise ValueError("the wrist camera needs the arm")
        return draw(image, self.transform(camera, arm), scene, arm, links=camera != "wrist")

    def render_all(self, scene: Scene, arm: PlanarArm) -> dict[str, np.ndarray]:
        return {camera: self.render(camera, scene, arm) for camera in self.cameras}
