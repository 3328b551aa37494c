"""What every checkpoint layout produces, and the strict weight load they share."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

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

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"


def read_tensors(weights: Path, rename: Any = None) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, with keys passed through `rename(key) -> key | None` (None: skip)."""
    if not weights.is_file():
        raise CheckpointError(f"{weights.parent}: no {weights.name}")
    try:
        with safe_open(str(weights), framework="pt") as f:
            out = {}
            for key in f.keys():  # noqa: SIM118 (safe_open handles are not mappings)
                name = key if rename is None else rename(key)
                if name is not None:
                    out[name] = f.get_tensor(key)
            return out
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{weights}: cannot read weights (truncated or corrupt?): {exc}") from exc


def load_strict(model: nn.Module, weights: Path | dict[str, torch.Tensor], source: Path | str) -> None:
    """Load `weights` into `model`: every tensor present, none extra, every shape equal, or one clear error."""
    state = read_tensors(weights) if isinstance(weights, Path) else weights
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k}: {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or unexpected or wrong:
        details = []
        if missing:
            details.append(f"missing {len(missing)} tensors (e.g. {missing[:3]})")
        if unexpected:
            details.append(f"{len(unexpected)} unexpected tensors (e.g. {unexpected[:3]})")
        if wrong:
            details.append(f"{len(wrong)} shape mismatches (checkpoint vs config, e.g. {wrong[:3]})")
        where = weights if isinstance(weights, Path) else "the weights"
        raise CheckpointError(f"{where} does not match {source}: " + "; ".join(details))
    model.load_state_dict(state)
