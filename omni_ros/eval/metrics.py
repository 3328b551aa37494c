"""Scoring predicted chunks against the recorded track: sums that merge exactly across episodes.

Errors are kept as sums per (horizon step, joint), so per-joint, per-step and overall means of any
set of episodes are exact (sample-weighted), not averages of averages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_ros.eval.groundtruth import Track


@dataclass
class Prediction:
    """One chunk: action i is meant for time t0 + i * dt (t0: the stamp of the observation it answers)."""

    t0: float
    # The inference instant (bag time) at which it was requested.
    now: float
    actions: np.ndarray
    dt: float
    latency_s: float
    # Joint positions observed at t0 (offline replay): the constant "hold still" baseline for this instant.
    state: np.ndarray | None = None


@dataclass
class Scores:
    """Error sums of a set of predictions, and the counts that go with them."""

    dim: int
    # The arrays are sized from `dim` in __post_init__.
    sq: np.ndarray = field(init=False)  # (H, D) sums of squared errors
    ab: np.ndarray = field(init=False)  # (H, D) sums of absolute errors
    n: np.ndarray = field(init=False)  # (H, D) scored entries
    end_sq: np.ndarray = field(init=False)  # (D,) at each sample's last scored step
    end_ab: np.ndarray = field(init=False)
    end_n: int = 0
    samples: int = 0
    boundary: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    # The constant baseline on the same scored values: absolute-error sums and counts per joint.
    hold_ab: np.ndarray = field(init=False)
    hold_n: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.sq, self.ab, self.n = (np.zeros((0, self.dim)) for _ in range(3))
        self.end_sq = np.zeros(self.dim)
        self.end_ab = np.zeros(self.dim)
        self.hold_ab = np.zeros(self.dim)
        self.hold_n = np.zeros(self.dim)

    def add_hold(self, err: np.ndarray, valid: np.ndarray) -> None:
        """`err` (H, D) held position minus ground truth on the steps `valid` (H,) the prediction was scored."""
        self.hold_ab += np.abs(np.where(valid[:, None], err, 0.0)).sum(0)
        self.hold_n += valid.sum()

    def _grow(self, horizon: int) -> None:
        if horizon > len(self.sq):
            pad = ((0, horizon - len(self.sq)), (0, 0))
            self.sq, self.ab, self.n = (np.pad(a, pad) for a in (self.sq, self.ab, self.n))

    def add(self, err: np.ndarray, valid: np.ndarray) -> None:
        """`err` (H, D) prediction minus ground truth, `valid` (H,) which steps have ground truth."""
        if not valid.any():
            return
        self._grow(len(err))
        h = len(err)
        masked = np.where(valid[:, None], err, 0.0)
        self.sq[:h] += masked**2
        self.ab[:h] += np.abs(masked)
        self.n[:h] += valid[:, None]
        last = int(np.flatnonzero(valid)[-1])
        self.end_sq += err[last] ** 2
        self.end_ab += np.abs(err[last])
        self.end_n += 1
        self.samples += 1

    def merge(self, other: Scores) -> None:
        self._grow(len(other.sq))
        h = len(other.sq)
        self.sq[:h] += other.sq
        self.ab[:h] += other.ab
        self.n[:h] += other.n
        self.end_sq += other.end_sq
        self.end_ab += other.end_ab
        self.end_n += other.end_n
        self.samples += other.samples
        self.boundary += other.boundary
        self.latency_s += other.latency_s
        self.hold_ab += other.hold_ab
        self.hold_n += other.hold_n


def score_episode(predictions: Sequence[Prediction], track: Track, dim: int) -> tuple[Scores, list[np.ndarray]]:
    """Scores of an episode's predictions (in instant order) and each prediction's valid-step mask."""
    scores = Scores(dim)
    masks = []
    previous: Prediction | None = None
    for pred in predictions:
        h = len(pred.actions)
        times = pred.t0 + np.arange(h) * pred.dt
        truth, valid = track.sample(times)
        masks.append(valid)
        scores.add(pred.actions.astype(np.float64) - truth, valid)
        if pred.state is not None and np.size(pred.state) == dim:
            scores.add_hold(np.asarray(pred.state, np.float64)[None, :] - truth, valid)
        scores.latency_s.append(pred.latency_s)
        if previous is not None:
            jump = chunk_boundary_jump(previous, pred)
            if jump is not None:
                scores.boundary.append(jump)
        previous = pred
    return scores, masks


def chunk_boundary_jump(previous: Prediction, current: Prediction) -> float | None:
    """Largest per-joint change from the previous chunk's plan to the new chunk's first action, at its time.

    None when the new chunk starts outside the previous one (nothing to switch from).
    """
    h = len(previous.actions)
    offset = (current.t0 - previous.t0) / previous.dt
    if offset < 0 or offset > h - 1:
        return None
    i = min(int(np.floor(offset)), h - 2) if h > 1 else 0
    w = offset - i
    old = previous.actions[i] * (1 - w) + previous.actions[min(i + 1, h - 1)] * w
    return float(np.max(np.abs(current.actions[0].astype(np.float64) - old)))


def _mean(total: np.ndarray | float, count: np.ndarray | float) -> Any:
    total, count = np.asarray(total, dtype=np.float64), np.asarray(count, dtype=np.float64)
    out = np.where(count > 0, total / np.where(count > 0, count, 1), np.nan)
    return out


def _num(x: float) -> float | None:
    """JSON-safe float: NaN (nothing to average) becomes null."""
    x = float(x)
    return None if not np.isfinite(x) else round(x, 9)


def percentiles(values: Sequence[float], scale: float = 1.0) -> dict[str, Any]:
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p95": None, "max": None}
    a = np.asarray(values, dtype=np.float64) * scale
    return {
        "count": len(a),
        "mean": _num(a.mean()),
        "p50": _num(np.percentile(a, 50)),
        "p95": _num(np.percentile(a, 95)),
        "max": _num(a.max()),
    }


def scores_to_dict(scores: Scores, joint_names: Sequence[str]) -> dict[str, Any]:
    """The error part of a metrics block (see schema.py)."""
    sq, ab, n = scores.sq, scores.ab, scores.n
    total_n = n.sum()
    first = (sq[0], ab[0], n[0]) if len(sq) else (np.zeros(scores.dim),) * 3
    return {
        "aligned_samples": scores.samples,
        "scored_values": int(total_n),
        "mse": _num(_mean(sq.sum(), total_n)),
        "mae": _num(_mean(ab.sum(), total_n)),
        "mse_per_joint": {j: _num(v) for j, v in zip(joint_names, _mean(sq.sum(0), n.sum(0)), strict=True)},
        "mae_per_joint": {j: _num(v) for j, v in zip(joint_names, _mean(ab.sum(0), n.sum(0)), strict=True)},
        "mse_per_step": [_num(v) for v in _mean(sq.sum(1), n.sum(1))],
        "mae_per_step": [_num(v) for v in _mean(ab.sum(1), n.sum(1))],
        "first_action": {
            "samples": int(first[2].max()) if len(first[2]) else 0,
            "mse": _num(_mean(first[0].sum(), first[2].sum())),
            "mae": _num(_mean(first[1].sum(), first[2].sum())),
        },
        "end_point": {
            "samples": scores.end_n,
            "mse": _num(_mean(scores.end_sq.sum(), scores.end_n * scores.dim)),
            "mae": _num(_mean(scores.end_ab.sum(), scores.end_n * scores.dim)),
        },
        "chunk_boundary": percentiles(scores.boundary),
        "latency_ms": percentiles(scores.latency_s, 1e3),
        "baseline_hold": {
            "scored_values": int(scores.hold_n.sum()),
            "mae": _num(_mean(scores.hold_ab.sum(), scores.hold_n.sum())),
            "mae_per_joint": {
                j: _num(v) for j, v in zip(joint_names, _mean(scores.hold_ab, scores.hold_n), strict=True)
            },
        },
    }


def skipped_to_dict(skipped: Counter) -> dict[str, Any]:
    return {"total": int(sum(skipped.values())), "reasons": dict(skipped.most_common())}
