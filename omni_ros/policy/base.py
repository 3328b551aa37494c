"""The Policy contract shared by every backend and every entry point.

    policy.infer({"images": {...}, "state": ..., "prompt": ...})
        -> {"actions": (horizon, action_dim) float32, "policy_timing": {...}}

Backends (torch, ExecuTorch, remote) implement `infer`; callers never know
which one they hold. `infer_batch` lets a server batch concurrent requests;
its results must equal calling `infer` on each observation alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from omni_ros.observation import ObservationSpec


@dataclass(frozen=True)
class PolicyMetadata:
    """What a client needs to know about a policy (sent as the OpenPI metadata frame)."""

    model: str
    backend: str
    camera_names: tuple[str, ...]
    image_size: int
    state_dim: int
    action_dim: int
    action_horizon: int
    action_dt: float = 0.02

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["camera_names"] = list(self.camera_names)
        return data


@runtime_checkable
class Policy(Protocol):
    spec: ObservationSpec
    metadata: PolicyMetadata

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]: ...

    def infer_batch(self, observations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]: ...


class BasePolicy:
    """Convenience base: `infer_batch` as a loop over `infer`; backends may do better."""

    spec: ObservationSpec
    metadata: PolicyMetadata

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def infer_batch(self, observations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self.infer(obs) for obs in observations]

    def close(self) -> None:
        """Release resources (threads, connections); safe to call twice."""
