"""What every checkpoint layout produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_ros.errors import OmniRosError
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.tokenizer import Tokenizer


class CheckpointError(OmniRosError, RuntimeError):
    """A checkpoint is missing, truncated, of an unknown layout or does not match its config."""


@dataclass
class Checkpoint:
    """A checkpoint folder read by its layout adapter: everything needed to build and run the policy."""

    path: Path
    layout: str  # "omni_ros", "lerobot", "openpi"
    family: str  # the model family that runs it (omni_ros.policy.families)
    config: Any  # that family's model config
    weights: Path  # the safetensors file
    norm_stats: NormStats
    tokenizer: Tokenizer | None
    extra: dict[str, Any] = field(default_factory=dict)
    # file tensor name -> where it goes in the family's model (omni_ros.policy.layouts.weights.Placement);
    # None: the names are the model's own.
    place: Any = None
    # Where the tokenizer came from (shown by `omni-ros policy info`).
    tokenizer_source: str = ""

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"
