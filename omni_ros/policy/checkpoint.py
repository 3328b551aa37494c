"""Checkpoints: a directory with `config.json` and `model.safetensors`.

config.json holds everything needed to rebuild and run the model: the
architecture (cameras, dims, horizon, tokenizer included) and the
normalization statistics. Weights are plain safetensors.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from omni_ros.errors import OmniRosError
from omni_ros.policy.model import Pi0Model
from omni_ros.policy.model_config import ModelConfig
from omni_ros.policy.normalize import NormStats
from omni_ros.typed_config import ConfigError

FORMAT = "omni_ros.pi0.v1"


class CheckpointError(OmniRosError, RuntimeError):
    """A checkpoint is missing, truncated or does not match its config."""


def save_checkpoint(
    path: str | Path, model: Pi0Model, norm_stats: NormStats, extra: dict[str, Any] | None = None
) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "model": model.cfg.to_dict(), "norm_stats": asdict(norm_stats), "extra": extra or {}}
    # Write weights first and the config last, so a config.json never points at half-written weights.
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": FORMAT})
    (path / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    return path


def read_checkpoint_config(path: str | Path) -> tuple[ModelConfig, NormStats, dict[str, Any]]:
    """Architecture, norm stats and extra metadata, without loading weights."""
    path = Path(path)
    config_file = path / "config.json"
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {path}")
    if not config_file.is_file():
        raise CheckpointError(f"{path}: no config.json (is this an omni_ros checkpoint directory?)")
    try:
        meta = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_file}: not valid JSON: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{config_file}: format {meta.get('format')!r}, expected {FORMAT!r}")
    try:
        cfg = ModelConfig.from_dict(meta["model"], source=str(config_file))
        stats = NormStats(**meta["norm_stats"])
        stats.check(cfg.state_dim, cfg.action_dim)
    except (KeyError, TypeError, ValueError, ConfigError) as exc:
        raise CheckpointError(f"{config_file}: invalid: {exc}") from exc
    return cfg, stats, meta.get("extra", {})


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> tuple[Pi0Model, NormStats, dict]:
    """Rebuild the model from config.json and load its weights, strictly."""
    path = Path(path)
    cfg, stats, extra = read_checkpoint_config(path)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{path}: no model.safetensors")
    try:
        state = load_file(str(weights), device=str(device))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{weights}: cannot read weights (truncated or corrupt?): {exc}") from exc
    model = Pi0Model(cfg)
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
        raise CheckpointError(f"{weights} does not match {path / 'config.json'}: " + "; ".join(details))
    model.load_state_dict(state)
    return model.to(device).eval(), stats, extra
