"""Ground truth: the recorded command stream (or future joint states) as a track sampled at any time.

A predicted chunk answering the observation stamped t0 has action i at t0 + i * dt (the executor's
convention); its ground truth is the recorded track linearly interpolated at those times. Times outside
the recording, or inside a gap longer than `max_gap_s`, have no ground truth and are not scored.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from omni_ros.eval.bag import FLOAT64_ARRAY, JOINT_STATE, JOINT_TRAJECTORY
from omni_ros.ros_convert import message_stamp

COMMAND_TYPES = (JOINT_TRAJECTORY, JOINT_STATE, FLOAT64_ARRAY)


class Track:
    """Samples (time, D values), sorted by time; `sample` interpolates linearly, never across long gaps."""

    def __init__(self, times: np.ndarray, values: np.ndarray, max_gap_s: float) -> None:
        order = np.argsort(times, kind="stable")
        times, values = np.asarray(times, np.float64)[order], np.asarray(values, np.float64)[order]
        if len(times):
            # Equal stamps: the later message (in log order) wins, as it would on the robot.
            keep = np.append(times[1:] != times[:-1], True)
            times, values = times[keep], values[keep]
        self.times = times
        self.values = values.reshape(len(times), -1) if len(times) else np.zeros((0, 0))
        self.max_gap_s = max_gap_s

    def __len__(self) -> int:
        return len(self.times)

    @property
    def span(self) -> tuple[float, float]:
        return (float(self.times[0]), float(self.times[-1])) if len(self.times) else (0.0, 0.0)

    def sample(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Values at times `t` (shape t.shape + (D,)) and a mask of which times have ground truth."""
        t = np.asarray(t, dtype=np.float64)
        n = len(self.times)
        dim = self.values.shape[1] if n else 0
        if n == 0:
            return np.zeros((*t.shape, dim)), np.zeros(t.shape, dtype=bool)
        eps = 1e-9
        hi = np.clip(np.searchsorted(self.times, t, side="left"), 0, n - 1)
        lo = np.clip(hi - 1, 0, n - 1)
        exact = np.abs(self.times[hi] - t) <= eps
        lo = np.where(exact, hi, lo)
        t_lo, t_hi = self.times[lo], self.times[hi]
        span = t_hi - t_lo
        inside = (t >= self.times[0] - eps) & (t <= self.times[-1] + eps)
        valid = inside & (exact | (span <= self.max_gap_s + eps))
        w = np.where(span > 0, (t - t_lo) / np.where(span > 0, span, 1.0), 0.0)
        w = np.clip(w, 0.0, 1.0)[..., None]
        values = self.values[lo] * (1 - w) + self.values[hi] * w
        return values, valid


class GroundTruthCollector:
    """Turns recorded command (or joint state) messages into a `Track` in robot joint order."""

    def __init__(
        self,
        joint_names: Sequence[str],
        msgtype: str,
        *,
        array_joint_names: Sequence[str] = (),
        offset_s: float = 0.0,
        trajectory_points: str = "first",
        use_header_stamps: bool = True,
        max_gap_s: float = 0.25,
    ) -> None:
        self.joint_names = list(joint_names)
        self.msgtype = msgtype
        self.array_joint_names = list(array_joint_names) or self.joint_names
        self.offset_s = offset_s
        self.trajectory_points = trajectory_points
        self.use_header_stamps = use_header_stamps
        self.max_gap_s = max_gap_s
        self.rejected: Counter = Counter()
        self._times: list[float] = []
        self._values: list[np.ndarray] = []
        # trajectory_points == "all": (stamp, [(time, values)]) per message, cut when finished.
        self._plans: list[tuple[float, list[tuple[float, np.ndarray]]]] = []

    @property
    def count(self) -> int:
        """Messages collected so far."""
        return len(self._times) + len(self._plans)

    def add(self, msg: Any, log_time: float) -> None:
        stamp = message_stamp(msg, log_time, self.use_header_stamps)
        if self.msgtype == JOINT_TRAJECTORY:
            self._add_trajectory(msg, stamp)
        elif self.msgtype == JOINT_STATE:
            q = self._by_name(list(msg.name), msg.position)
            if q is not None:
                self._append(stamp - self.offset_s, q)
        elif self.msgtype == FLOAT64_ARRAY:
            data = np.asarray(msg.data, dtype=np.float64)
            if len(data) < len(self.array_joint_names):
                self.rejected[f"Float64MultiArray has {len(data)} values for {len(self.array_joint_names)} joints"] += 1
                return
            q = self._by_name(self.array_joint_names, data[: len(self.array_joint_names)])
            if q is not None:
                self._append(stamp, q)

    def _add_trajectory(self, msg: Any, stamp: float) -> None:
        if not msg.points:
            self.rejected["JointTrajectory without points"] += 1
            return
        names = list(msg.joint_names)
        if self.trajectory_points == "first":
            q = self._by_name(names, msg.points[0].positions)
            if q is not None:
                self._append(stamp, q)
            return
        plan = []
        for point in msg.points:
            q = self._by_name(names, point.positions)
            if q is None:
                return
            tfs = point.time_from_start.sec + point.time_from_start.nanosec * 1e-9
            plan.append((stamp + tfs, q))
        self._plans.append((stamp, plan))

    def _by_name(self, names: list[str], positions: Any) -> np.ndarray | None:
        index = {n: i for i, n in enumerate(names)}
        missing = [n for n in self.joint_names if n not in index]
        if missing:
            self.rejected[f"command lacks joints {missing}"] += 1
            return None
        positions = np.asarray(positions, dtype=np.float64)
        if len(positions) < len(names):
            self.rejected[f"command has {len(names)} names but {len(positions)} positions"] += 1
            return None
        q = positions[[index[n] for n in self.joint_names]]
        if not np.all(np.isfinite(q)):
            self.rejected["command has non-finite positions"] += 1
            return None
        return q

    def samples(self) -> tuple[list[float], list[np.ndarray]]:
        """The (time, positions) samples collected so far, in arrival order (plans of `all` excluded); not copies."""
        return self._times, self._values

    def _append(self, t: float, q: np.ndarray) -> None:
        self._times.append(t)
        self._values.append(q)

    def track(self) -> Track:
        times, values = list(self._times), list(self._values)
        # A newer trajectory replaces what is left of the previous one from its own stamp on.
        plans = sorted(self._plans, key=lambda p: p[0])
        for k, (_, plan) in enumerate(plans):
            until = plans[k + 1][0] if k + 1 < len(plans) else np.inf
            for t, q in plan:
                if t <= until:
                    times.append(t)
                    values.append(q)
        dim = len(self.joint_names)
        arr = np.array(values, dtype=np.float64).reshape(len(values), dim)
        return Track(np.array(times, dtype=np.float64), arr, self.max_gap_s)
