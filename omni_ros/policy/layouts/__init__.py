"""Checkpoint layouts: each adapter turns a folder into a `Checkpoint` (family config, weights, norm stats,
tokenizer), so a policy family never knows which tool wrote the folder.

    omni.py      omni_ros's own (config.json with "format": "omni_ros.pi0.v1" + model.safetensors)
"""

from __future__ import annotations

from pathlib import Path

from omni_ros.policy.layouts import omni
from omni_ros.policy.layouts.common import Checkpoint, CheckpointError

__all__ = ["Checkpoint", "CheckpointError", "detect", "read"]


def detect(path: str | Path) -> str:
    """The layout name of checkpoint folder `path`, or a CheckpointError that says what the folder lacks."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {path}")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: no config.json (is this an omni_ros checkpoint directory?)")
    if omni.is_omni_checkpoint(path):
        return "omni_ros"
    # Not one we know: let the omni_ros reader say what is wrong with its config.json.
    return "omni_ros"


def read(path: str | Path) -> Checkpoint:
    """Read checkpoint folder `path` with the adapter of its layout."""
    layout = detect(path)
    readers = {"omni_ros": omni.read}
    return readers[layout](path)
