"""openpi's PyTorch checkpoint folder (its JAX -> PyTorch conversion, `save_model`):

    model.safetensors               the weights, the same tree as LeRobot's without the `model.` prefix
                                    (the token embedding only as `paligemma.lm_head`), bf16 by default
    config.json                     {"action_dim": 32, "action_horizon": 50, "paligemma_variant", ...}
    assets/<asset id>/norm_stats.json   {"norm_stats": {"state": {mean, std, q01, q99}, "actions": {...}}}

openpi's conventions: cameras base_0_rgb / left_wrist_0_rgb / right_wrist_0_rgb, mean/std normalization
for pi0 and quantiles for pi0.5, both with +1e-6 in and out; the pi0 prompt cleaned (underscores and
newlines as spaces) with "\\n" tokenized after it; 48 prompt tokens for pi0, 200 for pi0.5; 10 steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omni_ros.policy.layouts.common import Checkpoint, CheckpointError
from omni_ros.policy.layouts.lerobot_files import read_json
from omni_ros.policy.layouts.pi0_weights import PALI, architecture, our_shapes, placer
from omni_ros.policy.layouts.tokenizer_files import find_tokenizer
from omni_ros.policy.layouts.weights import SafetensorsFile
from omni_ros.policy.normalize import NormStats

CAMERAS = ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
TOKENIZER_REPO = "google/paligemma-3b-pt-224"


def is_openpi(path: Path) -> bool:
    """model.safetensors with openpi's un-prefixed tree and a norm_stats.json under assets/."""
    weights = path / "model.safetensors"
    if not weights.is_file() or not any((path / "assets").glob("**/norm_stats.json")):
        return False
    try:
        with open(weights, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(min(length, 64 << 20)))
    except (OSError, ValueError):
        return False
    return any(key.startswith(PALI) for key in header)


def norm_stats_file(path: Path) -> Path:
    found = sorted((path / "assets").glob("**/norm_stats.json"))
    if len(found) != 1:
        names = [str(p.parent.relative_to(path / "assets")) for p in found]
        raise CheckpointError(f"{path}/assets: expected one norm_stats.json, found {len(found)} ({names})")
    return found[0]


def norm_stats(file: Path, quantile: bool) -> NormStats:
    data = read_json(file).get("norm_stats", {})
    try:
        state, actions = data["state"], data["actions"]
        return NormStats(
            state_mean=list(state["mean"]),
            state_std=list(state["std"]),
            action_mean=list(actions["mean"]),
            action_std=list(actions["std"]),
            state_mode="quantile" if quantile else "mean_std",
            action_mode="quantile" if quantile else "mean_std",
            eps_rule="openpi",
            state_q01=state.get("q01"),
            state_q99=state.get("q99"),
            action_q01=actions.get("q01"),
            action_q99=actions.get("q99"),
        )
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"{file}: no norm_stats.{exc.args[0]} (expected state and actions statistics)") from exc


def read(path: Path, tokenizer: Any = None) -> Checkpoint:
    from omni_ros.policy.pi0.configuration import ModelConfig, ProcessingConfig

    config = read_json(path / "config.json")
    weights = path / "model.safetensors"
    file = SafetensorsFile(weights)
    keys = file.names()
    place = placer(keys, file.shape)
    arch = architecture(our_shapes(keys, file.shape, place), None, str(weights))
    pi05 = arch.variant == "pi05"
    stats_path = norm_stats_file(path)
    stats = norm_stats(stats_path, quantile=pi05)
    found, origin, tok_cfg = find_tokenizer(path, tokenizer, TOKENIZER_REPO, arch.vocab_size)
    tok_cfg.max_tokens = 200 if pi05 else 48
    state_dim, action_dim = len(stats.state_mean), len(stats.action_mean)
    model = ModelConfig(
        name=path.name,
        camera_names=list(CAMERAS),
        state_dim=state_dim,
        action_dim=action_dim,
        action_horizon=int(config.get("action_horizon", 50)),
        num_steps=10,
        tokenizer=tok_cfg,
        max_state_dim=max(arch.state_width, int(config.get("action_dim", 32)), state_dim),
        **arch.model_fields(),
        processing=ProcessingConfig(
            convention="reference", prompt_format="pi05" if pi05 else "openpi", require_first_camera=False
        ),
    )
    return Checkpoint(
        path=path,
        layout="openpi",
        family="pi0",
        config=model,
        weights=weights,
        norm_stats=stats,
        tokenizer=found,
        extra={"asset_id": str(stats_path.parent.relative_to(path / "assets"))},
        place=place,
        tokenizer_source=origin,
    )
