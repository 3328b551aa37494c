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
from omni_ros.policy.layouts.pi0_weights import architecture, our_shapes, placer
from omni_ros.policy.layouts.tokenizer_files import find_tokenizer
from omni_ros.policy.layouts.weights import SafetensorsFile
from omni_ros.policy.normalize import Mode, NormStats

IMAGE_PREFIX = "observation.images."
STATE, ACTION = "observation.state", "action"
PI0_TYPES = ("pi0", "pi05")
SUPPORTED = (*PI0_TYPES, "smolvla")
MODES: dict[str, Mode] = {"MEAN_STD": "mean_std", "QUANTILES": "quantile", "IDENTITY": "mean_std"}


def is_lerobot(path: Path) -> bool:
    """A folder whose config.json names a LeRobot policy type."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("type"), str) and "input_features" in config


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: no {path.name}")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from exc


def policy_type(config: dict, source: Path) -> str:
    kind = config.get("type")
    if kind not in SUPPORTED:
        raise CheckpointError(
            f"{source}: LeRobot policy type '{kind}' is not supported; omni_ros runs {', '.join(SUPPORTED)}"
        )
    return kind


def features(config: dict, source: Path) -> tuple[list[str], int, int]:
    """(camera names, state dim, action dim) from input_/output_features (and `empty_cameras`)."""
    inputs, outputs = config.get("input_features") or {}, config.get("output_features") or {}
    cameras = [k[len(IMAGE_PREFIX) :] for k, f in inputs.items() if f.get("type") == "VISUAL"]
    cameras += [f"empty_camera_{i}" for i in range(int(config.get("empty_cameras") or 0))]
    cameras = list(dict.fromkeys(cameras))  # empty cameras may already be listed
    if not cameras:
        raise CheckpointError(f"{source}: input_features declare no camera (VISUAL feature)")
    try:
        state_dim = int(inputs[STATE]["shape"][0])
        action_dim = int(outputs[ACTION]["shape"][0])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: input_features/output_features lack '{exc.args[0]}' shapes") from exc
    return cameras, state_dim, action_dim


def processor_step(folder: Path, which: str, registry_name: str) -> dict:
    """The step `registry_name` of policy_<which>processor.json."""
    pipeline = read_json(folder / f"policy_{which}processor.json")
    for step in pipeline.get("steps", []):
        if step.get("registry_name") == registry_name:
            return step
    raise CheckpointError(f"{folder}/policy_{which}processor.json has no '{registry_name}' step")


def stats_file(folder: Path, step: dict) -> dict[str, list[float]]:
    """The tensors of a (un)normalizer step's state_file, as lists."""
    name = step.get("state_file")
    if not name or not (folder / name).is_file():
        raise CheckpointError(
            f"{folder}: the normalization statistics file '{name}' named by the processor is missing "
            "(copy the whole folder LeRobot's save_pretrained wrote)"
        )
    file = SafetensorsFile(folder / name)
    return {key: file.view(key).float().flatten().tolist() for key in file.names()}


def norm_stats(folder: Path, config: dict, state_dim: int, action_dim: int) -> NormStats:
    """Mean/std or quantile statistics of state and action from the processor files, with LeRobot's epsilon."""
    pre = processor_step(folder, "pre", "normalizer_processor")
    post = processor_step(folder, "post", "unnormalizer_processor")
    mapping = {**(config.get("normalization_mapping") or {}), **(pre.get("config", {}).get("norm_map") or {})}
    state_stats, action_stats = stats_file(folder, pre), stats_file(folder, post)
    for side, stats, key in (("STATE", state_stats, STATE), ("ACTION", action_stats, ACTION)):
        if mapping.get(side, "MEAN_STD") not in MODES:
            raise CheckpointError(f"{folder}: normalization '{mapping.get(side)}' of {side} is not supported")
        if mapping.get(side, "MEAN_STD") != "IDENTITY" and f"{key}.mean" not in stats and f"{key}.q01" not in stats:
            raise CheckpointError(f"{folder}: the processor statistics have no '{key}' entries")

    def part(stats: dict, key: str, stat: str, dim: int, default: float) -> list[float]:
        return stats.get(f"{key}.{stat}", [default] * dim)

    identity_state = mapping.get("STATE") == "IDENTITY"
    identity_action = mapping.get("ACTION") == "IDENTITY"
    eps = float(pre.get("config", {}).get("eps", 1e-8))
    if abs(eps - 1e-8) > 1e-12:
        raise CheckpointError(f"{folder}: normalizer eps {eps} (omni_ros knows LeRobot's 1e-8)")
    return NormStats(
        state_mean=[0.0] * state_dim if identity_state else part(state_stats, STATE, "mean", state_dim, 0.0),
        state_std=[1.0] * state_dim if identity_state else part(state_stats, STATE, "std", state_dim, 1.0),
        action_mean=[0.0] * action_dim if identity_action else part(action_stats, ACTION, "mean", action_dim, 0.0),
        action_std=[1.0] * action_dim if identity_action else part(action_stats, ACTION, "std", action_dim, 1.0),
        state_mode=MODES[mapping.get("STATE", "MEAN_STD")],
        action_mode=MODES[mapping.get("ACTION", "MEAN_STD")],
        eps_rule="clamp" if identity_state and identity_action else "lerobot",
        state_q01=state_stats.get(f"{STATE}.q01"),
        state_q99=state_stats.get(f"{STATE}.q99"),
        action_q01=action_stats.get(f"{ACTION}.q01"),
        action_q99=action_stats.get(f"{ACTION}.q99"),
    )


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
        from omni_ros.policy.layouts.lerobot_smolvla import read_smolvla

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
