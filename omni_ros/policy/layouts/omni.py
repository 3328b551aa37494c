"""omni_ros's own checkpoint layout: a directory with `config.json` and `model.safetensors`.

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
from safetensors.torch import save_file

from omni_ros.policy.layouts.common import Checkpoint, CheckpointError
from omni_ros.policy.layouts.weights import Placement, SafetensorsFile, load_weights
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.tokenizer import make_tokenizer
from omni_ros.typed_config import ConfigError

FORMAT = "omni_ros.pi0.v1"


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


def is_omni_checkpoint(path: Path) -> bool:
    """A directory whose config.json says it is in this format."""
    try:
        return json.loads((path / "config.json").read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read(path: str | Path) -> Checkpoint:
    """The family config, weights, norm stats and tokenizer of an omni_ros checkpoint directory."""
    path = Path(path)
    cfg, stats, extra = read_checkpoint_config(path)
    try:
        tokenizer = make_tokenizer(cfg.tokenizer, base_dir=path)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: tokenizer: {exc}") from exc
    return Checkpoint(
        path=path,
        layout="omni_ros",
        family="pi0",
        config=cfg,
        weights=path / "model.safetensors",
        norm_stats=stats,
        tokenizer=tokenizer,
        extra=extra,
    )


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> tuple[Pi0Model, NormStats, dict]:
    """Rebuild the model from config.json and load its weights, strictly."""
    checkpoint = read(path)
    file = SafetensorsFile(checkpoint.weights)
    model = load_weights(
        lambda: Pi0Model(checkpoint.config), file, Placement, torch.float32, str(checkpoint.config_file)
    )
    return model.to(device).eval(), checkpoint.norm_stats, checkpoint.extra
