"""LeRobot's policy folder (`save_pretrained`, LeRobot >= 0.4; pre-0.4 key paths too).

    config.json                 {"type": "pi0" | "pi05" | ..., "input_features", "output_features", ...}
    model.safetensors           the weights, under `model.`
    policy_preprocessor.json    its steps; the normalizer's `state_file` holds observation.state.{mean,std,q01,q99}
    policy_postprocessor.json   the unnormalizer's `state_file` holds action.{mean,std,q01,q99}
    (tokenizer.json)            not written by LeRobot; looked for here, or where tokenizer_files says

Cameras are named by `input_features` (`observation.images.<name>` -> `<name>`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omni_ros.policy.layouts.common import Checkpoint, CheckpointError
from omni_ros.policy.layouts.lerobot_files import features, norm_stats, processor_step, read_json
from omni_ros.policy.layouts.lerobot_smolvla import read_smolvla
from omni_ros.policy.layouts.pi0_weights import architecture, our_shapes, placer
from omni_ros.policy.layouts.tokenizer_files import find_tokenizer
from omni_ros.policy.layouts.weights import SafetensorsFile

PI0_TYPES = ("pi0", "pi05")
SUPPORTED = (*PI0_TYPES, "smolvla")


def is_lerobot(path: Path) -> bool:
    """A folder whose config.json names a LeRobot policy type."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("type"), str) and "input_features" in config


def policy_type(config: dict, source: Path) -> str:
    kind = config.get("type")
    if kind not in SUPPORTED:
        raise CheckpointError(
            f"{source}: LeRobot policy type '{kind}' is not supported; omni_ros runs {', '.join(SUPPORTED)}"
        )
    return kind


def absolute_dims(config: dict, action_dim: int) -> list[int]:
    """Action dims LeRobot keeps absolute under use_relative_actions (names matching relative_exclude_joints)."""
    names = config.get("action_feature_names")
    tokens = [str(t).lower() for t in config.get("relative_exclude_joints") or [] if t]
    if not config.get("use_relative_actions") or not names or not tokens:
        return []
    return [i for i, name in enumerate(names[:action_dim]) if any(t in str(name).lower() for t in tokens)]


def read(path: Path, tokenizer: Any = None) -> Checkpoint:
    config = read_json(path / "config.json")
    kind = policy_type(config, path / "config.json")
    if kind == "smolvla":
        return read_smolvla(path, config, tokenizer)
    return read_pi0(path, config, kind, tokenizer)


def read_pi0(path: Path, config: dict, kind: str, tokenizer: Any) -> Checkpoint:
    from omni_ros.policy.pi0.configuration import ModelConfig, ProcessingConfig

    source = path / "config.json"
    cameras, state_dim, action_dim = features(config, source)
    weights = path / "model.safetensors"
    file = SafetensorsFile(weights)
    keys = file.names()
    prefix = "model." if any(k.startswith("model.") for k in keys) else ""
    place = placer(keys, file.shape, prefix)
    resolution = config.get("image_resolution") or [None]
    arch = architecture(our_shapes(keys, file.shape, place), resolution[0], str(weights))
    if arch.variant != ("pi05" if kind == "pi05" else "pi0"):
        raise CheckpointError(f"{path}: config.json says '{kind}' but the weights are a {arch.variant} model")
    stats = norm_stats(path, config, state_dim, action_dim)
    tok_step = processor_step(path, "pre", "tokenizer_processor")
    hub_name = str(tok_step.get("config", {}).get("tokenizer_name") or "")
    found, origin, tok_cfg = find_tokenizer(path, tokenizer, hub_name, arch.vocab_size)
    tok_cfg.max_tokens = int(config.get("tokenizer_max_length") or (200 if kind == "pi05" else 48))
    model = ModelConfig(
        name=path.name,
        camera_names=cameras,
        state_dim=state_dim,
        action_dim=action_dim,
        action_horizon=int(config.get("chunk_size", 50)),
        num_steps=int(config.get("num_inference_steps", 10)),
        relative_actions=bool(config.get("use_relative_actions", False)),
        tokenizer=tok_cfg,
        max_state_dim=max(int(config.get("max_state_dim", state_dim)), arch.state_width, state_dim),
        **arch.model_fields(),
        time_min_period=float(config.get("min_period", 4e-3)),
        time_max_period=float(config.get("max_period", 4.0)),
        processing=ProcessingConfig(
            convention="reference",
            prompt_format="pi05" if kind == "pi05" else "newline",
            absolute_dims=absolute_dims(config, action_dim),
            require_first_camera=False,
        ),
    )
    return Checkpoint(
        path=path,
        layout="lerobot",
        family="pi0",
        config=model,
        weights=weights,
        norm_stats=stats,
        tokenizer=found,
        extra={"lerobot_type": kind},
        place=place,
        tokenizer_source=origin,
    )
