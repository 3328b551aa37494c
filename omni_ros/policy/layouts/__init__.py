"""Checkpoint layouts: each adapter turns a folder into a `Checkpoint` (family config, weights, norm stats,
tokenizer), so a policy family never knows which tool wrote the folder.

    omni.py      omni_ros's own (config.json with "format": "omni_ros.pi0.v1" + model.safetensors)
    lerobot.py   LeRobot's save_pretrained folder (config.json with "type", processor files)
    openpi.py    openpi's PyTorch checkpoint (un-prefixed weights, assets/<id>/norm_stats.json)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni_ros.policy.layouts import lerobot, omni, openpi
from omni_ros.policy.layouts.common import Checkpoint, CheckpointError
from omni_ros.policy.layouts.weights import Placement, SafetensorsFile, load_weights

__all__ = ["Checkpoint", "CheckpointError", "build_model", "detect", "read"]


def detect(path: str | Path) -> str:
    """The layout name of checkpoint folder `path`, or a CheckpointError that says what the folder lacks."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {path}")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: no config.json (not an omni_ros, LeRobot or openpi checkpoint folder)")
    if omni.is_omni_checkpoint(path):
        return "omni_ros"
    if lerobot.is_lerobot(path):
        return "lerobot"
    if openpi.is_openpi(path):
        return "openpi"
    try:
        config = json.loads((path / "config.json").read_text())
    except ValueError:
        return "omni_ros"  # its reader says what is wrong with the JSON
    if isinstance(config, dict) and "format" in config:
        return "omni_ros"  # its reader names the unknown format
    raise CheckpointError(
        f"{path}: not a checkpoint folder omni_ros knows: expected an omni_ros checkpoint (config.json with "
        '"format"), a LeRobot policy folder (config.json with "type" and input_features) or an openpi PyTorch '
        "checkpoint (model.safetensors + assets/<id>/norm_stats.json)"
    )


def read(path: str | Path, tokenizer: Any = None) -> Checkpoint:
    """Read checkpoint folder `path` with the adapter of its layout (`tokenizer`: a Tokenizer, file or folder
    for a reference checkpoint, which ships none)."""
    path = Path(path)
    layout = detect(path)
    if layout == "omni_ros":
        return omni.read(path)
    return {"lerobot": lerobot.read, "openpi": openpi.read}[layout](path, tokenizer)


def build_model(checkpoint: Checkpoint, build: Callable[[], nn.Module], dtype: torch.dtype = torch.float32):
    """`build()` with the checkpoint's weights bound (memory-mapped where the dtype matches), strictly."""
    place = checkpoint.place or Placement
    return load_weights(build, SafetensorsFile(checkpoint.weights), place, dtype, str(checkpoint.config_file))
