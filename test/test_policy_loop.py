"""PolicyLoop, the policy node's work without ROS: lifecycle gating, inference to chunks to commands, stale-input
reasons, and counters that stay exact when several threads update them. A real tiny policy, a hand-moved clock."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
import torch
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String

from omni_ros.backends.factory import load_policy
from omni_ros.config import load_config
from omni_ros.control.executor import ExecState
from omni_ros.nodes.policy_loop import RATE_WINDOW_S, Chunk, Counters, PolicyLoop
from omni_ros.ros_convert import rgb_to_image, sec_to_stamp

JOINTS = ["joint_1", "joint_2", "joint_3"]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def config():
    cfg = load_config("config/sim.yaml")
    cfg.policy.preset = "tiny"
    cfg.robot.joint_names = list(JOINTS)
    cfg.robot.dry_run = False
    return cfg


@pytest.fixture(scope="module")
def policy(config):
    return load_policy(config.policy, camera_names=[c.name for c in config.topics.cameras], state_dim=3, action_dim=3)


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Run:
    """A loop whose outputs are collected; its control thread is not started: the test ticks it."""

    def __init__(self, config, policy) -> None:
        self.clock = Clock()
        self.chunks: list[Chunk] = []
        self.commands: list[tuple[np.ndarray, float]] = []
        self.loop = PolicyLoop(
            config,
            policy,
            self.clock,
            self.chunks.append,
            lambda q, now: self.commands.append((q.copy(), now)),
            logging.getLogger("test_policy_loop"),
        )
        self.cameras = [(c.name, c.compressed) for c in config.topics.cameras]

    def send(self, encoding: str = "rgb8") -> None:
        for name, compressed in self.cameras:
            msg = rgb_to_image(np.zeros((48, 48, 3), np.uint8), Image(), stamp=self.clock())
            msg.encoding = encoding
            self.loop.image(name, msg, compressed)
        js = JointState(name=list(JOINTS), position=[0.0, 0.1, 0.2])
        sec_to_stamp(self.clock(), js.header.stamp)
        self.loop.joint_state(js)

    def wait_for(self, predicate, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return False


class Gated:
    """The real policy, whose inferences wait until the test opens the gate: what a test reads right after the
    tick that started an inference is then that inference's state, however fast the machine (an open gate: the
    real policy as it is)."""

    def __init__(self, policy) -> None:
        self.policy, self.metadata, self.spec = policy, policy.metadata, policy.spec
        self.rtc_methods = policy.rtc_methods
        self.gate = threading.Event()

    def infer(self, obs, **kwargs):
        if not self.gate.wait(timeout=60):
            raise TimeoutError("the test never opened the gate")
        return self.policy.infer(obs, **kwargs)


@pytest.fixture
def gated(policy):
    return Gated(policy)


@pytest.fixture
def run(config, gated):
    r = Run(config, gated)
    yield r
    gated.gate.set()
    r.loop.close()


def test_inactive_loop_neither_infers_nor_commands_and_refuses_resume(run, gated):
    gated.gate.set()  # an inference, if one wrongly started, would finish and command
    run.loop.prompt(String(data="reach the red block"))
    run.send()
    run.loop.tick()
    assert run.loop.executor.state is ExecState.PAUSED and run.loop.executor.inflight_since is None
    assert run.loop.resume() == (False, "node is not active")
    assert run.loop.pause() == (True, "paused")
    time.sleep(0.2)
    assert not run.chunks and not run.commands


def test_active_loop_turns_inputs_into_a_chunk_then_commands(run, gated):
    run.loop.prompt(String(data="reach the red block"))
    run.loop.activate()
    run.send()
    run.loop.tick()  # starts the first inference (held at the gate)
    assert run.loop.executor.inflight_since == run.clock()
    run.loop.tick()
    assert not run.commands  # nothing to command before the first chunk
    gated.gate.set()
    assert run.wait_for(lambda: run.chunks)
    chunk = run.chunks[0]
    assert chunk.chunk_id == 0 and chunk.actions.shape[1] == 3 and chunk.inference_s > 0
    assert chunk.stamp == run.clock()  # the observation it answers
    for _ in range(5):
        run.clock.t += 0.02
        run.send()
        run.loop.tick()
    assert len(run.commands) == 5 and all(np.all(np.isfinite(q)) for q, _ in run.commands)
    assert [now for _, now in run.commands] == pytest.approx([100.0 + 0.02 * k for k in range(1, 6)])
    health = run.loop.counters.health(run.clock())
    assert health.counts["commands"] == 5 and health.counts["chunks"] >= 1 and health.counts["errors"] == 0
    assert health.achieved_rate == pytest.approx(5 / RATE_WINDOW_S)
    assert health.last_inference_s == chunk.inference_s
    # Deactivated: commands stop at once.
    run.loop.deactivate()
    run.clock.t += 0.02
    run.loop.tick()
    assert len(run.commands) == 5


def test_rejected_frames_are_counted_and_named_in_the_stale_reason(run, gated):
    run.loop.prompt(String(data="reach the red block"))
    run.loop.activate()
    run.send(encoding="16UC1")
    run.loop.tick()
    assert run.loop.executor.state is ExecState.STALE_INPUT
    first = run.cameras[0][0]
    assert run.loop.exec_reason == (
        f"no frame yet from camera '{first}' (last frame rejected: unsupported image encoding '16UC1'; "
        "supported: rgb8, bgr8, rgba8, bgra8, mono8)"
    )
    assert run.loop.counters.health(run.clock()).counts["dropped_frames"] == len(run.cameras)
    assert run.loop.executor.inflight_since is None and not run.commands
    # Good frames again: the gate opens and inference starts.
    run.send()
    run.loop.tick()
    assert run.loop.executor.state is not ExecState.STALE_INPUT and run.loop.executor.inflight_since == run.clock()
    gated.gate.set()
    assert run.wait_for(lambda: run.chunks)


def test_counters_stay_exact_under_concurrent_updates():
    counters = Counters()
    n, threads = 5000, 4

    def work(k: int) -> None:
        for i in range(n):
            counters.dropped_frame()
            counters.command(10.0 + i * 1e-4)
            counters.chunk(0.01 * k)
            counters.failure(f"error {k}")

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    health = counters.health(10.5)
    total = n * threads
    assert health.counts == {"chunks": total, "commands": total, "dropped_frames": total, "errors": total}
    # Failures since the last success: each thread ends with one, after every thread's last success but its own.
    assert 1 <= health.consecutive_errors <= threads and health.last_error.startswith("error ")
    assert health.achieved_rate == pytest.approx(total / RATE_WINDOW_S)
    # Commands older than the window leave the rate, not the count: at 12.25005 s those from 10.25005 s on stay
    # (i = 2501 .. 4999 of each thread).
    later = counters.health(10.0 + RATE_WINDOW_S + 0.25005)
    assert later.counts["commands"] == total
    assert later.achieved_rate == pytest.approx(2499 * threads / RATE_WINDOW_S)
    counters.chunk(0.5)
    assert counters.health(10.5).consecutive_errors == 0 and counters.health(10.5).last_inference_s == 0.5


def test_with_rtc_blending_the_second_inference_continues_the_first_chunk(config, policy):
    import dataclasses

    from omni_ros.policy.rtc import RtcRequest

    asked: list = []

    class Spy:
        """The real policy, recording what each inference was asked to continue."""

        metadata, spec, rtc_methods = policy.metadata, policy.spec, policy.rtc_methods

        def infer(self, obs, *, rtc=None):
            asked.append(rtc)
            return policy.infer(obs, rtc=rtc)

    cfg = dataclasses.replace(config, control=dataclasses.replace(config.control, blending="rtc", prefetch_threshold=1))
    r = Run(cfg, Spy())
    try:
        r.loop.prompt(String(data="reach the red block"))
        r.loop.activate()
        r.send()
        r.loop.tick()
        assert r.wait_for(lambda: r.chunks)
        dt = policy.metadata.action_dt
        r.clock.t += 2 * dt  # two actions of the first chunk later: the prefetch asks again at once
        r.send()
        r.loop.tick()
        assert r.wait_for(lambda: len(r.chunks) == 2)
        first, second = asked
        assert first is None and isinstance(second, RtcRequest)
        # The plan handed over is the first chunk at the second observation's action times; d comes from
        # the measured latency of the first chunk.
        plan = r.chunks[0].actions
        shift = 2
        np.testing.assert_allclose(second.actions[: len(plan) - shift], plan[shift:], atol=1e-5)
        assert second.method == cfg.control.rtc.method and second.inference_delay >= 0
    finally:
        r.loop.close()


def test_an_observation_answered_too_late_waits_for_a_newer_one(config, gated):
    # The inputs stop updating (a starved robot process) while the answer to the latest observation came back past
    # its chunk's end: asking again on that observation would only answer it later still, in a loop that takes the
    # CPU from the robot. The loop waits for a newer observation.
    import dataclasses

    # resume_where_held off: with it, this answer would play its last action, due after the first plan's end.
    control = dataclasses.replace(
        config.control, prefetch_threshold=1.0, camera_stale_s=30.0, state_stale_s=30.0, resume_where_held=False
    )
    r = Run(dataclasses.replace(config, control=control), gated)
    try:
        r.loop.prompt(String(data="reach the red block"))
        r.loop.activate()
        r.send()
        gated.gate.set()
        r.loop.tick()
        assert r.wait_for(lambda: len(r.chunks) == 1)
        horizon, dt = r.chunks[0].actions.shape[0], gated.metadata.action_dt
        gated.gate.clear()
        r.clock.t += dt  # one action later the prefetch asks about a new observation (held at the gate)
        r.send()
        r.loop.tick()
        observed = r.clock()
        assert r.loop.executor.inflight_since == observed
        r.clock.t = observed + (horizon + 2) * dt  # it answers after its own last action: dropped
        gated.gate.set()
        assert r.wait_for(lambda: len(r.chunks) == 2)
        assert r.loop.executor.stats.chunks_rejected == 1 and "past its end" in r.loop.executor.stats.last_reject_reason
        for _ in range(5):  # no newer observation: no inference
            r.loop.tick()
            r.clock.t += dt
        time.sleep(0.2)
        assert r.loop.executor.inflight_since is None and len(r.chunks) == 2
        r.send()  # a newer observation: asked at once
        r.loop.tick()
        assert r.loop.executor.inflight_since == r.clock()
        assert r.wait_for(lambda: len(r.chunks) == 3)
    finally:
        gated.gate.set()
        r.loop.close()


def test_an_abandoned_inference_is_waited_for_not_queued_behind(run, gated):
    # A pause abandons the inference in flight, which still holds the one inference thread. Submitting the next
    # one then would queue it, and it would run on the observation of now after the wait (on a compiling policy,
    # minutes): the loop waits, and the next inference reads the newest observation when it can start.
    calls: list[float] = []
    infer = gated.infer
    gated.infer = lambda obs, **kw: (calls.append(run.clock()), infer(obs, **kw))[1]
    run.loop.prompt(String(data="reach the red block"))
    run.loop.activate()
    run.send()
    run.loop.tick()
    assert run.wait_for(lambda: len(calls) == 1)  # held at the gate
    run.loop.executor.pause()
    run.loop.executor.resume()
    for _ in range(3):  # inputs fresh, no request in flight: the executor asks, the loop waits
        run.clock.t += 0.02
        run.send()
        run.loop.tick()
    assert run.loop.executor.inflight_since is None
    gated.gate.set()
    assert run.wait_for(lambda: len(run.chunks) == 1)  # the abandoned one's answer, dropped
    assert run.loop.executor.stats.chunks_rejected == 1
    assert "before a stop or reset" in run.loop.executor.stats.last_reject_reason
    run.clock.t += 0.02
    run.send()
    run.loop.tick()
    assert run.wait_for(lambda: len(run.chunks) == 2)
    assert calls == [100.0, run.clock()]  # two inferences, the second on the newest observation
    assert run.loop.executor.stats.chunks_accepted == 1


def test_a_blip_of_stale_inputs_keeps_the_inference_in_flight(config, gated):
    # 2 busy cores can delay the node's callbacks past camera_stale_s for a moment: the executor stops commanding,
    # but the inference of a fresh observation is kept, and its chunk runs once the inputs are fresh again.
    r = Run(config, gated)
    try:
        r.loop.prompt(String(data="reach the red block"))
        r.loop.activate()
        r.send()
        r.loop.tick()
        observed = r.clock()
        assert r.loop.executor.inflight_since == observed
        r.clock.t += config.control.camera_stale_s + 0.1  # no message for longer than camera_stale_s
        r.loop.tick()
        assert r.loop.executor.state is ExecState.STALE_INPUT and r.loop.executor.inflight_since == observed
        r.send()
        r.loop.tick()  # fresh again: the same inference is still awaited, no second one
        assert r.loop.executor.state is not ExecState.STALE_INPUT and r.loop.executor.inflight_since == observed
        gated.gate.set()
        assert r.wait_for(lambda: len(r.chunks) == 1)
        assert r.loop.executor.stats.chunks_accepted == 1 and r.loop.executor.stats.chunks_rejected == 0
    finally:
        gated.gate.set()
        r.loop.close()
