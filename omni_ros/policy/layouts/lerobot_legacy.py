"""LeRobot policy folders saved before 0.4 (LeRobot 0.1-0.3): no processor files, the statistics in the weights.

    config.json         {"type": "pi0" | "smolvla", "input_features", "output_features", "normalization_mapping",
                         "n_action_steps", "resize_imgs_with_padding", "tokenizer_max_length", ...}
    model.safetensors   the model under `model.`, and top-level float32 statistics buffers:
                        normalize_inputs.buffer_observation_state.{mean,std | min,max}
                        normalize_targets.buffer_action.*      (training only)
                        unnormalize_outputs.buffer_action.*    (what inference un-normalizes with)

A buffer is named `"buffer_" + feature_key.replace(".", "_")`, which cannot be inverted (`wrist_cam` and
`wrist.cam` give the same name): names are mapped forward from the feature keys config.json declares. The mode
of each feature type comes from `normalization_mapping` (LeRobot 0.3's defaults where it is absent; a type not
listed is IDENTITY). A checkpoint saved before training set its statistics still holds their +inf initial value:
refused, as LeRobot 0.3 refuses to run it.

Such a checkpoint was trained with LeRobot 0.3's preprocessing, so it is served with it (the family's processor
takes `lerobot_era="0.3"`): see omni_ros.policy.pi0.processing and omni_ros.policy.smolvla.processing.
"""

from __future__ import annotations

import math
from pathlib import Path

from omni_ros.policy.layouts.common import CheckpointError
from omni_ros.policy.layouts.weights import Place, SafetensorsFile
from omni_ros.policy.normalize import Mode, NormStats

ERA = "<=0.3"
MODULES = ("normalize_inputs.", "normalize_targets.", "unnormalize_outputs.")
# LeRobot 0.3's PreTrainedConfig-wide defaults, for a config.json without normalization_mapping.
DEFAULT_MAPPING = {"VISUAL": "MEAN_STD", "STATE": "MIN_MAX", "ACTION": "MEAN_STD"}
MODES: dict[str, Mode | None] = {"MEAN_STD": "mean_std", "MIN_MAX": "min_max", "IDENTITY": None}
STATS = {"mean_std": ("mean", "std"), "min_max": ("min", "max")}
STATE, ACTION = "observation.state", "action"


def has_stats_buffers(path: Path) -> bool:
    """Whether the folder's weights carry LeRobot 0.3's statistics buffers."""
    weights = path / "model.safetensors"
    if not weights.is_file():
        return False
    return any(key.startswith(MODULES) for key in SafetensorsFile(weights).names())


def skip_buffers(place: Place) -> Place:
    """`place` with the statistics buffers left out of the model."""
    return lambda key: None if key.startswith(MODULES) else place(key)


def modes(config: dict, source: Path) -> dict[str, Mode | None]:
    """Feature type -> normalization mode (None: IDENTITY) of a pre-0.4 config."""
    mapping = config.get("normalization_mapping")
    if mapping is None:
        mapping = DEFAULT_MAPPING
    if not isinstance(mapping, dict):
        raise CheckpointError(f"{source}: normalization_mapping is not a mapping of feature type to mode")
    out: dict[str, Mode | None] = {}
    for kind, mode in mapping.items():
        if mode not in MODES:
            raise CheckpointError(
                f"{source}: normalization_mapping {kind} is '{mode}', not a mode LeRobot 0.3 knows ({', '.join(MODES)})"
            )
        out[kind] = MODES[mode]
    return out


def read_stats(path: Path, config: dict, state_dim: int, action_dim: int) -> NormStats:
    """State and action statistics from the weights' buffers, checked against config.json's features."""
    source = path / "config.json"
    weights = path / "model.safetensors"
    file = SafetensorsFile(weights)
    inputs, outputs = config.get("input_features") or {}, config.get("output_features") or {}
    declared = {**inputs, **outputs}
    by_buffer = {"buffer_" + key.replace(".", "_"): key for key in declared}
    found: dict[str, dict[str, list[float]]] = {"normalize_inputs.": {}, "unnormalize_outputs.": {}}
    for name in file.names():
        module = next((m for m in MODULES if name.startswith(m)), None)
        if module is None:
            continue
        buffer, _, stat = name[len(module) :].rpartition(".")
        feature = by_buffer.get(buffer)
        if feature is None:
            raise CheckpointError(
                f"{weights}: statistics '{name}' belong to no feature config.json declares "
                f"(declared: {', '.join(declared) or 'none'})"
            )
        values = file.view(name).float().flatten().tolist()
        if not all(math.isfinite(v) for v in values):
            raise CheckpointError(
                f"{weights}: statistics '{name}' are still +inf, their initial value: the policy was saved before "
                "its statistics were set (LeRobot refuses to run it too); save it again with the dataset's stats"
            )
        if module in found:
            found[module][f"{feature}.{stat}"] = values
    mapping = modes(config, source)
    for key, features_of in ((STATE, inputs), (ACTION, outputs)):
        kind = (features_of.get(key) or {}).get("type")
        if kind is None:
            raise CheckpointError(f"{source}: no '{key}' feature declared")
    visual = [k for k, f in inputs.items() if f.get("type") == "VISUAL"]
    if visual and mapping.get("VISUAL") is not None:
        raise CheckpointError(
            f"{source}: normalization_mapping VISUAL is not IDENTITY: omni_ros does not normalize camera images "
            "(pi0 and SmolVLA checkpoints leave them as they are)"
        )

    def part(module: str, key: str, dim: int, mode: Mode | None) -> dict[str, list[float]]:
        if mode is None:
            return {}
        stats = {}
        for stat in STATS[mode]:
            values = found[module].get(f"{key}.{stat}")
            if values is None:
                buffer = "buffer_" + key.replace(".", "_")
                raise CheckpointError(
                    f"{weights}: no '{module}{buffer}.{stat}' for the {mode.upper()} normalization of '{key}'"
                )
            if len(values) != dim:
                raise CheckpointError(f"{weights}: '{key}.{stat}' has {len(values)} values, the feature {dim}")
            stats[stat] = values
        return stats

    state_mode, action_mode = mapping.get("STATE"), mapping.get("ACTION")
    state = part("normalize_inputs.", STATE, state_dim, state_mode)
    action = part("unnormalize_outputs.", ACTION, action_dim, action_mode)
    return NormStats(
        state_mean=state.get("mean", [0.0] * state_dim),
        state_std=state.get("std", [1.0] * state_dim),
        action_mean=action.get("mean", [0.0] * action_dim),
        action_std=action.get("std", [1.0] * action_dim),
        state_mode=state_mode or "mean_std",
        action_mode=action_mode or "mean_std",
        eps_rule="clamp" if state_mode is None and action_mode is None else "lerobot",
        state_min=state.get("min"),
        state_max=state.get("max"),
        action_min=action.get("min"),
        action_max=action.get("max"),
    )
