"""The files of LeRobot's policy folder every LeRobot family reads the same way: config.json's features and the
processor files' normalization statistics (lerobot.py reads pi0 / pi0.5 folders, lerobot_smolvla.py SmolVLA's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omni_ros.policy.layouts.common import CheckpointError
from omni_ros.policy.layouts.weights import SafetensorsFile
from omni_ros.policy.normalize import Mode, NormStats

IMAGE_PREFIX = "observation.images."
STATE, ACTION = "observation.state", "action"
MODES: dict[str, Mode] = {
    "MEAN_STD": "mean_std",
    "QUANTILES": "quantile",
    "MIN_MAX": "min_max",
    "IDENTITY": "mean_std",
}


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: no {path.name}")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from exc


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
        if mapping.get(side, "MEAN_STD") != "IDENTITY" and not any(
            f"{key}.{s}" in stats for s in ("mean", "q01", "min")
        ):
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
        state_min=state_stats.get(f"{STATE}.min"),
        state_max=state_stats.get(f"{STATE}.max"),
        action_min=action_stats.get(f"{ACTION}.min"),
        action_max=action_stats.get(f"{ACTION}.max"),
    )
