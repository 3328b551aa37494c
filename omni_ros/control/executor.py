"""ActionChunkExecutor: turns asynchronously arriving action chunks into safe commands at the control rate.

The policy node owns one and drives it from three places:

    executor.observe_position(q)                      # every JointState
    if executor.should_request(now):                  # control timer: time for the next inference?
        rid = executor.request_started(now)           # then run inference of the latest observation elsewhere
    executor.add_chunk(actions, stamp, dt, now, rid)  # inference thread: a chunk arrived
    cmd = executor.tick(now)                          # control timer, e.g. 50 Hz
    if cmd.publish: send cmd.positions

Times are seconds on one clock (ROS time in the node). A chunk answering an
observation stamped t0 has action i at t0 + i * dt; when it arrives at t1 the
actions before t1 are skipped (latency compensation). A policy slower than its
chunks (`run_late_chunks`) runs synchronously: a chunk whose every action is
past runs from its arrival when the robot held still since its observation (the
observation still shows where the robot is), and no inference is prefetched
while the measured latency exceeds a chunk (its answer would come too late).
A chunk arriving after the plan before it ran out (`resume_where_held`) plays on
from the action after the plan's last one: the actions that fell due while the
robot held are not skipped, so the robot pauses instead of jumping ahead.

Real-time chunking (`blending: rtc`): right after `request_started`, the caller asks
`rtc_request(stamp)` for what the policy needs to continue the plan (the plan at the
new chunk's action times, the inference delay d) and passes it to
`policy.infer(obs, rtc=...)`; the answer runs the old plan for d actions and then
switches to the new chunk. Every command is
clamped by the joint limits; non-finite chunks are refused and the last safe
position is held; stale inputs, pause and e-stop stop all commands. The
executor is thread-safe.
"""

from __future__ import annotations

import collections
import enum
import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from omni_ros.config import ConfigError
from omni_ros.control.blending import ChunkTrajectory, CrossFade, Ensemble, Hold, Switch, Trajectory
from omni_ros.control.config import ControlConfig
from omni_ros.control.limits import JointLimits
from omni_ros.policy.rtc_request import RtcRequest, supported_rtc_methods


def check_rtc_support(config: ControlConfig, policy: Any) -> None:
    """`blending: rtc` needs a policy that can continue a chunk with the configured method: say so at
    configure time, not at the first chunk boundary."""
    if config.blending != "rtc":
        return
    methods = supported_rtc_methods(policy)
    if config.rtc.method not in methods:
        backend = getattr(getattr(policy, "metadata", None), "backend", type(policy).__name__)
        refusal = getattr(getattr(policy, "runner", None), "rtc_refusal", "")  # a family's own reason (pi0-FAST)
        offer = f"it supports: {', '.join(methods)}" if methods else "it does not support real-time chunking"
        offer += f": {refusal}" if refusal and not methods else ""
        raise ConfigError(
            f"control.blending: rtc with control.rtc.method '{config.rtc.method}': backend '{backend}' cannot "
            f"serve it ({offer}); choose another control.rtc.method or control.blending"
        )


def rtc_method(config: ControlConfig) -> str | None:
    """The real-time-chunking method this control config will ask its policy for (None: no RTC)."""
    return config.rtc.method if config.blending == "rtc" else None


def pause_free_latency_s(horizon: int, dt: float) -> float:
    """The longest a chunk may take, observation to arrival, for the robot never to pause between chunks with one
    inference at a time: half the chunk's motion. The next observation is taken when a chunk arrives, and the
    chunk after it must arrive before this one's plan, which starts at this one's observation, ends: two
    latencies within one chunk's motion."""
    return horizon * dt / 2


def held_share(latency_s: float, horizon: int, dt: float) -> float:
    """The share of the time the robot holds with one inference at a time, each chunk `latency_s` after its
    observation, under the executor's defaults (`resume_where_held`, `run_late_chunks`). With T the chunk's
    motion: none up to T / 2; up to T, (L - T / 2) / L (a chunk arrives every L, and playing on from where the
    robot stopped, the plans move it T / 2 of each L on average); beyond T, L / (L + T) (move, hold while the next
    chunk is computed, move). test_control_executor.py checks the executor against it; bench/realtime.py's live
    run (bench/results/realtime_resume.json), 1.11 s chunks of 1.67 s, held 26.6 s of 120 (0.22; this gives 0.25,
    and the window also holds the simulator's episode starts, where no plan runs and nothing is counted)."""
    motion = horizon * dt
    if latency_s <= pause_free_latency_s(horizon, dt):
        return 0.0
    if latency_s <= motion:
        return (latency_s - motion / 2) / latency_s
    return latency_s / (latency_s + motion)


class ExecState(str, enum.Enum):
    """Matches the state names of omni_ros/PolicyStatus."""

    IDLE = "idle"  # no chunk to execute yet (start-up, or after a stop)
    RUNNING = "running"
    STALE_INPUT = "stale-input"
    PAUSED = "paused"
    ESTOPPED = "e-stopped"


@dataclass
class Command:
    """What to do at one control tick."""

    time: float
    # Position target for now (None: nothing known to command yet).
    positions: np.ndarray | None
    # False whenever the command must not reach the robot: dry run, idle, stale, paused, e-stopped.
    publish: bool
    state: ExecState
    reason: str = ""
    # A position or velocity limit changed the command.
    clamped: bool = False
    chunk_id: int | None = None


@dataclass
class ChunkReport:
    """The executor's verdict on an arriving chunk."""

    accepted: bool
    chunk_id: int
    # Actions whose time had passed on arrival (latency compensation).
    skipped: int = 0
    reason: str = ""


# A command's reason while the running plan has no action left and the robot holds its last one.
PLAN_EXHAUSTED = "chunk exhausted, holding its last action"


@dataclass
class ExecutorStats:
    chunks_accepted: int = 0
    chunks_rejected: int = 0
    skipped_actions: int = 0
    # Chunks that arrived after their last action, run from their arrival (the robot held still since their
    # observation: run_late_chunks).
    late_chunks_run: int = 0
    commands_computed: int = 0
    commands_published: int = 0
    commands_clamped: int = 0
    # Largest per-joint change between consecutive computed commands.
    max_step: float = 0.0
    last_reject_reason: str = ""
    extra: dict[str, float] = field(default_factory=dict)


class ActionChunkExecutor:
    """Executes (H, dim) position chunks: timing, prefetch, blending, limits and safety states."""

    def __init__(
        self,
        dim: int,
        config: ControlConfig | None = None,
        control_rate_hz: float = 50.0,
        dry_run: bool = False,
    ) -> None:
        if dim < 1:
            raise ValueError(f"action dimension must be positive, got {dim}")
        self.config = config = config or ControlConfig()  # it checks its own ranges; the joint count is ours
        self.dim = int(dim)
        self.control_rate_hz = float(control_rate_hz)
        self.dry_run = bool(dry_run)
        self.limits = JointLimits.build(
            dim, config.position_lower, config.position_upper, config.max_velocity, control_rate_hz
        )
        self.stats = ExecutorStats()
        self._lock = threading.RLock()
        self._traj: Trajectory | None = None
        self._ensemble: Ensemble | None = None
        self._newest: ChunkTrajectory | None = None
        self._last_command: np.ndarray | None = None
        self._measured: np.ndarray | None = None
        self._next_id = 0
        self._inflight_since: float | None = None
        # Id of the one inference whose chunk is wanted; a pause, e-stop or reset invalidates it (stale inputs do not).
        self._request_seq = 0
        self._live_request: int | None = None
        self._stale_reason = ""
        self._stale = False
        self._paused = False
        self._estop = False
        # Real-time chunking: recent chunk latencies (arrival - stamp) and the (request, stamp, d) that the
        # chunk in flight was asked to continue with.
        self._latencies: collections.deque[float] = collections.deque(maxlen=config.rtc.latency_window)
        self._rtc_pending: tuple[int | None, float, int] | None = None
        # The newest observation stamp whose chunk came back past its end while the plan moved the robot: its
        # observation can only be answered later still (answered_late).
        self._late_stamp: float | None = None
        # Since when the running plan has had no action left (the robot holds its last one), or None.
        self._ran_out_at: float | None = None

    # ----- inputs -------------------------------------------------------------------------------------------

    def observe_position(self, position: ArrayLike) -> None:
        """The measured joint positions (the hold position before any command, and after a stop)."""
        q = np.asarray(position, dtype=np.float64)
        if q.shape != (self.dim,) or not np.all(np.isfinite(q)):
            return  # the node reports bad joint states as stale input; never hold at garbage
        with self._lock:
            self._measured = q.copy()

    def add_chunk(
        self, actions: np.ndarray, stamp: float, dt: float, now: float, request_id: int | None = None
    ) -> ChunkReport:
        """A chunk answering the observation stamped `stamp` arrived at `now`; actions are (H, dim).

        `request_id` (from `request_started`) lets the executor drop the answer to an inference that
        was started before a pause, an e-stop or `reset_plan()`; without it every chunk is considered current.
        """
        with self._lock:
            chunk_id = self._next_id
            self._next_id += 1
            if request_id is not None and request_id != self._live_request:
                self.stats.chunks_rejected += 1
                reason = f"answers request {request_id}, issued before a stop or reset; dropped"
                self.stats.last_reject_reason = reason
                return ChunkReport(False, chunk_id, 0, reason)
            self._inflight_since = None
            self._live_request = None
            continued, self._rtc_pending = self._rtc_pending, None
            if continued is not None and request_id is not None and continued[0] not in (None, request_id):
                continued = None
            if math.isfinite(now - stamp) and now >= stamp:
                self._latencies.append(now - stamp)
            try:
                arr = np.asarray(actions, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                return self._reject(chunk_id, f"actions are not numeric: {exc}", hold=True)
            if arr.ndim != 2 or arr.shape[1] != self.dim or arr.shape[0] < 1:
                return self._reject(chunk_id, f"actions have shape {arr.shape}, expected (H, {self.dim})", hold=True)
            if not np.all(np.isfinite(arr)):
                bad = np.argwhere(~np.isfinite(arr))[0].tolist()
                return self._reject(chunk_id, f"non-finite action (NaN/inf) at [step, joint] {bad}", hold=True)
            if not (math.isfinite(dt) and dt > 0):
                return self._reject(chunk_id, f"chunk dt must be positive, got {dt}", hold=True)
            if self._stopped():
                return self._reject(chunk_id, f"not running ({self.state.value}); chunk dropped", hold=False)
            start = stamp if self.config.latency_compensation else now
            chunk = ChunkTrajectory(arr, start, dt, chunk_id)
            resume = self._resume_index(chunk, now)
            all_due = now >= chunk.end + dt  # every action was due before it arrived
            if resume is not None and (self.config.run_late_chunks or not all_due):
                # The robot has held since its plan ran out: play on from the action it stopped at rather than
                # skip the ones that fell due while it held (it pauses; it does not jump ahead).
                self.stats.late_chunks_run += int(all_due)
                chunk = ChunkTrajectory(arr, now - resume * dt, dt, chunk_id)
                self.stats.extra["resumed_chunks"] = self.stats.extra.get("resumed_chunks", 0) + 1
                continued = None
            if now >= chunk.end + dt:
                if not (self.config.run_late_chunks and self._still_since(stamp)):
                    late = f"chunk arrived {now - stamp:.3f} s after its observation, past its end"
                    self._late_stamp = stamp if self._late_stamp is None else max(self._late_stamp, stamp)
                    return self._reject(chunk_id, late, False)
                # The robot held still since the observation: the chunk is what a synchronous policy would run now.
                chunk = ChunkTrajectory(arr, now, dt, chunk_id)
                self.stats.late_chunks_run += 1
                continued = None
            # Actions scheduled before now are skipped; the one due now is the current target.
            skipped = min(chunk.horizon, max(0, math.ceil((now - chunk.start) / dt - 1e-9)))
            self._traj = self._blend_in(chunk, now, continued)
            self._newest = chunk
            self.stats.chunks_accepted += 1
            self.stats.skipped_actions += skipped
            return ChunkReport(True, chunk_id, skipped)

    def _resume_index(self, chunk: ChunkTrajectory, now: float) -> int | None:
        """With `resume_where_held`, when the running plan ran out before `now`: the index of `chunk`'s first
        action after the plan's last one (0 if the plan ended before the chunk's observation), to be played now.
        None while the plan still runs, without a plan, or when every action of `chunk` fell due while the plan
        still moved the robot (the late rule decides that chunk)."""
        newest = self._newest
        if not self.config.resume_where_held or self._traj is None or newest is None or now <= newest.end:
            return None
        first = max(0, math.floor((newest.end - chunk.start) / chunk.dt + 1e-9) + 1)
        return first if first < chunk.horizon else None

    def _still_since(self, stamp: float) -> bool:
        """Whether nothing moved the robot after `stamp`: no plan (start-up, or dropped by a stop, after which the
        robot holds), or a plan whose last action was due by then (it has held that action since)."""
        return self._traj is None or self._newest is None or self._newest.end <= stamp + 1e-9

    def _blend_in(
        self, chunk: ChunkTrajectory, now: float, continued: tuple[int | None, float, int] | None = None
    ) -> Trajectory:
        mode = self.config.blending
        window = self.config.blend_window_s
        previous = self._traj
        if mode == "rtc" and previous is not None and continued is not None:
            # The chunk continues the plan: its first d actions are the old ones, executed from the old plan;
            # switch after them (or now, if it arrived later than d promised), fading out what guidance left.
            _, stamp, delay = continued
            switch = max(now, stamp + delay * chunk.dt)
            fade = self.config.rtc.fade(self.config.blend_window_s)
            return CrossFade(previous, chunk, switch, fade) if fade > 0 else Switch(previous, chunk, switch)
        if previous is None:
            base = self._base_position()
            previous = Hold(base) if base is not None else None
        if mode == "ensemble":
            if isinstance(self._ensemble, Ensemble) and self._traj is not None:
                self._ensemble = self._ensemble.with_chunk(chunk, now)
            else:
                self._ensemble = Ensemble([(chunk, now)], self.config.ensemble_decay, window)
            new: Trajectory = self._ensemble
        else:
            new = chunk
        if mode == "latest" or previous is None or window <= 0:
            return new
        return CrossFade(previous, new, now, window)

    def _reject(self, chunk_id: int, reason: str, hold: bool) -> ChunkReport:
        self.stats.chunks_rejected += 1
        self.stats.last_reject_reason = reason
        if hold:
            # A policy that emits garbage is not trusted for the rest of its plan either.
            self._drop_plan()
        return ChunkReport(False, chunk_id, 0, reason)

    # ----- inference scheduling -------------------------------------------------------------------------------

    def should_request(self, now: float) -> bool:
        """True when the next inference should start: no chunk yet, or too few actions left, none in flight."""
        with self._lock:
            if self._stopped() or self._inflight_since is not None:
                return False
            if self._newest is None or self._traj is None:
                return True
            left = self._newest.remaining(now)
            if left == 0:
                return True
            if self.config.run_late_chunks and self._slower_than_a_chunk(self._newest):
                return False  # a prefetched answer would arrive after this plan ends, and be dropped
            return left < self.config.prefetch_threshold * self._newest.horizon

    def answered_late(self, stamp: float) -> bool:
        """Whether the observation stamped `stamp` (or a newer one) was already answered past its chunk's end.

        Asking again would only answer it later still, and the busy loop of such requests takes the CPU from the
        processes that publish the next observation (on 2 shared cores it starved a robot's joint states): wait
        for a newer observation instead. A dropped plan (stop, reset, refused chunk) forgets this, since a late
        chunk then runs from its arrival.
        """
        with self._lock:
            return self._late_stamp is not None and stamp <= self._late_stamp

    def _slower_than_a_chunk(self, chunk: ChunkTrajectory) -> bool:
        """Every recent inference took longer than `chunk` takes to execute."""
        return bool(self._latencies) and min(self._latencies) > chunk.horizon * chunk.dt

    def request_started(self, now: float) -> int:
        """An inference started at `now`; returns its id for `add_chunk` / `request_failed`."""
        with self._lock:
            self._inflight_since = now
            self._request_seq += 1
            self._live_request = self._request_seq
            return self._request_seq

    def request_failed(self, reason: str = "", request_id: int | None = None) -> None:
        """Inference failed: allow the next request (the current plan keeps running to its end)."""
        with self._lock:
            if request_id is not None and request_id != self._live_request:
                return  # an abandoned request; the live one is still running
            self._inflight_since = None
            self._live_request = None
            self._rtc_pending = None
            self.stats.last_reject_reason = reason

    def inference_delay(self, dt: float) -> int:
        """d in actions of `dt`: the configured one, else ceil(max recent latency / dt) (LeRobot's estimate)."""
        fixed = self.config.rtc.inference_delay
        if fixed is not None:
            return int(fixed)
        with self._lock:
            if not self._latencies:
                return 0
            # A tiny tolerance: a latency of exactly k actions is d = k, not k + 1 from float noise.
            return max(0, math.ceil(max(self._latencies) / dt - 1e-6))

    def rtc_request(self, stamp: float) -> RtcRequest | None:
        """What the policy needs to continue the plan from an observation stamped `stamp` (`blending: rtc`).

        None when there is nothing to continue (no plan yet, the plan ends before `stamp`, or before the answer is
        expected: the estimated delay covers every action it has left): the policy then samples a fresh chunk,
        which enters like `linear`. Call it right after `request_started`.
        """
        with self._lock:
            if self.config.blending != "rtc" or self._traj is None or self._newest is None or self._stopped():
                return None
            chunk = self._newest
            times = stamp + chunk.dt * np.arange(chunk.horizon)
            rows = int(np.count_nonzero(times <= chunk.end + 1e-9))
            if rows == 0:
                return None
            # The plan to continue is the newest chunk itself, not the blend being commanded: every fade ends
            # in it, it is what the policy itself proposed, and the new chunk only takes over after d actions.
            delay = self.inference_delay(chunk.dt)
            if delay >= rows:
                # The answer is expected after this plan has ended: there is nothing left to continue, so a fresh
                # chunk is sampled. A slow first chunk (warm-up) in the latency window used to make every request
                # of the plan fail ("inference_delay 51 is longer than the chunk"), retried each tick until the
                # plan ran out (SmolVLA in bench/realtime.py's live run).
                self.stats.extra["rtc_requests_past_plan"] = self.stats.extra.get("rtc_requests_past_plan", 0) + 1
                return None
            plan = np.stack([chunk.at(float(t)) for t in times[:rows]])
            rtc = self.config.rtc
            request = RtcRequest(
                plan,
                inference_delay=delay,
                execution_horizon=chunk.horizon - rows,
                schedule=rtc.schedule,
                max_guidance_weight=rtc.max_guidance_weight,
                method=rtc.method,
            )
            self._rtc_pending = (self._live_request, float(stamp), delay)
            self.stats.extra["rtc_inference_delay"] = float(delay)
            return request

    def reset_plan(self) -> None:
        """Forget the plan and any inference in flight (say, the task or episode changed).

        The robot then holds still until the next chunk, which starts from the measured position.
        """
        with self._lock:
            self._drop_plan()
            self._abandon_request()
            if self._measured is not None:
                self._last_command = self._measured.copy()

    @property
    def inflight_since(self) -> float | None:
        return self._inflight_since

    # ----- safety states --------------------------------------------------------------------------------------

    def set_stale(self, stale: bool, reason: str = "") -> None:
        """Inputs (camera, state, prompt) are too old or invalid: hold still until they recover."""
        with self._lock:
            self._set_flag("_stale", stale)
            self._stale_reason = reason if stale else ""

    def pause(self) -> None:
        with self._lock:
            self._set_flag("_paused", True)

    def resume(self) -> None:
        """Leave pause (also needed after an e-stop is released)."""
        with self._lock:
            self._set_flag("_paused", False)

    def set_estop(self, engaged: bool) -> None:
        """E-stop is latched: releasing it leaves the executor paused until `resume()`."""
        with self._lock:
            if engaged:
                self._set_flag("_estop", True)
            elif self._estop:
                self._paused = True
                self._set_flag("_estop", False)

    def _set_flag(self, name: str, value: bool) -> None:
        was_stopped = self._stopped()
        setattr(self, name, value)
        # A pause or e-stop abandons the inference in flight: nothing asked before it may move the robot after
        # it. Stale inputs do not: that observation was fresh when taken, and a blip of late messages (2 busy
        # cores delay the node's callbacks) would otherwise throw away a whole inference and queue another
        # behind it. Its chunk is refused if inputs are still stale when it arrives, judged as any other if not.
        if value and name != "_stale":
            self._abandon_request()
        if self._stopped() and not was_stopped:
            self._drop_plan()
        elif was_stopped and not self._stopped():
            # Restart from where the robot is now, which may differ from the last command after a stop.
            if self._measured is not None:
                self._last_command = self._measured.copy()
            if name != "_stale":
                self._abandon_request()

    def _abandon_request(self) -> None:
        self._inflight_since = None
        self._live_request = None
        self._rtc_pending = None

    def _stopped(self) -> bool:
        return self._estop or self._paused or self._stale

    def _drop_plan(self) -> None:
        self._traj = None
        self._ensemble = None
        self._newest = None
        self._rtc_pending = None
        self._late_stamp = None
        self._ran_out_at = None  # a stop is no pause of the plan's making

    def _base_position(self) -> np.ndarray | None:
        return self._last_command if self._last_command is not None else self._measured

    @property
    def state(self) -> ExecState:
        if self._estop:
            return ExecState.ESTOPPED
        if self._paused:
            return ExecState.PAUSED
        if self._stale:
            return ExecState.STALE_INPUT
        return ExecState.RUNNING if self._traj is not None else ExecState.IDLE

    def newest_chunk_id(self) -> int | None:
        """The id of the newest accepted chunk of the plan (None: no plan)."""
        with self._lock:
            return None if self._newest is None else self._newest.chunk_id

    def preview(self, now: float) -> tuple[np.ndarray, np.ndarray] | None:
        """(seconds from `now`, positions): the plan at the newest chunk's action times still ahead, as the
        ticks would command it (blending, position limits, the speed limit over each point's interval).

        For a controller that interpolates a whole trajectory itself (follow_joint_trajectory). None when
        nothing may be commanded (stopped, dry run, no plan, no known position under a speed limit) or no
        action of the newest chunk is ahead of `now`.
        """
        with self._lock:
            newest, traj, previous = self._newest, self._traj, self._base_position()
            if self._stopped() or self.dry_run or newest is None or traj is None:
                return None
            if previous is None and self.limits.max_step is not None:
                return None
            first = max(0, math.floor((now - newest.start) / newest.dt + 1e-9) + 1)
            times = newest.start + newest.dt * np.arange(first, newest.horizon)
            if times.size == 0:
                return None
            points = np.empty((times.size, self.dim))
            # The speed limit is a step per control tick: scale it to each point's interval.
            limits = JointLimits(self.limits.lower, self.limits.upper, None)
            t_prev = now
            for i, t in enumerate(times):
                point, _ = limits.clamp(traj.at(float(t)), None)
                if self.limits.max_step is not None and previous is not None:
                    step = self.limits.max_step * (float(t) - t_prev) * self.control_rate_hz
                    point = np.clip(point, previous - step, previous + step)
                points[i], previous, t_prev = point, point, float(t)
            return times - now, points

    # ----- keeping up ------------------------------------------------------------------------------------------

    def _plan_ran_out(self, now: float) -> None:
        if self._ran_out_at is None:
            self._ran_out_at = now
            self.stats.extra["plan_ran_out"] = self.stats.extra.get("plan_ran_out", 0) + 1

    def _plan_resumed(self, now: float) -> None:
        if self._ran_out_at is not None:
            self.stats.extra["held_s"] = self.stats.extra.get("held_s", 0.0) + (now - self._ran_out_at)
            self._ran_out_at = None

    def motion_counts(self, now: float) -> dict[str, float]:
        """How the plan has fared since start-up, for the node's diagnostics: chunks accepted and refused, the
        ones run late or resumed where the robot stopped, how often the plan ran out and the seconds held so
        (the hold under way included up to `now`)."""
        with self._lock:
            extra = self.stats.extra
            held = extra.get("held_s", 0.0) + (now - self._ran_out_at if self._ran_out_at is not None else 0.0)
            return {
                "chunks_accepted": self.stats.chunks_accepted,
                "chunks_rejected": self.stats.chunks_rejected,
                "late_chunks_run": self.stats.late_chunks_run,
                "resumed_chunks": int(extra.get("resumed_chunks", 0)),
                "plan_ran_out": int(extra.get("plan_ran_out", 0)),
                "held_s": round(max(0.0, held), 3),
            }

    def keeping_up(self) -> str:
        """Why the robot pauses between chunks, when it does: "" while every chunk has arrived within the plan
        before it; else how often the plan ran out, and what the chunks' latency asks of the policy.

        With one inference at a time a chunk's observation is taken when the previous chunk arrives, so each
        chunk must come back within the plan of the one before: latency <= half a chunk's motion (bench/
        realtime.py's live run: a full-size SmolVLA at 1.11 s a chunk for 1.67 s of motion held 26.6 s of 120,
        resuming where it stopped; bench/results/realtime_resume.json)."""
        with self._lock:
            ran_out = int(self.stats.extra.get("plan_ran_out", 0))
            if ran_out == 0 or self._newest is None or not self._latencies:
                return ""
            chunk = self._newest
            latency = float(np.median(self._latencies))
            half = pause_free_latency_s(chunk.horizon, chunk.dt)
            held = self.stats.extra.get("held_s", 0.0)
            advice = (
                f"chunks arrive {latency:.2f} s after their observation; the robot keeps moving only if that is at "
                f"most half a chunk's motion ({half:.2f} s): a faster policy.precision, fewer cameras, fewer busy "
                "processes on the policy's cores or a faster computer"
                if latency > half
                else f"chunks arrive {latency:.2f} s after their observation, within half a chunk's motion "
                f"({half:.2f} s)"
            )
            share = held_share(latency, chunk.horizon, chunk.dt) if self.config.resume_where_held else None
            expected = f" (at this latency about {share:.0%} of the time)" if share else ""
            return f"the plan ran out {ran_out} time(s), holding {held:.1f} s in all{expected}; {advice}"

    # ----- the control tick -----------------------------------------------------------------------------------

    def tick(self, now: float) -> Command:
        """The command for control time `now`."""
        with self._lock:
            state = self.state
            hold = self._base_position()
            if state in (ExecState.ESTOPPED, ExecState.PAUSED, ExecState.STALE_INPUT):
                self._ran_out_at = None  # holding for another reason than a late chunk
                reason = self._stale_reason if state is ExecState.STALE_INPUT else state.value
                return Command(now, None if hold is None else hold.copy(), False, state, reason or state.value)
            if self._traj is None:
                return Command(now, None if hold is None else hold.copy(), False, state, "waiting for a chunk")
            if hold is None and self.limits.max_step is not None:
                # Without a known position the speed limit cannot be applied: send nothing.
                return Command(now, None, False, state, "no joint position known yet (observe_position)")
            self._traj = self._traj.simplify(now)
            target = self._traj.at(now)
            if not np.all(np.isfinite(target)):  # cannot happen with finite chunks; never send it anyway
                self._drop_plan()
                return Command(now, None if hold is None else hold.copy(), False, ExecState.IDLE, "non-finite command")
            command, clamped = self.limits.clamp(target, hold)
            if hold is not None:
                self.stats.max_step = max(self.stats.max_step, float(np.max(np.abs(command - hold))))
            self._last_command = command
            self.stats.commands_computed += 1
            self.stats.commands_clamped += int(clamped)
            publish = not self.dry_run
            self.stats.commands_published += int(publish)
            reason = "dry run" if self.dry_run else ""
            if self._newest is not None and now > self._newest.end:
                reason = (reason + "; " if reason else "") + PLAN_EXHAUSTED
                self._plan_ran_out(now)
            else:
                self._plan_resumed(now)
            chunk_id = self._newest.chunk_id if self._newest is not None else None
            return Command(now, command.copy(), publish, state, reason, clamped, chunk_id)
