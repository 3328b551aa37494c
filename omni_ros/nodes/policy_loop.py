"""PolicyLoop: what the policy node does, without ROS: inputs in, inference and commands out, on two threads.

The node forwards messages here and publishes what comes out (`on_chunk`, `on_command`). Inside, the
plain-Python pieces every entry point shares: a `MessageFeed` into the `ObservationAssembler` (latest
inputs, staleness), a `Policy` (any backend) and the `ActionChunkExecutor` (prefetch, latency
compensation, blending, limits, safety states). Inference runs on its own thread and the control loop on
another, paced by the monotonic clock, so neither callbacks nor the model can delay a command tick.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from omni_ros.assembler import ObservationAssembler, StaleInput
from omni_ros.config import OmniConfig
from omni_ros.control.executor import ActionChunkExecutor, ExecState
from omni_ros.feed import MessageFeed
from omni_ros.policy.base import Policy
from omni_ros.policy.rtc_request import RtcRequest

if TYPE_CHECKING:
    from omni_ros.policy.pipeline import InferencePipeline

# The achieved command rate is measured over this many seconds.
RATE_WINDOW_S = 2.0


class Log(Protocol):
    def info(self, message: str) -> Any: ...
    def warning(self, message: str) -> Any: ...
    def error(self, message: str) -> Any: ...


@dataclass(frozen=True)
class Chunk:
    """A chunk to publish: (horizon, action_dim) actions answering the observation stamped `stamp`."""

    chunk_id: int
    actions: np.ndarray
    stamp: float
    dt: float
    inference_s: float


@dataclass(frozen=True)
class Health:
    """A consistent copy of the loop's counters, for one status report."""

    counts: dict[str, int]
    achieved_rate: float
    last_inference_s: float
    consecutive_errors: int
    last_error: str


class Counters:
    """Counts and inference health, written by the callback, inference and control threads under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {"chunks": 0, "commands": 0, "dropped_frames": 0, "errors": 0}
        self._command_times: list[float] = []
        self._last_inference_s = 0.0
        self._consecutive_errors = 0
        self._last_error = ""

    def dropped_frame(self) -> None:
        with self._lock:
            self._counts["dropped_frames"] += 1

    def chunk(self, inference_s: float) -> None:
        with self._lock:
            self._counts["chunks"] += 1
            self._consecutive_errors = 0
            self._last_inference_s = inference_s

    def failure(self, error: str) -> None:
        with self._lock:
            self._counts["errors"] += 1
            self._consecutive_errors += 1
            self._last_error = error

    def command(self, now: float) -> None:
        with self._lock:
            self._counts["commands"] += 1
            self._command_times.append(now)

    def health(self, now: float) -> Health:
        with self._lock:
            # Filtered, not popped from the front: the node's clock may jump (sim time), so times need not be sorted.
            self._command_times = [t for t in self._command_times if now - t <= RATE_WINDOW_S]
            rate = len(self._command_times) / RATE_WINDOW_S
            return Health(dict(self._counts), rate, self._last_inference_s, self._consecutive_errors, self._last_error)


@dataclass(frozen=True)
class _Text:
    """What MessageFeed.prompt reads of a std_msgs/String (a goal's prompt arrives without one)."""

    data: str


class PolicyLoop:
    """Runs `policy` on the configured inputs: `start()` the control thread, `activate()` to let commands flow.

    `clock()` gives the time messages are stamped in (the node's clock); `on_chunk(Chunk)` is called from the
    inference thread for every chunk, `on_command(positions, now)` from the control thread for every command,
    `on_halt()` when commands stop (a hold, or the first tick that commands nothing after ticks that did), so an
    interface whose controller runs a whole trajectory (follow_joint_trajectory) can stop it there.
    """

    def __init__(
        self,
        config: OmniConfig,
        policy: Policy,
        clock: Callable[[], float],
        on_chunk: Callable[[Chunk], None],
        on_command: Callable[[np.ndarray, float], None],
        log: Log,
        on_halt: Callable[[], None] | None = None,
    ) -> None:
        control, robot = config.control, config.robot
        cameras = [c.name for c in config.topics.cameras]
        self.config = config
        self.policy = policy
        self.assembler = ObservationAssembler(
            cameras,
            robot.joint_names,
            camera_stale_s=control.camera_stale_s,
            state_stale_s=control.state_stale_s,
            prompt_stale_s=control.prompt_stale_s,
            default_prompt=config.topics.default_prompt,
        )
        self.feed = MessageFeed(
            self.assembler, on_new_error=lambda cam, why: log.warning(f"camera '{cam}': frame dropped: {why}")
        )
        self.executor = ActionChunkExecutor(len(robot.joint_names), control, robot.control_rate_hz, robot.dry_run)
        self.executor.pause()  # commands wait for activation
        self.counters = Counters()
        # Lifecycle state: inactive, the executor stays paused and ~/resume is refused.
        self.active = False
        # Why the latest tick published nothing (shown as the status detail while inputs are stale).
        self.exec_reason = ""
        self._clock = clock
        self._on_chunk = on_chunk
        self._on_command = on_command
        self._on_halt = on_halt
        self._commanding = False  # the latest tick sent a command
        # Why the controller failed (a rejected or aborted trajectory): commands stay stopped until a resume or a
        # new task; '' when fine.
        self.controller_error = ""
        self._log = log
        self._next_chunk_id = 0  # written by the one inference thread only
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="inference")
        # The inference running on it, if any: a new one never queues behind it (see _start_inference).
        self._running: concurrent.futures.Future | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="control", daemon=True)
        # Held for a whole control tick, so `hold()` returns only once no tick can still publish a command
        # (a RunPolicy cancel is acknowledged after that: nothing moves the robot after the acknowledgement).
        self._tick_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def activate(self) -> None:
        self.active = True
        self.executor.resume()

    def deactivate(self) -> None:
        self.active = False
        self.executor.pause()

    def close(self, wait: bool = True) -> None:
        """Stop the control loop, then the inference thread (`wait`: let a running inference finish)."""
        self.active = False
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        self._pool.shutdown(wait=wait, cancel_futures=True)

    # -- inputs (from subscription and service callbacks) ------------------------------------------------------

    def image(self, camera: str, msg: Any, compressed: bool) -> None:
        if not self.feed.image(camera, msg, self._clock(), compressed):
            self.counters.dropped_frame()

    def joint_state(self, msg: Any) -> None:
        if self.feed.joint_state(msg, self._clock()):
            q = self.assembler.latest_state()
            if q is not None:
                self.executor.observe_position(q)

    def prompt(self, msg: Any) -> None:
        self.feed.prompt(msg, self._clock())
        # A new task (or a new episode in the sim): the old plan answers the old prompt.
        self.executor.reset_plan()
        self._log.info(f"prompt: '{msg.data.strip()}'")

    def set_estop(self, engaged: bool) -> None:
        self.executor.set_estop(engaged)
        if engaged:
            self._halt()
        self._log.warning("E-STOP engaged" if engaged else "e-stop released; call ~/resume to continue")

    def pause(self) -> tuple[bool, str]:
        self.executor.pause()
        return True, "paused"

    def hold(self) -> None:
        """Stop commands at once: pause the executor and wait out a tick that may be publishing."""
        with self._tick_lock:
            self.executor.pause()
            self._halt()

    def controller_failed(self, reason: str) -> None:
        """The controller refused or aborted what it was sent: stop commanding (a pause) and say why."""
        self.controller_error = reason
        self.executor.pause()
        self._log.error(f"controller failure, holding: {reason}")

    def _halt(self) -> None:
        self._commanding = False
        if self._on_halt is not None:
            try:
                self._on_halt()
            except Exception as exc:  # the pause above already stops commands; a failed cancel is reported
                self._log.error(f"stopping the controller failed: {exc}")

    def start_task(self, prompt: str) -> None:
        """A new RunPolicy goal: its prompt, a fresh plan, and commands again if the node is active (while
        inactive, activation resumes them)."""
        with self._tick_lock:
            self.feed.prompt(_Text(prompt), self._clock())
            self.executor.reset_plan()
            self.controller_error = ""
            if self.active and self.executor.state is not ExecState.ESTOPPED:
                self.executor.resume()
        self._log.info(f"goal prompt: '{prompt.strip()}'")

    def waiting_for(self, now: float) -> str:
        """Why no command goes out now ('' when inputs are fresh and the node is active)."""
        if not self.active:
            return "the node to be activated (lifecycle: configure, then activate)"
        return self.feed.explain(self.assembler.check(now))

    def resume(self) -> tuple[bool, str]:
        if self.executor.state is ExecState.ESTOPPED:
            return False, "e-stop is engaged; release it first"
        if not self.active:
            return False, "node is not active"
        self.controller_error = ""
        self.executor.resume()
        return True, "resumed"

    # -- control loop ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        period = 1.0 / self.config.robot.control_rate_hz
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # a bug in one tick must not end commands' safety checks for good
                self._log.error(f"control tick failed: {exc}")
            next_tick += period
            delay = next_tick - time.monotonic()
            if delay < 0:  # overran: start again from now rather than firing a burst of late ticks
                next_tick, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    def tick(self) -> None:
        """One control tick: update the stale gate, start an inference when due, send the command."""
        with self._tick_lock:
            self._tick()

    def _tick(self) -> None:
        now = self._clock()
        problem = self.assembler.check(now)
        self.executor.set_stale(problem is not None, self.feed.explain(problem))
        # No lifecycle check here: while inactive the executor is paused (no requests, nothing to publish).
        if self.executor.should_request(now):
            self._start_inference(now)
        command = self.executor.tick(now)
        self.exec_reason = command.reason
        if command.publish and command.positions is not None:
            self._on_command(command.positions, now)
            self.counters.command(now)
            self._commanding = True
        elif self._commanding:
            self._halt()

    def _start_inference(self, now: float) -> None:
        if self._running is not None and not self._running.done():
            # An abandoned inference (a pause, e-stop or reset) still holds the one worker: wait for it, so the next
            # one reads the newest observation when it can start, not the one of now after a queue's wait.
            return
        try:
            assembled = self.assembler.assemble(now)
        except StaleInput as exc:
            self.executor.set_stale(True, self.feed.explain(exc.problem))
            return
        if self.executor.answered_late(assembled.stamp):
            return  # that observation already came back too late: wait for a newer one
        request_id = self.executor.request_started(now)
        # blending rtc: what the policy needs to continue the plan from this observation (None otherwise).
        rtc = self.executor.rtc_request(assembled.stamp)
        future = self._running = self._pool.submit(self._infer, assembled.obs, rtc)
        future.add_done_callback(functools.partial(self._chunk_done, stamp=assembled.stamp, request_id=request_id))

    def _infer(self, obs: dict[str, Any], rtc: RtcRequest | None) -> tuple[dict[str, Any], float]:
        start = time.perf_counter()
        if rtc is None:
            result = self.policy.infer(obs)
        else:  # blending rtc passed check_rtc_support at configure: the policy is a pipeline that serves it
            result = cast("InferencePipeline", self.policy).infer(obs, rtc=rtc)
        return result, time.perf_counter() - start

    def _chunk_done(self, future: concurrent.futures.Future, stamp: float, request_id: int) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            error = f"{type(exc).__name__}: {exc}"
            self.counters.failure(error)
            self.executor.request_failed(error, request_id=request_id)
            self._log.error(f"inference failed: {error}")
            return
        result, seconds = future.result()
        actions = np.asarray(result["actions"], dtype=np.float32)
        dt = self.policy.metadata.action_dt
        report = self.executor.add_chunk(actions, stamp, dt, self._clock(), request_id=request_id)
        if not report.accepted:
            self._log.warning(f"chunk {report.chunk_id} not executed: {report.reason}")
        self._on_chunk(Chunk(self._next_chunk_id, actions, stamp, dt, seconds))
        self._next_chunk_id += 1
        self.counters.chunk(seconds)
