"""The Policy contract shared by every backend and every entry point.

    policy.infer({"images": {...}, "state": ..., "prompt": ...}, noise=None)
        -> {"actions": (horizon, action_dim) float32, "policy_timing": {...}}

`noise`, when given, is the flow-matching noise (action_horizon, model_action_dim),
openpi's convention; without it a policy draws its own (seeded or not).
Every backend (torch, ExecuTorch, remote) is an `InferencePipeline`
(omni_ros.policy.pipeline); callers never know which one they hold.
`infer_batch` lets a server batch concurrent requests; its results must equal
calling `infer` on each observation alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    # Shape of the explicit noise `infer` takes (action_horizon, model action dim); None: not accepted.
    noise_shape: tuple[int, int] | None = None
    # What the GEMMs compute in and why, e.g. "int8 (onednn): avx512_vnni" (omni_ros/policy/precision).
    precision: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["camera_names"] = list(self.camera_names)
        if self.noise_shape is not None:
            data["noise_shape"] = list(self.noise_shape)
        return data


@runtime_checkable
class Policy(Protocol):
    spec: ObservationSpec
    metadata: PolicyMetadata

    def infer(self, obs: Mapping[str, Any], *, noise: Any = None) -> dict[str, Any]: ...

    def infer_batch(self, observations: Sequence[Mapping[str, Any]], *, noise: Any = None) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class BasePolicy:
    """Convenience base: `infer_batch` as a loop over `infer`; backends may do better."""

    spec: ObservationSpec
    metadata: PolicyMetadata

    def infer(self, obs: Mapping[str, Any], *, noise: Any = None) -> dict[str, Any]:
        raise NotImplementedError

    def infer_batch(self, observations: Sequence[Mapping[str, Any]], *, noise: Any = None) -> list[dict[str, Any]]:
        noises = [None] * len(observations) if noise is None else list(noise)
        return [self.infer(obs, noise=n) for obs, n in zip(observations, noises, strict=True)]

    def close(self) -> None:
        """Release resources (threads, connections); safe to call twice."""
