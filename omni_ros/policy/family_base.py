"""What every model family shares: the robot side of its config, and the plumbing of its processor.

A family's config subclasses `ChunkConfig` (adding its architecture and `observation_spec`); its processor
subclasses `ChunkProcessor` (adding `inputs`, `actions` and `rtc_target`, the family's own conventions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Self, TypeVar

from omni_ros.observation import Observation, ObservationSpec, make_observation
from omni_ros.policy.base import PolicyMetadata
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.sampler import EulerTime
from omni_ros.typed_config import from_dict, to_dict


@dataclass
class ChunkConfig:
    """The robot side of a flow-matching chunk policy: cameras, dims, chunk timing, sampling steps."""

    # The model family (omni_ros.policy.families) that runs this config: each subclass names its own.
    family: ClassVar[str]
    name: str = "small"
    camera_names: list[str] = field(default_factory=lambda: ["base", "wrist"])
    state_dim: int = 8
    action_dim: int = 8
    action_horizon: int = 50
    # Seconds between consecutive actions of a chunk (50 Hz by default).
    action_dt: float = 0.02
    num_steps: int = 10
    # How the Euler sampler steps t (omni_ros.policy.sampler.EulerTime): LeRobot <= 0.3 checkpoints accumulate it.
    euler_time: EulerTime = "exact"

    @property
    def model_action_dim(self) -> int:
        """Width of the actions the model samples (the robot's are the first action_dim)."""
        return self.action_dim

    def observation_spec(self) -> ObservationSpec:
        """What a policy of this architecture consumes (each family says which cameras it requires)."""
        return ObservationSpec(camera_names=tuple(self.camera_names), state_dim=self.state_dim)

    def policy_metadata(self, model: str, backend: str) -> PolicyMetadata:
        spec = self.observation_spec()
        return PolicyMetadata(
            model=model,
            backend=backend,
            camera_names=tuple(self.camera_names),
            image_size=spec.image_size,
            state_dim=self.state_dim,
            action_dim=self.action_dim,
            action_horizon=self.action_horizon,
            action_dt=self.action_dt,
            noise_shape=(self.action_horizon, self.model_action_dim),
        )

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict, source: str = "<config>") -> Self:
        return from_dict(cls, data, source=source)


ConfigT = TypeVar("ConfigT", bound=ChunkConfig)


class ChunkProcessor(Generic[ConfigT]):
    """A processor's config, norm stats and tokenizer, its metadata and its observation parsing."""

    # Whether parsing already makes the square uint8 tile (our convention); the reference conventions resize
    # the float image themselves.
    tile: ClassVar[bool] = False

    def __init__(self, cfg: ConfigT, norm_stats: NormStats, tokenizer: Any) -> None:
        norm_stats.check(cfg.state_dim, cfg.action_dim)
        self.cfg = cfg
        self.norm_stats = norm_stats
        self.tokenizer = tokenizer
        self.spec: ObservationSpec = cfg.observation_spec()

    @property
    def noise_shape(self) -> tuple[int, int] | None:
        """(action_horizon, model action dim): the shape of one request's explicit noise (openpi's)."""
        return (self.cfg.action_horizon, self.cfg.model_action_dim)

    def metadata(self, name: str, backend: str) -> PolicyMetadata:
        return self.cfg.policy_metadata(name, backend)

    def parse(self, raw: Mapping[str, Any]) -> Observation:
        return make_observation(self.spec, raw, tile=self.tile)
