"""The simulated robot without ROS: kinematics, dynamics, scene, cameras, task and scripted expert."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from omni_ros.config import ConfigError, OmniConfig, from_dict
from omni_ros.control.config import ControlConfig
from omni_ros.sim.arm import PlanarArm
from omni_ros.sim.config import SimConfig
from omni_ros.sim.env import SimEnv
from omni_ros.sim.expert import ReachExpert, solve_ik
from omni_ros.sim.render import GRIPPER_RGB, LINK_RGB, Renderer, project
from omni_ros.sim.rollout import expert_policy, run_episode
from omni_ros.sim.scene import COLORS, TABLE_RGB, sample_scene
from omni_ros.sim.task import TEMPLATES, make_prompt, parse_target


@pytest.fixture
def env() -> SimEnv:
    return SimEnv(SimConfig())


# ----- kinematics and dynamics --------------------------------------------------------------------------------


def test_forward_kinematics_of_known_poses():
    arm = PlanarArm([0.3, 0.25, 0.15])
    np.testing.assert_allclose(arm.end_effector(np.zeros(3)), [0.7, 0.0], atol=1e-12)
    np.testing.assert_allclose(arm.end_effector(np.array([math.pi / 2, 0, 0])), [0.0, 0.7], atol=1e-12)
    # Elbow bent back by 90 degrees, wrist straight: (0.3, 0) then 0.4 along -y.
    np.testing.assert_allclose(arm.end_effector(np.array([0, -math.pi / 2, 0])), [0.3, -0.4], atol=1e-12)
    joints = arm.joint_positions(np.array([0.0, math.pi / 2, math.pi / 2]))
    np.testing.assert_allclose(joints, [[0, 0], [0.3, 0], [0.3, 0.25], [0.15, 0.25]], atol=1e-12)
    assert arm.tip_heading(np.array([0.1, 0.2, 0.3])) == pytest.approx(0.6)


def test_jacobian_matches_finite_differences():
    arm = PlanarArm([0.3, 0.25, 0.15, 0.1])
    rng = np.random.default_rng(0)
    for _ in range(5):
        q = rng.uniform(-2, 2, 4)
        eps = 1e-6
        numeric = np.stack(
            [(arm.end_effector(q + eps * e) - arm.end_effector(q - eps * e)) / (2 * eps) for e in np.eye(4)], axis=1
        )
        np.testing.assert_allclose(arm.jacobian(q), numeric, atol=1e-6)


def test_dynamics_converge_to_the_command_with_first_order_lag():
    arm = PlanarArm([0.3, 0.25, 0.15], time_constant=0.1, max_velocity=100.0)
    arm.reset([0.0, 0.0, 0.0])
    arm.command([0.5, -0.3, 0.2])
    arm.step(0.1)  # one time constant: 1 - 1/e of the way
    np.testing.assert_allclose(arm.q, np.array([0.5, -0.3, 0.2]) * (1 - math.exp(-1)), rtol=1e-9)
    assert np.all(np.sign(arm.qd) == np.sign([0.5, -0.3, 0.2]))
    for _ in range(100):
        arm.step(0.01)
    np.testing.assert_allclose(arm.q, [0.5, -0.3, 0.2], atol=1e-3)


def test_dynamics_respect_speed_and_position_limits():
    arm = PlanarArm([0.3, 0.25], lower=[-1.0, -2.0], upper=[1.0, 2.0], time_constant=0.01, max_velocity=2.0)
    arm.reset([0.0, 0.0])
    arm.command([5.0, -5.0])  # clipped to the limits
    np.testing.assert_allclose(arm.target, [1.0, -2.0])
    arm.step(0.1)
    np.testing.assert_allclose(np.abs(arm.q), [0.2, 0.2], atol=1e-12)  # speed-capped
    for _ in range(200):
        arm.step(0.01)
    np.testing.assert_allclose(arm.q, [1.0, -2.0], atol=1e-9)
    with pytest.raises(ValueError, match="non-finite"):
        arm.command([np.nan, 0.0])
    with pytest.raises(ValueError, match="shape"):
        arm.command([0.0, 0.0, 0.0])


def test_env_substeps_make_results_independent_of_the_step_size(env):
    env.reset(1)
    env.command(env.arm.q + 0.4)
    env.step(0.5)
    coarse = env.arm.q.copy()
    env.reset(1)
    env.command(env.arm.q + 0.4)
    for _ in range(50):
        env.step(0.01)
    np.testing.assert_allclose(coarse, env.arm.q, atol=1e-9)
    assert env.time == pytest.approx(0.5)


# ----- scene, task and reset --------------------------------------------------------------------------------


def test_layouts_are_reachable_separated_and_seeded():
    for seed in range(50):
        scene = sample_scene(np.random.default_rng(seed), ["red", "green", "blue", "yellow"], 3, reach=0.7)
        assert len(set(scene.colors)) == 3
        xy = np.array([b.xy for b in scene.blocks])
        assert np.all(np.linalg.norm(xy, axis=1) < 0.7 * 0.9)
        assert np.all(xy[:, 1] > 0)
        dists = [np.linalg.norm(a - b) for i, a in enumerate(xy) for b in xy[i + 1 :]]
        assert min(dists) >= 0.14
    a = sample_scene(np.random.default_rng(7), list(COLORS), 4)
    b = sample_scene(np.random.default_rng(7), list(COLORS), 4)
    c = sample_scene(np.random.default_rng(8), list(COLORS), 4)
    assert a == b and a != c
    with pytest.raises(ValueError, match="unknown block colors"):
        sample_scene(np.random.default_rng(0), ["red", "mauve"], 2)


def test_prompts_name_their_block():
    for color in ("red", "green", "blue", "yellow"):
        prompts = {make_prompt(color, i) for i in range(len(TEMPLATES))}
        assert len(prompts) == len(TEMPLATES) >= 4
        assert all(parse_target(p) == color for p in prompts)
    assert parse_target("Touch the BLUE block, please") == "blue"
    assert parse_target("reach the block") is None
    assert parse_target("reached the redwood table") is None


def test_reset_is_deterministic_and_the_target_can_be_pinned(env):
    first = env.reset(5)
    info, q0 = env.episode, env.arm.q.copy()
    again = env.reset(5)
    assert env.episode == info
    np.testing.assert_array_equal(env.arm.q, q0)
    np.testing.assert_array_equal(first["images"]["base"], again["images"]["base"])
    assert first["prompt"] == info.prompt and parse_target(info.prompt) == info.target
    assert first["state"].dtype == np.float32 and first["state"].shape == (3,)
    # Same seed, another target: same table and start pose, a different goal and prompt.
    other = next(c for c in info.colors if c != info.target)
    env.reset(5, target=other)
    assert env.episode.colors == info.colors and env.episode.target == other
    assert parse_target(env.episode.prompt) == other
    np.testing.assert_array_equal(env.arm.q, q0)
    env.reset(5, prompt=f"touch the {other} block")
    assert env.task.target == other and env.task.prompt == f"touch the {other} block"
    missing = next(c for c in COLORS if c not in info.colors)
    with pytest.raises(KeyError, match=f"no {missing} block"):
        env.reset(5, target=missing)
    with pytest.raises(ValueError, match="names no block color"):
        env.reset(5, prompt="dance")
    targets = set()
    for seed in range(30):
        env.reset(seed)
        targets.add(env.task.target)
    assert len(targets) >= 3  # targets vary across episodes


def test_success_criterion_is_distance_to_the_prompted_block(env):
    env.reset(2)
    assert not env.success()
    block = np.array(env.scene.block(env.task.target).xy)
    q = solve_ik(env.arm, block, env.home)
    env.arm.reset(q)
    assert env.distance_to_target() < 1e-6 and env.success()
    # Just inside and just outside the radius, along the radial direction.
    radius = env.config.success_radius
    for offset, expected in ((0.9 * radius, True), (1.1 * radius, False)):
        point = block * (1 + offset / np.linalg.norm(block))
        env.arm.reset(solve_ik(env.arm, point, env.home))
        assert env.success() is expected
    # Touching another block is not success.
    other = next(b for b in env.scene.blocks if b.color != env.task.target)
    env.arm.reset(solve_ik(env.arm, np.array(other.xy), env.home))
    assert not env.success()


def test_success_needs_the_tip_to_stay_on_the_block(env):
    env.reset(2)
    block = np.array(env.scene.block(env.task.target).xy)
    on = solve_ik(env.arm, block, env.home)
    off = solve_ik(env.arm, block * (1 + 3 * env.config.success_radius / np.linalg.norm(block)), env.home)
    hold = env.config.success_hold_s
    # Sweeping past: on the block for less than the hold time, then off again.
    env.arm.reset(on)
    env.command(on)
    env.step(hold / 2)
    env.arm.reset(off)
    env.command(off)
    env.step(0.02)
    assert env.succeeded_at is None
    # Settling: success once the tip has stayed on the block for the hold time.
    env.arm.reset(on)
    env.command(on)
    start = env.time
    while env.succeeded_at is None and env.time < start + 2 * hold:
        env.step(0.02)
    assert env.succeeded_at == pytest.approx(start + hold, abs=0.021)


def test_reaching_the_block_after_the_episode_ended_is_not_a_success(env):
    """The sim node keeps stepping for `auto_reset_s` after an episode ends: a failed episode stays failed."""
    env.reset(2)
    on = solve_ik(env.arm, np.array(env.scene.block(env.task.target).xy), env.home)
    while not env.done:
        env.step(0.05)
    env.arm.reset(on)
    env.command(on)
    for _ in range(int(4 * env.config.success_hold_s / 0.02)):
        env.step(0.02)
    assert env.success() and env.succeeded_at is None
    # The same reach inside the episode succeeds, by the episode's end at the latest.
    env.reset(2)
    env.step(env.config.episode_time_s - 2 * env.config.success_hold_s)
    env.arm.reset(on)
    env.command(on)
    while not env.done:
        env.step(0.02)
    assert env.succeeded_at is not None and env.succeeded_at <= env.config.episode_time_s


def test_invalid_sim_settings_are_refused():
    with pytest.raises(ValueError, match="link_lengths has 2 values for 3 joints"):
        SimEnv(SimConfig(link_lengths=[0.3, 0.3]))
    with pytest.raises(ValueError, match="unknown cameras"):
        SimEnv(SimConfig(cameras=["side"]))
    with pytest.raises(ValueError, match="joint_lower"):
        SimEnv(SimConfig(joint_lower=[-1.0, -1.0]))
    with pytest.raises(ConfigError, match=r"sim\.n_joints"):
        from_dict(OmniConfig, {"sim": {"n_joints": "three"}})
    config = from_dict(
        OmniConfig, {"sim": {"n_joints": 2, "link_lengths": [0.4, 0.3]}, "control": {"blending": "ensemble"}}
    )
    assert config.sim.n_joints == 2 and config.control.blending == "ensemble"


# ----- cameras ----------------------------------------------------------------------------------------------


def _segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    t = np.clip(np.dot(p - a, b - a) / np.dot(b - a, b - a), 0, 1)
    return float(np.linalg.norm(p - (a + t * (b - a))))


def test_base_camera_shows_each_block_where_the_scene_says(env):
    renderer = Renderer(["base"], 224, 224)
    for seed in range(10):
        env.reset(seed)
        transform = renderer.transform("base", env.arm)
        bare = renderer.render("base", env.scene, None)
        full = renderer.render("base", env.scene, env.arm)
        assert bare.shape == (224, 224, 3) and bare.dtype == np.uint8
        scale = float(np.sqrt(abs(np.linalg.det(transform[:, :2]))))
        joints = env.arm.joint_positions()
        for block in env.scene.blocks:
            col, row = np.round(project(transform, block.xy)[0]).astype(int)
            assert tuple(bare[row, col]) == block.rgb
            # The block covers about size^2 of pixels of exactly its color, and nothing else has that color.
            area = np.all(bare == block.rgb, axis=2).sum()
            assert 0.6 * (block.size * scale) ** 2 < area < 1.2 * (block.size * scale) ** 2
            clear = min(_segment_distance(np.array(block.xy), a, b) for a, b in itertools.pairwise(joints))
            if clear > 0.05:
                assert tuple(full[row, col]) == block.rgb
        # A table point far from blocks and arm is table-colored.
        empty = np.array([0.5, 0.7])
        col, row = np.round(project(transform, empty)[0]).astype(int)
        if all(np.linalg.norm(np.array(b.xy) - empty) > 0.06 for b in env.scene.blocks):
            assert tuple(bare[row, col]) == TABLE_RGB
        # The arm is drawn: the midpoint of its first link has the link color.
        col, row = np.round(project(transform, joints[:2].mean(axis=0))[0]).astype(int)
        assert tuple(full[row, col]) == LINK_RGB


def test_renders_differ_per_layout_and_follow_the_arm(env):
    a = env.reset(0)["images"]
    b = env.reset(1)["images"]
    assert set(a) == {"base", "wrist"}
    for cam in a:
        assert a[cam].shape == (224, 224, 3) and a[cam].dtype == np.uint8
        assert np.mean(np.any(a[cam] != b[cam], axis=2)) > 0.01
    env.reset(0)
    before = env.render()
    env.command(env.arm.q + np.array([0.5, 0.0, 0.0]))
    env.step(1.0)
    after = env.render()
    # The base view changes only around the arm; the wrist view moves with the gripper.
    assert 0.001 < np.mean(np.any(before["base"] != after["base"], axis=2)) < 0.3
    assert np.mean(np.any(before["wrist"] != after["wrist"], axis=2)) > 0.01


def test_camera_size_is_configurable():
    env = SimEnv(SimConfig(cameras=["wrist"], image_width=96, image_height=64))
    obs = env.reset(0)
    assert list(obs["images"]) == ["wrist"] and obs["images"]["wrist"].shape == (64, 96, 3)


def test_wrist_camera_sees_the_block_under_the_gripper(env):
    expert = ReachExpert(env.arm, env.home)
    result = run_episode(env, expert_policy(env, expert), seed=3, render=False)
    assert result.success
    env.arm.reset(solve_ik(env.arm, np.array(env.scene.block(env.task.target).xy), env.home))
    wrist = env.renderer.render("wrist", env.scene, env.arm)
    transform = env.renderer.transform("wrist", env.arm)
    col, row = np.round(project(transform, env.arm.end_effector())[0]).astype(int)
    assert tuple(wrist[row, col]) == COLORS[env.task.target]
    assert np.any(np.all(wrist == GRIPPER_RGB, axis=2))
    assert not np.any(np.all(wrist == LINK_RGB, axis=2))  # a wrist camera does not see the arm's links


# ----- the scripted expert ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n_joints,links", [(3, [0.3, 0.25, 0.15]), (2, [0.4, 0.3]), (4, [0.25, 0.2, 0.15, 0.1])])
def test_ik_reaches_block_positions(n_joints, links):
    env = SimEnv(SimConfig(n_joints=n_joints, link_lengths=links))
    for seed in range(20):
        env.reset(seed)
        for block in env.scene.blocks:
            q = solve_ik(env.arm, block.xy, env.home)
            assert np.all(q >= env.arm.lower) and np.all(q <= env.arm.upper)
            assert np.linalg.norm(env.arm.end_effector(q) - np.array(block.xy)) < 1e-3


def test_expert_chunks_are_smooth_and_bounded(env):
    env.reset(4)
    expert = ReachExpert(env.arm, env.home, horizon=50, dt=0.02, max_speed=1.2)
    chunk = expert.chunk(env.arm.q, env.scene.block(env.task.target).xy)
    assert chunk.shape == (50, 3) and chunk.dtype == np.float32
    steps = np.abs(np.diff(chunk, axis=0))
    assert steps.max() <= 1.2 * 0.02 + 1e-6
    # It heads for the goal: the distance in joint space falls along the chunk.
    goal = expert.goal(env.scene.block(env.task.target).xy)
    dist = np.abs(chunk - goal).max(axis=1)
    assert np.all(np.diff(dist) <= 1e-6) and dist[-1] < dist[0]


@pytest.mark.parametrize("n_joints,links", [(3, [0.3, 0.25, 0.15]), (2, [0.4, 0.3]), (4, [0.25, 0.2, 0.15, 0.1])])
def test_expert_reaches_the_prompted_block_in_95_percent_of_seeds(n_joints, links):
    env = SimEnv(SimConfig(n_joints=n_joints, link_lengths=links))
    expert = ReachExpert(env.arm, env.home)
    policy = expert_policy(env, expert)
    results = [run_episode(env, policy, seed, render=False) for seed in range(100)]
    successes = [r for r in results if r.success]
    assert len(successes) >= 95, [(r.seed, r.final_distance) for r in results if not r.success]
    assert all(r.time_to_success <= env.config.episode_time_s for r in successes)


@pytest.mark.parametrize("blending", ["latest", "linear", "ensemble"])
def test_expert_through_the_executor_with_inference_latency(env, blending):
    expert = ReachExpert(env.arm, env.home)
    policy = expert_policy(env, expert)
    control = ControlConfig(blending=blending, max_velocity=[2.0])
    results = [run_episode(env, policy, seed, control, latency=0.15, render=False) for seed in range(40)]
    assert sum(r.success for r in results) >= 38
    assert all(r.max_step <= 2.0 / 50 + 1e-9 for r in results)  # the velocity limit held
    assert sum(r.chunks for r in results) > 1.5 * len(results)  # it re-planned while moving


def test_prompt_following_same_layout_different_target(env):
    expert = ReachExpert(env.arm, env.home)
    policy = expert_policy(env, expert)
    env.reset(11)
    colors = env.episode.colors
    reached = []
    for color in colors:
        result = run_episode(env, policy, 11, target=color, render=False)
        assert result.success and result.target == color
        reached.append(env.arm.end_effector().copy())
    # Different prompts end at different places.
    assert min(np.linalg.norm(a - b) for i, a in enumerate(reached) for b in reached[i + 1 :]) > 0.1


def test_rollout_records_frames_for_videos(env):
    expert = ReachExpert(env.arm, env.home)
    result = run_episode(env, expert_policy(env, expert), seed=0, record_every=10)
    assert result.success and result.frames
    assert set(result.frames[0]) == {"base", "wrist"}
    assert not np.array_equal(result.frames[0]["base"], result.frames[-1]["base"])
