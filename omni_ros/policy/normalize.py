"""State/action normalization with statistics stored in the checkpoint."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class NormStats:
    """Per-dimension mean/std of states and actions (identity when not fitted)."""

    state_mean: list[float]
    state_std: list[float]
    action_mean: list[float]
    action_std: list[float]

    @classmethod
    def identity(cls, state_dim: int, action_dim: int) -> NormStats:
        return cls([0.0] * state_dim, [1.0] * state_dim, [0.0] * action_dim, [1.0] * action_dim)

    @classmethod
    def fit(cls, states: np.ndarray, actions: np.ndarray) -> NormStats:
        """From arrays (N, state_dim) and (N, ..., action_dim)."""
        actions = actions.reshape(-1, actions.shape[-1])
        return cls(states.mean(0).tolist(), states.std(0).tolist(), actions.mean(0).tolist(), actions.std(0).tolist())

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        return ((state - np.asarray(self.state_mean)) / _safe(self.state_std)).astype(np.float32)

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        return ((actions - np.asarray(self.action_mean)) / _safe(self.action_std)).astype(np.float32)

    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        return (actions * _safe(self.action_std) + np.asarray(self.action_mean)).astype(np.float32)

    def check(self, state_dim: int, action_dim: int) -> None:
        sizes = {"state_mean": state_dim, "state_std": state_dim, "action_mean": action_dim, "action_std": action_dim}
        for name, size in sizes.items():
            values = getattr(self, name)
            if len(values) != size:
                raise ValueError(f"norm_stats.{name} has {len(values)} values, expected {size}")
            if not np.all(np.isfinite(values)):
                raise ValueError(f"norm_stats.{name} has non-finite values")


def _safe(std: list[float]) -> np.ndarray:
    # A joint that never moved in the data has std 0; dividing by it would blow up.
    return np.maximum(np.asarray(std, dtype=np.float64), 1e-6)
