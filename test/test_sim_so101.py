"""The MuJoCo SO-101 simulator without ROS: assets, rendering, determinism, limits, success rule, expert.

Rendering is headless: the GL backend is chosen before mujoco is imported (EGL, else OSMesa), no display.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from omni_ros.sim.so101.gl import select_gl_backend

select_gl_backend()

from omni_ros.config import ConfigError, load_config  # noqa: E402
from omni_ros.sim.engines import make_env, make_expert  # noqa: E402
from omni_ros.sim.rollout import expert_policy, run_episode  # noqa: E402
from omni_ros.sim.so101.assets import JOINTS, cluster_vertices, decimated_meshes  # noqa: E402
from omni_ros.sim.so101.env import So101Env  # noqa: E402
from omni_ros.sim.so101.model import CAMERAS  # noqa: E402


@pytest.fixture(scope="module")
def config(root):
    return load_config(root / "config" / "sim_so101.yaml")


@pytest.fixture(scope="module")
def env(config) -> So101Env:
    env = make_env(config.sim)
    yield env
    env.close()


def test_config_selects_the_so101_and_the_policy_side_matches_it(config, env):
    assert isinstance(env, So101Env) and config.sim.engine == "so101"
    assert env.joint_names == list(JOINTS) == config.robot.joint_names
    # The command limits the policy node enforces are the MJCF's joint ranges.
    np.testing.assert_allclose(config.control.position_lower, env.lower, atol=1e-4)
    np.testing.assert_allclose(config.control.position_upper, env.upper, atol=1e-4)
    assert [c.name for c in config.topics.cameras] == list(config.sim.cameras) == list(CAMERAS)
    assert "yellow" not in config.sim.block_colors  # the arm itself is yellow


def test_bad_settings_are_refused(config):
    with pytest.raises(ValueError, match="n_joints must be 6"):
        So101Env(dataclasses.replace(config.sim, n_joints=3))
    with pytest.raises(ValueError, match="unknown cameras"):
        So101Env(dataclasses.replace(config.sim, cameras=["base", "top"]))
    with pytest.raises(ValueError, match="physics_dt"):
        So101Env(dataclasses.replace(config.sim, so101=dataclasses.replace(config.sim.so101, physics_dt=0.1)))
    from omni_ros.config import OmniConfig, from_dict

    with pytest.raises(ConfigError, match=r"sim\.engine"):
        from_dict(OmniConfig, {"sim": {"engine": "gazebo"}})


def test_decimation_keeps_the_shape_with_far_fewer_triangles():
    # A unit cube of 12 triangles, each face split into many: clustering on a coarse grid keeps its corners.
    fine = cluster_vertices(_subdivided_cube(8), 1e-6)
    coarse = cluster_vertices(_subdivided_cube(8), 0.3)
    assert len(coarse[1]) < len(fine[1]) / 4
    assert np.abs(coarse[0]).max() <= 0.5 + 1e-9 and np.abs(coarse[0]).max() > 0.4
    assert coarse[1].max() < len(coarse[0]) and coarse[1].dtype == np.int32
    meshes = decimated_meshes(0.003)
    assert len(meshes) == 13 and sum(len(f) for _, f in meshes.values()) < 30_000


def _subdivided_cube(n: int) -> np.ndarray:
    tris = []
    g = np.linspace(-0.5, 0.5, n + 1)
    for axis in range(3):
        for side in (-0.5, 0.5):
            for i in range(n):
                for j in range(n):
                    quad = [(g[i], g[j]), (g[i + 1], g[j]), (g[i + 1], g[j + 1]), (g[i], g[j + 1])]
                    pts = [np.insert(np.array(p), axis, side) for p in quad]
                    tris += [[pts[0], pts[1], pts[2]], [pts[0], pts[2], pts[3]]]
    return np.array(tris)


def test_reset_is_deterministic_per_seed(config, env):
    other = make_env(config.sim)
    try:
        a, b = env.reset(11), other.reset(11)
        assert a["prompt"] == b["prompt"] and env.scene == other.scene
        np.testing.assert_array_equal(a["state"], b["state"])
        for cam in config.sim.cameras:
            assert a["images"][cam].shape == (config.sim.image_height, config.sim.image_width, 3)
            assert a["images"][cam].dtype == np.uint8
            np.testing.assert_array_equal(a["images"][cam], b["images"][cam])
        # The same commands give the same physics.
        for e in (env, other):
            e.command(e.positions + 0.2)
            e.step(0.5)
        np.testing.assert_array_equal(env.positions, other.positions)
        # Another seed: another table; the same seed with another target: the same table and start.
        c = env.reset(12)
        assert env.scene != other.scene or c["prompt"] != b["prompt"]
        other_target = next(col for col in env.scene.colors if col != env.task.target)
        d = other.reset(12, target=other_target)
        assert other.scene == env.scene and other.task.target == other_target
        np.testing.assert_array_equal(c["state"], d["state"])
    finally:
        other.close()


def test_cubes_are_laid_out_in_reach_apart_and_distinct(config, env):
    s = config.sim.so101
    for seed in range(30):
        env.reset(seed)
        xy = np.array([b.xy for b in env.scene.blocks])
        assert len(set(env.scene.colors)) == config.sim.n_blocks
        r = np.linalg.norm(xy, axis=1)
        assert np.all(r >= s.reach[0] - 1e-9) and np.all(r <= s.reach[1] + 1e-9)
        assert np.all(np.abs(np.degrees(np.arctan2(xy[:, 1], xy[:, 0]))) <= s.bearing_deg + 1e-6)
        gaps = [np.linalg.norm(p - q) for i, p in enumerate(xy) for q in xy[i + 1 :]]
        assert min(gaps) >= s.min_separation - 1e-9
        # Resting on the table (the free cubes settle where they were put).
        env.step(0.2)
        assert np.allclose(np.array([b.xy for b in env.scene.blocks]), xy, atol=1e-3)


def test_joint_limits_are_respected_and_bad_commands_refused(env):
    env.reset(3)
    with pytest.raises(ValueError, match="non-finite"):
        env.command([math.nan] * 6)
    with pytest.raises(ValueError, match="shape"):
        env.command([0.0] * 5)
    # Far past every limit: the servos go to the limit and no further.
    env.command(env.upper + 5.0)
    np.testing.assert_allclose(env.commanded, env.upper)
    corner = np.array([env.upper[0], env.lower[1], env.lower[2], env.upper[3], env.lower[4], env.upper[5]])
    env.command(corner * 3)
    for _ in range(50):
        env.step(0.04)
        q = env.positions
        # MuJoCo's limits are stiff springs: a joint arriving at speed dips in by a degree or two at most.
        assert np.all(q >= env.lower - 0.035) and np.all(q <= env.upper + 0.035), q
    # Settled: on the limits the clipped command asked for.
    np.testing.assert_allclose(env.positions, corner, atol=0.01)


def _place(env: So101Env, q: np.ndarray, settle: float = 0.6) -> None:
    env.command(q)
    for _ in range(round(settle / 0.02)):
        env.step(0.02)


def test_success_needs_the_fingertips_on_the_prompted_cube_for_the_hold_time(config, env):
    env.reset(5)
    expert = make_expert(env, 16, 0.05)
    target = env.scene.block(env.task.target)
    other = next(b for b in env.scene.blocks if b.color != env.task.target)
    # Over the other cube: on a cube, but not the prompted one.
    _place(env, expert.goal(other.xy))
    assert env.ended_on() == other.color and not env.success() and env.succeeded_at is None
    # Hovering 5 cm above the prompted cube: not touching.
    high = env.kinematics.solve((*target.xy, config.sim.block_size + 0.05), env.home).q
    _place(env, high)
    assert env.ended_on() is None and not env.success()
    assert env.distance_to_target() == pytest.approx(0.05, abs=0.01)
    # On it: success once the fingertips stayed there success_hold_s.
    env.command(expert.goal(target.xy))
    reached = None
    for _ in range(100):
        env.step(0.02)
        if env.success() and reached is None:
            reached = env.time
        if env.succeeded_at is not None:
            break
    assert reached is not None and env.succeeded_at is not None
    assert env.succeeded_at - reached >= config.sim.success_hold_s - 0.02 - 1e-9
    assert env.ended_on() == env.task.target and env.distance_to_target() < 0.015


def test_the_wrist_camera_sees_the_cube_under_the_fingers(env):
    env.reset(7)
    target = env.scene.block(env.task.target)
    _place(env, make_expert(env, 16, 0.05).goal(target.xy))
    frames = env.render()
    close, far = _share_of(frames["wrist"], env.task.target), _share_of(frames["base"], env.task.target)
    assert close > 0.04 and 0.0005 < far < 0.02 and close > 10 * far  # a patch of the view vs a few pixels
    for other in env.scene.colors:
        if other != env.task.target:
            assert _share_of(frames["wrist"], env.task.target) > 3 * _share_of(frames["wrist"], other)


def _share_of(image: np.ndarray, color: str) -> float:
    """Fraction of pixels whose colour direction is `color`'s (the cube lit or shaded)."""
    from omni_ros.sim.scene import COLORS

    rgb = np.asarray(COLORS[color], dtype=np.float64)
    pixels = image.reshape(-1, 3).astype(np.float64)
    norm = pixels / (np.linalg.norm(pixels, axis=1, keepdims=True) + 1e-9)
    return float(np.mean(norm @ (rgb / np.linalg.norm(rgb)) > 0.97))


def test_the_scripted_expert_solves_the_task_through_the_chunk_executor(config, env):
    expert = make_expert(env, 16, 0.05)
    for seed in range(40, 46):
        result = run_episode(
            env, expert_policy(env, expert), seed, chunk_dt=0.05, latency=0.1, render=False, control=config.control
        )
        assert result.success, (seed, result)
        assert result.time_to_success < 3.0
        # Touching, not shoving: the cubes stay where they were.
        env_xy = np.array([b.xy for b in env.scene.blocks])
        env.reset(seed)
        np.testing.assert_allclose(env_xy, np.array([b.xy for b in env.scene.blocks]), atol=5e-3)


def test_frames_can_come_from_any_thread(env):
    """A ROS executor may run the camera timer on another thread than the one that created the GL context."""
    import threading

    first = env.reset(2)["images"]
    frames: list = []
    errors: list = []

    def render() -> None:
        try:
            frames.append(env.render())
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)

    worker = threading.Thread(target=render)
    worker.start()
    worker.join(timeout=30)
    assert not errors and len(frames) == 1, errors
    for cam, frame in first.items():
        np.testing.assert_array_equal(frames[0][cam], frame)
    np.testing.assert_array_equal(env.render()["base"], first["base"])  # and back on this thread


def test_gl_backend_choice_egl_then_osmesa_then_a_clear_error(monkeypatch):
    import os
    import subprocess
    import sys

    from omni_ros.sim.so101 import gl

    # A fresh process without MUJOCO_GL picks a headless backend by itself and can render with it.
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY")}
    render = (
        "m = mujoco.MjModel.from_xml_string('<mujoco><worldbody><geom size=\"1\"/></worldbody></mujoco>'); "
        "r = mujoco.Renderer(m, 16, 16); print(b, os.environ['MUJOCO_GL'], r.render().shape); r.close()"
    )
    choose = "from omni_ros.sim.so101.gl import select_gl_backend; b = select_gl_backend(); "
    # Chosen before mujoco is imported, and after (mujoco then bound GLFW, which needs a display).
    for code in (choose + "import mujoco, os; " + render, "import mujoco, os; " + choose + render):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        backend, chosen, shape = out.stdout.split(maxsplit=2)
        assert backend == chosen and backend in ("egl", "osmesa") and shape.strip() == "(16, 16, 3)"

    # The choice itself, without touching this process's GL: EGL first, OSMesa without EGL, else an error.
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delenv("PYOPENGL_PLATFORM", raising=False)
    monkeypatch.setattr(gl, "_imported", lambda module: False)
    monkeypatch.setattr(gl, "_egl_works", lambda: False)
    monkeypatch.setattr(gl, "_osmesa_available", lambda: True)
    assert gl.select_gl_backend() == "osmesa"
    assert gl.os.environ["MUJOCO_GL"] == "osmesa" and gl.os.environ["PYOPENGL_PLATFORM"] == "osmesa"
    monkeypatch.delenv("MUJOCO_GL")
    monkeypatch.setattr(gl, "_osmesa_available", lambda: False)
    with pytest.raises(gl.GLBackendError, match="libosmesa6"):
        gl.select_gl_backend()
    monkeypatch.setenv("MUJOCO_GL", "wgl")
    with pytest.raises(gl.GLBackendError, match="not a backend"):
        gl.select_gl_backend()
