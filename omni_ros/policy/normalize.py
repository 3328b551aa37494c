"""State/action normalization with statistics stored in (or next to) the checkpoint.

Two modes, each with the epsilon rule of the tool that trained the checkpoint:

    mean_std   (x - mean) / std            omni_ros: std clamped at 1e-6; LeRobot: std + 1e-8; openpi: std + 1e-6
    quantile   2 (x - q01) / (q99 - q01) - 1   (pi0.5)  LeRobot: eps only where q99 == q01; openpi: + 1e-6
    min_max    (x - min) / (max - min + eps) * 2 - 1   LeRobot's MIN_MAX (LeRobot 0.3's default for states)

The inverse is the exact inverse each tool applies (LeRobot un-normalizes with the bare std, openpi with
std + eps), so actions come back in the units the robot was recorded in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

EpsRule = Literal["clamp", "lerobot", "openpi"]
Mode = Literal["mean_std", "quantile", "min_max"]
EPS = {"clamp": 1e-6, "lerobot": 1e-8, "openpi": 1e-6}


@dataclass
class NormStats:
    """Per-dimension statistics of states and actions (identity when not fitted)."""

    state_mean: list[float]
    state_std: list[float]
    action_mean: list[float]
    action_std: list[float]
    state_mode: Mode = "mean_std"
    action_mode: Mode = "mean_std"
    eps_rule: EpsRule = "clamp"
    # quantile mode: the 1st and 99th percentiles
    state_q01: list[float] | None = None
    state_q99: list[float] | None = None
    action_q01: list[float] | None = None
    action_q99: list[float] | None = None
    # min_max mode: the range seen in the data
    state_min: list[float] | None = None
    state_max: list[float] | None = None
    action_min: list[float] | None = None
    action_max: list[float] | None = None

    @classmethod
    def identity(cls, state_dim: int, action_dim: int) -> NormStats:
        return cls([0.0] * state_dim, [1.0] * state_dim, [0.0] * action_dim, [1.0] * action_dim)

    @classmethod
    def fit(cls, states: np.ndarray, actions: np.ndarray) -> NormStats:
        """From arrays (N, state_dim) and (N, ..., action_dim)."""
        actions = actions.reshape(-1, actions.shape[-1])
        return cls(states.mean(0).tolist(), states.std(0).tolist(), actions.mean(0).tolist(), actions.std(0).tolist())

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        return self._forward(state, "state")

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        return self._forward(actions, "action")

    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        x = np.asarray(actions, dtype=np.float64)
        if self.action_mode == "min_max":
            low, span = self._range("action")
            return ((x + 1.0) / 2.0 * span + low).astype(np.float32)
        if self.action_mode == "quantile":
            low, span = self._quantiles("action")
            if self.eps_rule == "openpi":
                span = span + EPS["openpi"]
            return ((x + 1.0) * span / 2.0 + low).astype(np.float32)
        std = np.asarray(self.action_std, dtype=np.float64)
        if self.eps_rule == "clamp":
            std = np.maximum(std, EPS["clamp"])
        elif self.eps_rule == "openpi":
            std = std + EPS["openpi"]
        return (x * std + np.asarray(self.action_mean)).astype(np.float32)

    def _forward(self, x: np.ndarray, part: str) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if getattr(self, f"{part}_mode") == "min_max":
            low, span = self._range(part)
            return ((x - low) / (span + EPS[self.eps_rule]) * 2.0 - 1.0).astype(np.float32)
        if getattr(self, f"{part}_mode") == "quantile":
            low, span = self._quantiles(part)
            if self.eps_rule == "openpi":
                span = span + EPS["openpi"]
            else:
                # A dimension that never moved: its span is 0; divide by eps instead (as LeRobot does).
                span = np.where(span == 0, EPS[self.eps_rule], span)
            return (2.0 * (x - low) / span - 1.0).astype(np.float32)
        mean = np.asarray(getattr(self, f"{part}_mean"), dtype=np.float64)
        std = np.asarray(getattr(self, f"{part}_std"), dtype=np.float64)
        # A joint that never moved in the data has std 0; dividing by it would blow up.
        std = np.maximum(std, EPS["clamp"]) if self.eps_rule == "clamp" else std + EPS[self.eps_rule]
        return ((x - mean) / std).astype(np.float32)

    def _quantiles(self, part: str) -> tuple[np.ndarray, np.ndarray]:
        low = np.asarray(getattr(self, f"{part}_q01"), dtype=np.float64)
        high = np.asarray(getattr(self, f"{part}_q99"), dtype=np.float64)
        return low, high - low

    def _range(self, part: str) -> tuple[np.ndarray, np.ndarray]:
        low = np.asarray(getattr(self, f"{part}_min"), dtype=np.float64)
        high = np.asarray(getattr(self, f"{part}_max"), dtype=np.float64)
        return low, high - low

    def check(self, state_dim: int, action_dim: int) -> None:
        sizes = {"state_mean": state_dim, "state_std": state_dim, "action_mean": action_dim, "action_std": action_dim}
        for part, dim in (("state", state_dim), ("action", action_dim)):
            mode = getattr(self, f"{part}_mode")
            if mode == "quantile":
                sizes.update({f"{part}_q01": dim, f"{part}_q99": dim})
            elif mode == "min_max":
                sizes.update({f"{part}_min": dim, f"{part}_max": dim})
            elif mode != "mean_std":
                raise ValueError(f"norm_stats.{part}_mode '{mode}' is not one of 'mean_std', 'quantile', 'min_max'")
        if self.eps_rule not in EPS:
            raise ValueError(f"norm_stats.eps_rule '{self.eps_rule}' is not one of {sorted(EPS)}")
        for name, size in sizes.items():
            values = getattr(self, name)
            if values is None:
                raise ValueError(f"norm_stats.{name} is missing (needed by {name.split('_')[0]} normalization)")
            if len(values) != size:
                raise ValueError(f"norm_stats.{name} has {len(values)} values, expected {size}")
            if not np.all(np.isfinite(values)):
                raise ValueError(f"norm_stats.{name} has non-finite values")
