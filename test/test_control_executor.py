"""ActionChunkExecutor without ROS: timing, prefetch, blending, limits and safety states."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from omni_ros.control.blending import ChunkTrajectory, CrossFade, Ensemble, Hold
from omni_ros.control.config import ControlConfig
from omni_ros.control.executor import ActionChunkExecutor, ExecState, held_share
from omni_ros.control.limits import JointLimits

DT = 0.02  # action spacing
RATE = 50.0  # control rate
TICK = 1.0 / RATE


def trajectory(t: np.ndarray) -> np.ndarray:
    """A smooth 2-joint motion (peak speed 1 unit/s)."""
    t = np.asarray(t, dtype=np.float64)
    return np.stack([np.sin(t), 0.5 * np.cos(2 * t)], axis=-1)


def chunk_at(t0: float, horizon: int = 50, offset: float = 0.0) -> np.ndarray:
    """The chunk a policy observing at t0 would predict: the trajectory from t0, plus a disagreement `offset`."""
    return trajectory(t0 + DT * np.arange(horizon)) + offset


def make(blending: str = "latest", **overrides) -> ActionChunkExecutor:
    config = ControlConfig(blending=blending, max_velocity=[], **overrides)
    executor = ActionChunkExecutor(2, config, control_rate_hz=RATE)
    executor.observe_position(trajectory(0.0))
    return executor


def run(executor: ActionChunkExecutor, start: float, stop: float) -> list:
    ticks = np.arange(round((stop - start) / TICK)) * TICK + start
    return [executor.tick(float(t)) for t in ticks]


def max_step(commands: list) -> float:
    positions = np.array([c.positions for c in commands if c.publish])
    return float(np.abs(np.diff(positions, axis=0)).max())


# ----- latency compensation ---------------------------------------------------------------------------------


def test_latency_compensation_skips_the_actions_whose_time_has_passed():
    executor = make()
    actions = np.arange(100, dtype=np.float64).reshape(50, 2)
    report = executor.add_chunk(actions, stamp=10.0, dt=DT, now=10.1)
    assert report.accepted and report.skipped == 5
    cmd = executor.tick(10.1)
    np.testing.assert_allclose(cmd.positions, actions[5])
    # Between actions the command interpolates.
    np.testing.assert_allclose(executor.tick(10.13).positions, (actions[6] + actions[7]) / 2)
    assert executor.stats.skipped_actions == 5


def test_without_latency_compensation_the_chunk_starts_on_arrival():
    executor = make(latency_compensation=False)
    actions = np.arange(100, dtype=np.float64).reshape(50, 2)
    report = executor.add_chunk(actions, stamp=10.0, dt=DT, now=10.1)
    assert report.accepted and report.skipped == 0
    np.testing.assert_allclose(executor.tick(10.1).positions, actions[0])


def test_a_chunk_older_than_its_horizon_is_refused_without_run_late_chunks():
    executor = make(run_late_chunks=False)
    report = executor.add_chunk(chunk_at(0.0, horizon=10), stamp=0.0, dt=DT, now=0.5)
    assert not report.accepted and "past its end" in report.reason
    assert executor.state is ExecState.IDLE
    assert not executor.tick(0.5).publish


def test_a_late_chunk_runs_from_its_arrival_when_the_robot_held_still_since_its_observation():
    # A policy slower than its chunks: observed at rest at 0.0, answered at 0.5, after the chunk's last action
    # (0.18). Nothing moved the robot since, so the chunk is what a synchronous policy would run now.
    executor = make()
    actions = np.arange(20, dtype=np.float64).reshape(10, 2)
    report = executor.add_chunk(actions, stamp=0.0, dt=DT, now=0.5)
    assert report.accepted and report.skipped == 0 and executor.stats.late_chunks_run == 1
    np.testing.assert_allclose(executor.tick(0.5).positions, actions[0])
    np.testing.assert_allclose(executor.tick(0.5 + 3 * DT).positions, actions[3])
    # The next one is observed after this plan's last action (at rest again): also run on arrival.
    end = 0.5 + 9 * DT
    assert executor.add_chunk(actions + 1, stamp=end + 0.01, dt=DT, now=end + 0.6).accepted
    np.testing.assert_allclose(executor.tick(end + 0.6).positions, actions[0] + 1)
    assert executor.stats.late_chunks_run == 2


def test_a_late_chunk_observed_while_the_robot_moved_is_refused():
    executor = make()
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)  # executes until 0.98
    report = executor.add_chunk(chunk_at(0.5, horizon=10), stamp=0.5, dt=DT, now=1.2)
    assert not report.accepted and "past its end" in report.reason and executor.stats.late_chunks_run == 0


def test_an_observation_answered_too_late_is_not_asked_again():
    # Its answer can only come later still: the loop waits for a newer observation instead of spinning on it.
    executor = make()
    assert not executor.answered_late(0.5)
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)  # executes until 0.98
    assert not executor.add_chunk(chunk_at(0.5, horizon=10), stamp=0.5, dt=DT, now=1.2).accepted
    assert executor.answered_late(0.5) and executor.answered_late(0.3)
    assert not executor.answered_late(0.52)  # a newer observation is worth an inference
    # A refused chunk never moves the late mark back; a dropped plan (here a reset) forgets it: a late chunk
    # would now run from its arrival.
    assert not executor.add_chunk(chunk_at(0.4, horizon=10), stamp=0.4, dt=DT, now=1.2).accepted
    assert executor.answered_late(0.5)
    executor.reset_plan()
    assert not executor.answered_late(0.5)


def test_no_prefetch_while_inference_takes_longer_than_a_chunk():
    # Measured latency 0.5 s against chunks of 10 x 0.02 s: a prefetched answer would arrive after the plan ends and
    # be dropped, so the next inference starts when the plan is done (from the robot at rest).
    executor = make(prefetch_threshold=1.0)
    executor.request_started(0.0)
    executor.add_chunk(chunk_at(0.0, horizon=10), stamp=0.0, dt=DT, now=0.5)  # runs 0.50 .. 0.68
    assert not executor.should_request(0.52) and not executor.should_request(0.66)
    assert executor.should_request(0.70)
    fast = make(prefetch_threshold=1.0)
    fast.add_chunk(chunk_at(0.0, horizon=10), stamp=0.0, dt=DT, now=0.05)
    assert fast.should_request(0.06)  # in-time chunks: prefetch as configured


def test_latency_compensated_switch_is_smooth_and_uncompensated_one_jumps():
    for compensate, bound in ((True, 0.021), (False, None)):
        executor = make("latest", latency_compensation=compensate)
        executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
        commands = run(executor, 0.0, 0.5)
        # The next chunk answers the observation at 0.4 and arrives 0.1 s later.
        executor.add_chunk(chunk_at(0.4), stamp=0.4, dt=DT, now=0.5)
        commands += run(executor, 0.5, 1.2)
        if compensate:
            assert max_step(commands) < bound  # ~ peak speed x tick
        else:
            assert max_step(commands) > 0.05  # replays 0.1 s of old actions: a step back


# ----- threshold-triggered prefetch -------------------------------------------------------------------------


@pytest.mark.parametrize("threshold,first_true", [(0.5, 0.50), (0.2, 0.80), (0.0, 0.98)])
def test_prefetch_starts_when_remaining_actions_fall_below_the_threshold(threshold, first_true):
    executor = make(prefetch_threshold=threshold)
    assert executor.should_request(0.0)  # nothing to execute yet
    executor.request_started(0.0)
    assert not executor.should_request(0.0)  # one inference at a time
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    times = np.round(np.arange(0, 1.2, TICK), 6)
    flags = [executor.should_request(float(t)) for t in times]
    first = times[flags.index(True)]
    assert first == pytest.approx(first_true)
    assert not any(flags[: flags.index(True)]) and all(flags[flags.index(True) :])
    executor.request_started(float(first))
    assert not executor.should_request(float(first) + 0.1)
    executor.request_failed("backend error")
    assert executor.should_request(float(first) + 0.1)


def test_no_requests_while_stopped():
    executor = make()
    executor.pause()
    assert not executor.should_request(0.0)
    executor.resume()
    assert executor.should_request(0.0)
    executor.set_stale(True, "camera base is 0.8 s old")
    assert not executor.should_request(0.0)


# ----- blending ---------------------------------------------------------------------------------------------


def run_boundary(blending: str, offset: float, **overrides) -> tuple[ActionChunkExecutor, list]:
    """Old chunk from t=0, new chunk (stamp 0.45, arriving 0.5) disagreeing by `offset`."""
    executor = make(blending, **overrides)
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    run(executor, 0.0, 0.44)  # the start (a fade-in from the measured position) is not the boundary
    commands = run(executor, 0.44, 0.5)
    report = executor.add_chunk(chunk_at(0.45, offset=offset), stamp=0.45, dt=DT, now=0.5)
    assert report.accepted
    commands += run(executor, 0.5, 1.4)
    return executor, commands


def test_latest_switches_at_once():
    _, commands = run_boundary("latest", offset=0.3)
    assert max_step(commands) > 0.29  # the whole disagreement in one tick
    _, commands = run_boundary("latest", offset=0.0)
    assert max_step(commands) < 0.021


@pytest.mark.parametrize("blending", ["linear", "ensemble"])
@pytest.mark.parametrize("window", [0.1, 0.2, 0.4])
def test_blending_keeps_commands_continuous_across_a_chunk_boundary(blending, window):
    offset = 0.3
    _, commands = run_boundary(blending, offset, blend_window_s=window)
    # Trajectory speed x tick plus the disagreement spread over the window (+ ensemble fade-out of the old chunk).
    bound = 1.0 * TICK + offset * TICK / window
    assert max_step(commands) <= 1.05 * bound
    assert max_step(commands) > 0.5 * offset * TICK / window  # the blend really moved across the offset
    # Once blended in, the new chunk is followed.
    last = commands[-1]
    assert last.publish and last.chunk_id == 1


def test_linear_cross_fade_weights_are_linear_in_time():
    executor = make("linear", blend_window_s=0.2)
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    executor.add_chunk(chunk_at(0.45, offset=0.3), stamp=0.45, dt=DT, now=0.5)
    # Halfway through the window: half old, half new (1e-4: linear interpolation between actions).
    old, new = trajectory(0.6), trajectory(0.6) + 0.3
    np.testing.assert_allclose(executor.tick(0.6).positions, 0.5 * old + 0.5 * new, atol=1e-4)
    old, new = trajectory(0.65), trajectory(0.65) + 0.3
    np.testing.assert_allclose(executor.tick(0.65).positions, 0.25 * old + 0.75 * new, atol=1e-4)
    np.testing.assert_allclose(executor.tick(0.71).positions, trajectory(0.71) + 0.3, atol=1e-4)


@pytest.mark.parametrize("decay,closer_to_old", [(0.01, True), (-0.01, False)])
def test_ensemble_weights_follow_act(decay, closer_to_old):
    executor = make("ensemble", blend_window_s=0.1, ensemble_decay=decay)
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    executor.add_chunk(chunk_at(0.45, offset=0.3), stamp=0.45, dt=DT, now=0.5)
    t = 0.7  # after the fade-in, both chunks predict this instant
    value = executor.tick(t).positions
    old, new = trajectory(t), trajectory(t) + 0.3
    share_new = float(np.mean((value - old) / (new - old)))
    # ACT: weight exp(-decay * age in steps); the second chunk arrived 25 steps later.
    w_old, w_new = 1.0, np.exp(-decay * 25)
    assert share_new == pytest.approx(w_new / (w_old + w_new), abs=1e-3)
    assert (share_new < 0.5) is closer_to_old
    # After the old chunk's last action, only the new one remains.
    np.testing.assert_allclose(executor.tick(1.0).positions, trajectory(1.0) + 0.3, atol=1e-4)


def test_blending_building_blocks_are_continuous():
    a = ChunkTrajectory(chunk_at(0.0, 20), 0.0, DT)
    b = ChunkTrajectory(chunk_at(0.2, 20, offset=0.5), 0.2, DT)
    hold = Hold(np.array([1.0, -1.0]))
    for traj in (
        CrossFade(hold, a, 0.05, 0.1),
        CrossFade(a, b, 0.25, 0.15),
        Ensemble([(a, 0.0), (b, 0.25)], 0.01, 0.1),
    ):
        ts = np.arange(0.0, 0.8, 0.001)
        values = np.array([traj.at(float(t)) for t in ts])
        assert np.abs(np.diff(values, axis=0)).max() < 0.02
    assert a.remaining(0.0) == 19 and a.remaining(0.37) == 1 and a.remaining(0.38) == 0
    assert CrossFade(hold, a, 0.0, 0.1).simplify(0.2) is a


# ----- limits -----------------------------------------------------------------------------------------------


def test_position_and_velocity_limits_clamp_every_command():
    config = ControlConfig(
        blending="latest", position_lower=[-0.5, -1.0], position_upper=[0.5], max_velocity=[1.0, 2.0]
    )
    executor = ActionChunkExecutor(2, config, control_rate_hz=RATE)
    executor.observe_position([0.0, 0.0])
    far = np.tile([[3.0, -3.0]], (50, 1))
    executor.add_chunk(far, stamp=0.0, dt=DT, now=0.0)
    commands = run(executor, 0.0, 1.5)
    positions = np.array([c.positions for c in commands])
    steps = np.abs(np.diff(np.vstack([[0.0, 0.0], positions]), axis=0))
    assert np.all(steps <= np.array([1.0, 2.0]) * TICK + 1e-12)  # max step per tick
    assert np.all(positions[:, 0] <= 0.5) and np.all(positions[:, 1] >= -1.0)
    np.testing.assert_allclose(positions[-1], [0.5, -1.0])  # reaches the position limits, no further
    assert all(c.clamped for c in commands) and executor.stats.commands_clamped == len(commands)


def test_no_command_before_a_joint_position_is_known_when_speed_is_limited():
    executor = ActionChunkExecutor(2, ControlConfig(max_velocity=[1.0]), control_rate_hz=RATE)
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    cmd = executor.tick(0.0)
    assert not cmd.publish and cmd.positions is None and "no joint position" in cmd.reason
    executor.observe_position([np.nan, 0.0])  # a bad joint state is not a position
    assert not executor.tick(0.02).publish
    executor.observe_position(trajectory(0.0))
    assert executor.tick(0.04).publish


def test_limit_settings_are_validated():
    with pytest.raises(ValueError, match="max_velocity: expected 0, 1 or 2 values"):
        JointLimits.build(2, max_velocity=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="must not exceed"):
        JointLimits.build(2, lower=[1.0], upper=[0.0])
    with pytest.raises(ValueError, match="positive"):
        JointLimits.build(2, max_velocity=[0.0])
    with pytest.raises(ValueError, match="prefetch_threshold"):
        ActionChunkExecutor(2, ControlConfig(prefetch_threshold=1.5))


# ----- bad chunks and safety states -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_chunk_is_rejected_and_the_last_safe_position_held(bad):
    executor = make("linear")
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    commands = run(executor, 0.0, 0.3)
    safe = commands[-1].positions
    poisoned = chunk_at(0.25)
    poisoned[7, 1] = bad
    report = executor.add_chunk(poisoned, stamp=0.25, dt=DT, now=0.3)
    assert not report.accepted and "non-finite" in report.reason and "[7, 1]" in report.reason
    after = run(executor, 0.3, 0.6)
    assert not any(c.publish for c in after)
    assert all(np.array_equal(c.positions, safe) for c in after)
    assert executor.stats.chunks_rejected == 1
    # A good chunk brings it back, starting from the held position (no jump).
    executor.add_chunk(chunk_at(0.55), stamp=0.55, dt=DT, now=0.6)
    resumed = run(executor, 0.6, 0.7)
    assert resumed[0].publish and np.abs(resumed[0].positions - safe).max() < 0.05


def test_malformed_chunks_are_rejected_with_a_reason():
    executor = make()
    assert "shape" in executor.add_chunk(np.zeros((5, 3)), 0.0, DT, 0.0).reason
    assert "shape" in executor.add_chunk(np.zeros(5), 0.0, DT, 0.0).reason
    assert "dt must be positive" in executor.add_chunk(np.zeros((5, 2)), 0.0, 0.0, 0.0).reason
    assert "not numeric" in executor.add_chunk([["a", "b"]], 0.0, DT, 0.0).reason
    assert executor.stats.chunks_rejected == 4 and executor.state is ExecState.IDLE


def test_stale_inputs_hold_the_last_safe_position_and_issue_nothing():
    executor = make("linear")
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    commands = run(executor, 0.0, 0.3)
    safe = commands[-1].positions
    executor.set_stale(True, "camera 'base' is 0.8 s old")
    stale = run(executor, 0.3, 0.6)
    assert all(not c.publish and c.state is ExecState.STALE_INPUT for c in stale)
    assert all(np.array_equal(c.positions, safe) for c in stale)
    assert "camera 'base'" in stale[0].reason
    # A chunk that was in flight when inputs went stale is dropped.
    report = executor.add_chunk(chunk_at(0.2), stamp=0.2, dt=DT, now=0.5)
    assert not report.accepted and "stale-input" in report.reason
    # Recovery: idle until a fresh chunk, which starts from where the robot is.
    executor.observe_position(safe + 0.01)
    executor.set_stale(False)
    assert executor.state is ExecState.IDLE and executor.should_request(0.6)
    assert not executor.tick(0.6).publish
    executor.add_chunk(chunk_at(0.6), stamp=0.6, dt=DT, now=0.62)
    first = executor.tick(0.62)
    assert first.publish and np.abs(first.positions - (safe + 0.01)).max() < 0.05


def test_estop_is_latched_and_pause_resume():
    executor = make()
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    assert executor.tick(0.0).publish
    executor.set_estop(True)
    assert executor.state is ExecState.ESTOPPED and not executor.tick(0.02).publish
    executor.resume()  # resume cannot override an engaged e-stop
    assert executor.state is ExecState.ESTOPPED
    executor.set_estop(False)
    assert executor.state is ExecState.PAUSED and not executor.tick(0.04).publish
    executor.resume()
    assert executor.state is ExecState.IDLE
    executor.add_chunk(chunk_at(0.06), stamp=0.06, dt=DT, now=0.06)
    assert executor.tick(0.06).publish and executor.state is ExecState.RUNNING
    executor.pause()
    assert not executor.tick(0.08).publish and executor.state is ExecState.PAUSED


def test_answers_to_requests_from_before_a_stop_or_reset_are_dropped():
    executor = make("latest")
    first = executor.request_started(0.0)
    executor.pause()  # the inference keeps running elsewhere
    executor.resume()
    second = executor.request_started(0.1)
    late = executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.2, request_id=first)
    assert not late.accepted and "before a stop or reset" in late.reason
    assert executor.inflight_since == 0.1  # the live request is still awaited
    executor.request_failed("old failure", request_id=first)
    assert executor.inflight_since == 0.1
    assert executor.add_chunk(chunk_at(0.1), stamp=0.1, dt=DT, now=0.2, request_id=second).accepted
    assert executor.tick(0.2).publish
    # reset_plan: hold still, drop what is in flight, restart from the measured position.
    third = executor.request_started(0.3)
    executor.observe_position([0.7, -0.7])
    executor.reset_plan()
    assert executor.state is ExecState.IDLE and not executor.tick(0.3).publish
    assert not executor.add_chunk(chunk_at(0.3), stamp=0.3, dt=DT, now=0.35, request_id=third).accepted
    fourth = executor.request_started(0.36)
    executor.add_chunk(np.tile([[0.7, -0.7]], (50, 1)), stamp=0.36, dt=DT, now=0.4, request_id=fourth)
    np.testing.assert_allclose(executor.tick(0.4).positions, [0.7, -0.7])


def test_an_inference_in_flight_survives_a_blip_of_stale_inputs_but_not_a_pause():
    # Its observation was fresh when taken; only a pause or e-stop makes its answer unwanted.
    executor = make("latest")
    first = executor.request_started(0.0)
    executor.set_stale(True, "camera 'base' is 0.6 s old")
    executor.set_stale(False)
    assert executor.inflight_since == 0.0 and not executor.should_request(0.1)  # still awaited: no second one
    report = executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.2, request_id=first)
    assert report.accepted
    # Still stale when it arrives: refused (nothing is commanded on stale inputs), and the next request allowed.
    second = executor.request_started(0.3)
    executor.set_stale(True, "camera 'base' is 0.6 s old")
    report = executor.add_chunk(chunk_at(0.3), stamp=0.3, dt=DT, now=0.4, request_id=second)
    assert not report.accepted and "stale-input" in report.reason
    executor.set_stale(False)
    assert executor.should_request(0.5)
    # A pause during stale inputs still abandons the request, even though the executor was already stopped.
    third = executor.request_started(0.5)
    executor.set_stale(True, "camera 'base' is 0.6 s old")
    executor.pause()
    executor.set_stale(False)
    executor.resume()
    late = executor.add_chunk(chunk_at(0.5), stamp=0.5, dt=DT, now=0.6, request_id=third)
    assert not late.accepted and "before a stop or reset" in late.reason


INDEXED = np.arange(100, dtype=np.float64).reshape(50, 2)  # action i = [2i, 2i + 1]: the index is readable


def played_out(until: float, **overrides) -> ActionChunkExecutor:
    """An executor that ran INDEXED from 0 s (last action at 0.98 s) and has held since, until `until`."""
    executor = make("latest", **overrides)
    assert executor.add_chunk(INDEXED, stamp=0.0, dt=DT, now=0.0).accepted
    run(executor, 0.0, until)
    return executor


def test_a_chunk_arriving_after_the_plan_ran_out_plays_on_from_where_the_robot_stopped():
    executor, actions = played_out(1.3), INDEXED
    # Observed at 0.5 s (the plan's action 25), answered at 1.3 s: the robot held action 49 since 0.98 s. The
    # new chunk's action i is due at 0.5 + i * DT, so its first action after 0.98 s is i = 25 (at 1.0 s).
    report = executor.add_chunk(actions + 1000, stamp=0.5, dt=DT, now=1.3)
    assert report.accepted and report.skipped == 25  # the ones the old plan moved through, not the held ones
    np.testing.assert_allclose(executor.tick(1.3).positions, actions[25] + 1000)
    np.testing.assert_allclose(executor.tick(1.3 + 4 * DT).positions, actions[29] + 1000)
    assert executor.stats.extra["resumed_chunks"] == 1
    # Off: the actions due while the robot held are skipped (0.8 s after 0.5 s: action 40).
    executor = played_out(1.3, resume_where_held=False)
    assert executor.add_chunk(actions + 1000, stamp=0.5, dt=DT, now=1.3).skipped == 40
    np.testing.assert_allclose(executor.tick(1.3).positions, actions[40] + 1000)


def test_a_chunk_observed_after_the_plan_ran_out_starts_at_its_first_action():
    # The robot stood still from before the observation to the arrival: like a synchronous policy's chunk.
    executor, actions = played_out(1.5), INDEXED
    assert executor.add_chunk(actions + 1000, stamp=1.1, dt=DT, now=1.5).skipped == 0
    np.testing.assert_allclose(executor.tick(1.5).positions, actions[0] + 1000)


def test_a_chunk_whose_actions_all_fell_due_while_the_robot_moved_is_still_refused():
    executor = make("latest")
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)  # moves until 0.98 s
    run(executor, 0.0, 1.2)
    report = executor.add_chunk(chunk_at(0.5, horizon=10), stamp=0.5, dt=DT, now=1.2)  # due 0.5 .. 0.68 s
    assert not report.accepted and "past its end" in report.reason


@pytest.mark.parametrize("resume", [True, False])
def test_a_policy_slower_than_half_a_chunk_pauses_the_robot_without_skipping_motion(resume: bool):
    # One inference at a time, 0.7 s a chunk of 1 s of motion, each observed when the one before arrives: every
    # other plan runs out before its successor arrives. The policy drives both joints along a ramp at 1 unit/s
    # from wherever it observes the robot. Resuming where the robot stopped keeps every command within a tick's
    # motion of the one before, and holds less; skipping jumps over the motion that fell due while it held.
    speed, latency = 1.0, 0.7
    executor = make("latest", resume_where_held=resume)

    def ramp_from(position: np.ndarray) -> np.ndarray:
        return position + speed * DT * np.arange(50)[:, None]

    t, commands = 0.0, []
    executor.add_chunk(ramp_from(trajectory(0.0)), stamp=0.0, dt=DT, now=0.0)
    for _ in range(12):
        cycle = run(executor, t, t + latency)
        commands += cycle
        observed, t = cycle[0].positions, t + latency  # the observation was taken as this cycle began
        assert executor.add_chunk(ramp_from(observed), stamp=t - latency, dt=DT, now=t).accepted
    steps = np.abs(np.diff(np.array([c.positions for c in commands]), axis=0)).max(axis=1)
    held = executor.stats.extra["held_s"]
    if resume:
        assert steps.max() <= speed * TICK * 1.01, "a resumed plan moves on from where the robot held"
        assert held < 0.35 * 12 * latency
    else:
        assert steps.max() > speed * TICK * 5, "skipping the held actions makes the command jump"
        assert held > 0.35 * 12 * latency


def test_dry_run_computes_commands_but_publishes_none():
    executor = ActionChunkExecutor(2, ControlConfig(max_velocity=[]), control_rate_hz=RATE, dry_run=True)
    executor.observe_position(trajectory(0.0))
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    commands = run(executor, 0.0, 1.0)
    assert all(c.positions is not None and not c.publish for c in commands)
    assert "dry run" in commands[0].reason
    assert executor.stats.commands_computed == len(commands) and executor.stats.commands_published == 0


def test_exhausted_chunk_holds_its_last_action():
    executor = make("latest")
    executor.add_chunk(chunk_at(0.0, horizon=10), stamp=0.0, dt=DT, now=0.0)
    cmd = executor.tick(0.5)
    np.testing.assert_allclose(cmd.positions, chunk_at(0.0, horizon=10)[-1])
    assert cmd.publish and "exhausted" in cmd.reason and executor.should_request(0.5)


def test_concurrent_chunks_and_ticks_stay_consistent():
    executor = make("ensemble")
    errors = []

    def producer() -> None:
        try:
            for k in range(200):
                executor.add_chunk(chunk_at(k * 0.01), stamp=k * 0.01, dt=DT, now=k * 0.01)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=producer)
    thread.start()
    for k in range(400):
        cmd = executor.tick(k * 0.005)
        assert cmd.positions is None or np.all(np.isfinite(cmd.positions))
    thread.join()
    assert not errors and executor.stats.chunks_accepted == 200


def test_preview_is_the_plan_at_the_actions_ahead_within_the_limits():
    # What follow_joint_trajectory sends: the newest chunk's actions still ahead, as the ticks would command them.
    cfg = ControlConfig(blending="latest", max_velocity=[1.0], position_upper=[0.35])
    ex = ActionChunkExecutor(1, cfg, control_rate_hz=50.0)
    ex.observe_position([0.0])
    assert ex.preview(0.0) is None  # no plan yet
    actions = np.linspace(0.0, 0.5, 11)[:, None]  # 0.05 per 0.1 s: 0.5 units/s, within the speed limit
    assert ex.add_chunk(actions, stamp=0.0, dt=0.1, now=0.25).accepted
    times, points = ex.preview(0.25)
    # Actions 3..10 are ahead of t = 0.25 (at 0.3 .. 1.0 s).
    np.testing.assert_allclose(times, np.arange(3, 11) * 0.1 - 0.25, atol=1e-12)
    # From the known position 0 the speed limit (1 unit/s) binds first, then the plan, then position_upper.
    expected = np.minimum(np.minimum(actions[3:, 0], 1.0 * (times + 0.0)), 0.35)
    np.testing.assert_allclose(points[:, 0], expected, atol=1e-12)
    ex.pause()
    assert ex.preview(0.25) is None  # nothing may be commanded while stopped


# ----- keeping up -------------------------------------------------------------------------------------------


def test_a_plan_that_runs_out_before_the_next_chunk_is_counted_and_explained():
    executor = make()
    # 50 actions 0.02 s apart: 1 s of motion, so chunks must arrive within 0.5 s of their observation.
    assert executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.8).accepted
    run(executor, 0.8, 1.5)
    # The plan ended at 0.98 s (its last action's time): from then on the robot holds.
    held = executor.tick(1.5)
    assert "holding its last action" in held.reason
    assert executor.stats.extra["plan_ran_out"] == 1
    assert executor.add_chunk(chunk_at(0.8), stamp=0.8, dt=DT, now=1.6).accepted
    run(executor, 1.6, 1.7)
    # Held from the first tick past 0.98 s to the first tick with the new plan (1.6 s): one tick of slack.
    assert executor.stats.extra["held_s"] == pytest.approx(1.6 - 0.98, abs=TICK + 1e-9)
    why = executor.keeping_up()
    assert "ran out 1 time(s)" in why
    assert "0.80 s after their observation" in why and "half a chunk's motion (0.50 s)" in why
    # What can be done, neighbours on the cores included (each costs the policy more than its share of the CPU).
    assert "faster policy.precision" in why and "fewer busy processes on the policy's cores" in why


def test_chunks_within_the_plan_leave_nothing_to_explain():
    executor = make()
    assert executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.3).accepted
    for k in range(1, 6):  # each chunk observed when the one before arrived, 0.3 s later: within 0.5 s
        run(executor, 0.3 * k, 0.3 * (k + 1))
        assert executor.add_chunk(chunk_at(0.3 * k), stamp=0.3 * k, dt=DT, now=0.3 * (k + 1)).accepted
    run(executor, 1.8, 2.0)
    assert "plan_ran_out" not in executor.stats.extra
    assert executor.keeping_up() == ""


def test_a_stop_is_not_counted_as_the_plan_running_out():
    executor = make()
    assert executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.1).accepted
    run(executor, 0.1, 0.5)
    executor.set_estop(True)
    run(executor, 0.5, 2.0)
    assert "plan_ran_out" not in executor.stats.extra


def test_motion_counts_report_holds_including_the_one_under_way():
    executor, actions = played_out(1.5), INDEXED  # held from the first tick past 0.98 s
    counts = executor.motion_counts(1.5)
    assert counts["plan_ran_out"] == 1 and counts["chunks_accepted"] == 1
    assert counts["held_s"] == pytest.approx(1.5 - 0.98, abs=TICK + 1e-9)
    executor.add_chunk(actions, stamp=0.5, dt=DT, now=1.5)  # resumes where the robot stopped
    run(executor, 1.5, 1.6)
    later = executor.motion_counts(3.0)  # the plan runs again: the finished hold only
    assert later["resumed_chunks"] == 1 and later["held_s"] == pytest.approx(counts["held_s"], abs=TICK + 1e-9)


@pytest.mark.parametrize("latency", [0.6, 0.7, 0.9, 1.3, 2.0])
def test_the_held_share_matches_what_the_executor_does(latency: float):
    # The loop the node runs, one inference at a time: ask when the executor says so, answer `latency` later from
    # where the robot was. 1 s chunks; what the executor held over 40 s against held_share's estimate.
    executor, seconds = make("latest"), 40.0
    pending, last = None, trajectory(0.0)
    for i in range(round(seconds / TICK)):
        t = i * TICK
        if pending is not None and t >= pending[0] - 1e-9:
            _, stamp, observed, request = pending
            executor.add_chunk(observed + DT * np.arange(50)[:, None], stamp, DT, t, request_id=request)
            pending = None
        if pending is None and executor.should_request(t):
            pending = (t + latency, t, last, executor.request_started(t))
        command = executor.tick(t)
        last = command.positions if command.positions is not None else last
    measured = executor.motion_counts(seconds)["held_s"] / seconds
    assert measured == pytest.approx(held_share(latency, 50, DT), abs=0.04)
    assert held_share(0.5, 50, DT) == 0.0  # half the motion or less: never holds
