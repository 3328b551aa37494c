"""The chunk executor under `blending: rtc`: the plan handed to the policy, the delay, and the switch."""

from __future__ import annotations

import numpy as np
import pytest

from omni_ros.config import ConfigError, OmniConfig
from omni_ros.control.config import ControlConfig, RtcConfig
from omni_ros.control.executor import ActionChunkExecutor, check_rtc_support
from omni_ros.typed_config import FieldError, from_dict

DT = 0.02  # action spacing
RATE = 50.0
TICK = 1.0 / RATE
H = 50


def trajectory(t):
    t = np.asarray(t, dtype=np.float64)
    return np.stack([np.sin(t), 0.5 * np.cos(2 * t)], axis=-1)


def chunk_at(t0: float, offset: float = 0.0) -> np.ndarray:
    return trajectory(t0 + DT * np.arange(H)) + offset


def make(**rtc) -> ActionChunkExecutor:
    config = ControlConfig(blending="rtc", max_velocity=[], rtc=RtcConfig(**rtc))
    executor = ActionChunkExecutor(2, config, control_rate_hz=RATE)
    executor.observe_position(trajectory(0.0))
    return executor


def run(executor, start, stop):
    ticks = np.arange(round((stop - start) / TICK)) * TICK + start
    return [(float(t), executor.tick(float(t))) for t in ticks]


def started(executor, stamp):
    request_id = executor.request_started(stamp)
    return request_id, executor.rtc_request(stamp)


def hand_over(executor, stamp):
    """The old chunk from 0, then one requested at `stamp` that disagrees with it by 0.3, arriving 2 ticks later."""
    old = chunk_at(0.0)
    executor.add_chunk(old, stamp=0.0, dt=DT, now=0.0)
    run(executor, 0.0, stamp)
    request_id, _ = started(executor, stamp)
    new = chunk_at(stamp, offset=0.3)
    executor.add_chunk(new, stamp=stamp, dt=DT, now=stamp + 2 * TICK, request_id=request_id)
    return old, new


def test_no_plan_means_no_rtc_request_and_other_modes_never_make_one():
    executor = make()
    executor.request_started(0.0)
    assert executor.rtc_request(0.0) is None  # nothing to continue: the first chunk is sampled plainly
    linear = ActionChunkExecutor(2, ControlConfig(blending="linear", max_velocity=[]), RATE)
    linear.observe_position(trajectory(0.0))
    linear.add_chunk(chunk_at(0.0), 0.0, DT, 0.0)
    linear.request_started(0.3)
    assert linear.rtc_request(0.3) is None


def test_the_request_holds_the_plan_at_the_new_chunks_action_times():
    executor = make(inference_delay=4, schedule="exp", max_guidance_weight=7.0, method="inpaint")
    old = chunk_at(0.0)
    executor.add_chunk(old, stamp=0.0, dt=DT, now=0.0)
    run(executor, 0.0, 0.5)  # past the start-up fade from the measured position
    _, rtc = started(executor, 0.61)  # between two actions of the old chunk
    rows = int(np.count_nonzero(0.61 + DT * np.arange(H) <= (H - 1) * DT + 1e-9))
    assert rtc.actions.shape == (rows, 2) and rows < H
    expected = [0.5 * (old[k] + old[k + 1]) for k in range(30, 30 + rows)]  # stamp 0.61 = action 30.5
    np.testing.assert_allclose(rtc.actions, expected, atol=1e-9)
    assert rtc.execution_horizon == H - rows
    assert (rtc.inference_delay, rtc.schedule, rtc.max_guidance_weight, rtc.method) == (4, "exp", 7.0, "inpaint")


def test_the_first_d_actions_run_from_the_old_chunk_then_the_new_one():
    executor = make(inference_delay=5, switch_fade_s=0.0)
    old = chunk_at(0.0)
    executor.add_chunk(old, stamp=0.0, dt=DT, now=0.0)
    run(executor, 0.0, 0.5)
    request_id, rtc = started(executor, 0.5)
    assert rtc.inference_delay == 5
    # A new chunk that disagrees with the old one everywhere arrives early (after 2 of its 5 actions) ...
    new = chunk_at(0.5, offset=0.3)
    report = executor.add_chunk(new, stamp=0.5, dt=DT, now=0.54, request_id=request_id)
    assert report.accepted
    commands = run(executor, 0.54, 0.8)
    switch = 0.5 + 5 * DT
    for t, cmd in commands:
        source = old if t < switch - 1e-9 else new
        u = t / DT if source is old else (t - 0.5) / DT
        i = round(u)
        np.testing.assert_allclose(cmd.positions, source[i], atol=1e-9, err_msg=f"t={t}")
    assert any(t < switch - 1e-9 for t, _ in commands) and any(t >= switch for t, _ in commands)


def test_with_a_fade_the_old_plan_runs_d_actions_then_hands_over_smoothly():
    executor = make(inference_delay=5, switch_fade_s=0.1)
    old, new = hand_over(executor, 0.5)
    commands = dict(run(executor, 0.54, 0.9))
    switch, fade = 0.6, 0.1
    for t, cmd in commands.items():
        i_old, i_new = round(t / DT), round((t - 0.5) / DT)
        a = min(1.0, max(0.0, (t - switch) / fade))
        np.testing.assert_allclose(cmd.positions, (1 - a) * old[i_old] + a * new[i_new], atol=1e-9, err_msg=f"t={t}")
    steps = np.abs(np.diff([c.positions for c in commands.values()], axis=0)).max()
    assert steps < 0.3 / 5 + 0.03  # the 0.3 disagreement spread over the fade's 5 ticks


def test_a_late_chunk_switches_on_arrival():
    executor = make(inference_delay=2, switch_fade_s=0.0)
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    run(executor, 0.0, 0.5)
    request_id, _ = started(executor, 0.5)
    new = chunk_at(0.5, offset=0.3)
    executor.add_chunk(new, stamp=0.5, dt=DT, now=0.6, request_id=request_id)  # 5 actions late, d said 2
    np.testing.assert_allclose(executor.tick(0.6).positions, new[5], atol=1e-9)


def test_the_delay_is_estimated_from_recent_latencies():
    executor = make(latency_window=3)
    assert executor.inference_delay(DT) == 0
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    stamp = 0.0
    for latency in (0.1, 0.14, 0.06, 0.06, 0.06):
        stamp += 0.2
        request_id, _rtc = started(executor, stamp)
        executor.add_chunk(chunk_at(stamp), stamp=stamp, dt=DT, now=stamp + latency, request_id=request_id)
        if latency == 0.14:
            assert executor.inference_delay(DT) == 7  # ceil(max recent latency / dt): 0.14 s = 7 actions
    # The window forgot 0.1 and 0.14: three chunks of 0.06 s are 3 actions.
    assert executor.inference_delay(DT) == 3
    assert executor.rtc_request(stamp + 0.01).inference_delay == 3
    fixed = make(inference_delay=9)
    assert fixed.inference_delay(DT) == 9


def test_an_answer_expected_after_the_plan_ends_is_sampled_fresh_not_refused():
    """A delay estimate past the plan's last action (a slow first chunk in the latency window) asks for a fresh
    chunk: a request the policy must refuse ("inference_delay is longer than the chunk") would fail every tick."""
    executor = make(latency_window=2)
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    request_id, _ = started(executor, 0.1)
    executor.add_chunk(chunk_at(0.1), stamp=0.1, dt=DT, now=0.9, request_id=request_id)  # 0.8 s: 40 actions
    assert executor.inference_delay(DT) == 40
    executor.request_started(0.9)  # the plan (from 0.1) has 10 actions left: the answer comes after them
    assert executor.rtc_request(0.9) is None
    assert executor.stats.extra["rtc_requests_past_plan"] == 1
    # Once the window holds latencies the plan can absorb, the plan is continued again.
    for stamp in (0.92, 0.94):
        request_id, _ = started(executor, stamp)
        executor.add_chunk(chunk_at(stamp), stamp=stamp, dt=DT, now=stamp + 0.1, request_id=request_id)
    executor.request_started(1.1)
    rtc = executor.rtc_request(1.1)
    assert rtc is not None and rtc.inference_delay == 5


def test_a_chunk_requested_without_rtc_enters_through_a_fade():
    executor = make(inference_delay=2)
    executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
    run(executor, 0.0, 0.5)
    executor.request_started(0.5)  # no rtc_request: e.g. a policy call that could not continue the plan
    executor.add_chunk(chunk_at(0.5, offset=0.3), stamp=0.5, dt=DT, now=0.5)
    steps = np.abs(np.diff([c.positions for _, c in run(executor, 0.5, 1.0)], axis=0)).max()
    assert steps < 0.1  # no 0.3 jump: the linear fade


def test_a_stop_forgets_what_the_request_in_flight_was_asked():
    def after_a_stop(asked_rtc: bool):
        executor = make(inference_delay=5)
        executor.add_chunk(chunk_at(0.0), stamp=0.0, dt=DT, now=0.0)
        run(executor, 0.0, 0.5)
        started(executor, 0.5) if asked_rtc else executor.request_started(0.5)
        executor.reset_plan()
        request_id = executor.request_started(0.6)
        report = executor.add_chunk(chunk_at(0.6, offset=0.3), stamp=0.6, dt=DT, now=0.62, request_id=request_id)
        return report, run(executor, 0.62, 1.0)

    report, commands = after_a_stop(asked_rtc=True)
    _, fresh = after_a_stop(asked_rtc=False)
    assert report.accepted and all(c.positions is not None for _, c in commands)
    # Entered as a fresh plan, exactly as if no RTC request had been in flight: not a switch into a forgotten plan.
    np.testing.assert_array_equal([c.positions for _, c in commands], [c.positions for _, c in fresh])
    # A fresh plan starts from the measured position (reset_plan's promise) and fades into the new chunk.
    np.testing.assert_allclose(commands[0][1].positions, trajectory(0.0), atol=1e-9)
    t_end, last = commands[-1]
    np.testing.assert_allclose(last.positions, chunk_at(0.6, offset=0.3)[round((t_end - 0.6) / DT)], atol=1e-9)


def test_rtc_needs_latency_compensation():
    with pytest.raises(FieldError, match="latency_compensation"):
        ControlConfig(blending="rtc", latency_compensation=False)
    with pytest.raises(ConfigError, match=r"control\.rtc\.max_guidance_weight must be >= 0"):
        from_dict(OmniConfig, {"control": {"rtc": {"max_guidance_weight": -1.0}}}, source="x.yaml")


def test_rtc_config_checks_its_ranges():
    with pytest.raises(ValueError, match="max_guidance_weight"):
        RtcConfig(max_guidance_weight=-1.0)
    with pytest.raises(ValueError, match="inference_delay"):
        RtcConfig(inference_delay=-1)
    with pytest.raises(ValueError, match="latency_window"):
        RtcConfig(latency_window=0)
    with pytest.raises(ValueError, match="switch_fade_s"):
        RtcConfig(switch_fade_s=-0.1)


class _Meta:
    backend = "executorch-xnnpack"


class _InpaintOnly:
    metadata = _Meta()
    rtc_methods = ("inpaint",)


class _NoRtc:
    metadata = _Meta()


def test_a_backend_without_the_method_is_refused_at_configure_time():
    guided = ControlConfig(blending="rtc")
    with pytest.raises(ConfigError, match="does not support real-time chunking"):
        check_rtc_support(guided, _NoRtc())
    with pytest.raises(ConfigError, match="it supports: inpaint"):
        check_rtc_support(guided, _InpaintOnly())
    check_rtc_support(ControlConfig(blending="rtc", rtc=RtcConfig(method="inpaint")), _InpaintOnly())
    check_rtc_support(ControlConfig(blending="linear"), _NoRtc())  # nothing asked, nothing checked
