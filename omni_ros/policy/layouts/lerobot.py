"""LeRobot's policy folder (`save_pretrained`, LeRobot >= 0.4; folders LeRobot <= 0.3 saved: lerobot_legacy.py).

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

from omni_ros.policy.layouts import lerobot_legacy
from omni_ros.policy.layouts.common import Checkpoint, CheckpointError
from omni_ros.policy.layouts.lerobot_files import features, norm_stats, processor_step, read_json
from omni_ros.policy.layouts.lerobot_pi0fast import read_pi0_fast
from omni_ros.policy.layouts.lerobot_smolvla import read_smolvla
from omni_ros.policy.layouts.lerobot_xvla import read_xvla
from omni_ros.policy.layouts.pi0_weights import architecture, our_shapes, placer
from omni_ros.policy.layouts.tokenizer_files import find_tokenizer
from omni_ros.policy.layouts.weights import SafetensorsFile

PI0_TYPES = ("pi0", "pi05")
SUPPORTED = (*PI0_TYPES, "pi0_fast", "smolvla", "xvla")


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


PALIGEMMA = "google/paligemma-3b-pt-224"  # the tokenizer LeRobot's pi0 names
# Options of LeRobot 0.3's pi0 that change what the model sees or returns and that omni_ros does not reproduce.
LEGACY_UNSUPPORTED = {
    "adapt_to_pi_aloha": "the pi-internal ALOHA joint space (joints 1, 2, 8, 9 flipped, grippers 6, 13 converted)",
    "use_delta_joint_actions_aloha": "delta ALOHA joint actions",
}


def era(path: Path) -> str:
    """ ">=0.4" for a folder with processor files, "<=0.3" for one whose weights hold the statistics."""
    if (path / "policy_preprocessor.json").is_file():
        return ">=0.4"
    if lerobot_legacy.has_stats_buffers(path):
        return lerobot_legacy.ERA
    raise CheckpointError(
        f"{path}: no policy_preprocessor.json (LeRobot >= 0.4) and no normalize_inputs / unnormalize_outputs "
        "statistics in model.safetensors (LeRobot <= 0.3): copy the whole folder save_pretrained wrote"
    )


def read(path: Path, tokenizer: Any = None) -> Checkpoint:
    config = read_json(path / "config.json")
    kind = policy_type(config, path / "config.json")
    if kind == "xvla":
        return read_xvla(path, config, tokenizer)  # LeRobot >= 0.5 only: its own processor files
    saved_by = era(path)
    if saved_by == lerobot_legacy.ERA and kind == "pi05":
        raise CheckpointError(f"{path}: pi05 did not exist before LeRobot 0.4; its folder needs processor files")
    if kind == "smolvla":
        return read_smolvla(path, config, tokenizer, saved_by)
    if kind == "pi0_fast":
        if saved_by == lerobot_legacy.ERA:
            raise CheckpointError(f"{path}: pi0_fast folders need LeRobot >= 0.4's processor files")
        return read_pi0_fast(path, config, tokenizer)
    return read_pi0(path, config, kind, tokenizer, saved_by)


def read_pi0(path: Path, config: dict, kind: str, tokenizer: Any, saved_by: str = ">=0.4") -> Checkpoint:
    from omni_ros.policy.pi0.configuration import ModelConfig, ProcessingConfig

    source = path / "config.json"
    legacy = saved_by == lerobot_legacy.ERA
    cameras, state_dim, action_dim = features(config, source)
    weights = path / "model.safetensors"
    file = SafetensorsFile(weights)
    keys = file.names()
    prefix = "model." if any(k.startswith("model.") for k in keys) else ""
    place = placer([k for k in keys if not k.startswith(lerobot_legacy.MODULES)], file.shape, prefix)
    if legacy:
        place = lerobot_legacy.skip_buffers(place)
        for option, what in LEGACY_UNSUPPORTED.items():
            if config.get(option):
                raise CheckpointError(f"{source}: {option} ({what}) is not supported by omni_ros")
        resize = config.get("resize_imgs_with_padding")
        if resize is not None and (len(resize) != 2 or resize[0] != resize[1]):
            raise CheckpointError(f"{source}: resize_imgs_with_padding {resize} is not a square tile")
        resolution = resize or [None]
    else:
        resolution = config.get("image_resolution") or [None]
    arch = architecture(our_shapes(keys, file.shape, place), resolution[0], str(weights))
    if arch.variant != ("pi05" if kind == "pi05" else "pi0"):
        raise CheckpointError(f"{path}: config.json says '{kind}' but the weights are a {arch.variant} model")
    if legacy and int(config.get("proj_width", arch.expert.width)) != arch.expert.width:
        raise CheckpointError(
            f"{path}: proj_width is {config.get('proj_width')} in the config but the expert is {arch.expert.width} wide"
        )
    if legacy:
        stats = lerobot_legacy.read_stats(path, config, state_dim, action_dim)
        hub_name = PALIGEMMA
    else:
        stats = norm_stats(path, config, state_dim, action_dim)
        tok_step = processor_step(path, "pre", "tokenizer_processor")
        hub_name = str(tok_step.get("config", {}).get("tokenizer_name") or "")
    found, origin, tok_cfg = find_tokenizer(path, tokenizer, hub_name, arch.vocab_size)
    tok_cfg.max_tokens = int(config.get("tokenizer_max_length") or (200 if kind == "pi05" else 48))
    # LeRobot 0.3's pi0 samples n_action_steps actions (its chunk_size is unused at inference), with num_steps.
    horizon = config.get("n_action_steps", 50) if legacy else config.get("chunk_size", 50)
    steps = config.get("num_steps", 10) if legacy else config.get("num_inference_steps", 10)
    model = ModelConfig(
        name=path.name,
        camera_names=cameras,
        state_dim=state_dim,
        action_dim=action_dim,
        action_horizon=int(horizon),
        num_steps=int(steps),
        euler_time="float32_accumulated" if legacy else "exact",
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
            lerobot_era="0.3" if legacy else "current",
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
        extra={"lerobot_type": kind, "lerobot_era": saved_by},
        place=place,
        tokenizer_source=origin,
    )
