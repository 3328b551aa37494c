"""A LeRobot <= 0.3 policy folder rewritten in the layout of LeRobot >= 0.4 (`omni-ros checkpoint migrate`).

    config.json                  the fields LeRobot 0.6.1's config of the type knows (pi0: num_steps ->
                                 num_inference_steps, resize_imgs_with_padding -> image_resolution, chunk_size =
                                 n_action_steps, the horizon 0.3's pi0 sampled; fields 0.6.1 lacks are dropped)
    model.safetensors            the weights without the statistics buffers (pi0 key paths as today's)
    policy_preprocessor.json     LeRobot's pre-processor steps; its normalizer's state file holds the inputs' and
    + step_N_normalizer .safetensors   targets' statistics as `<feature key>.<stat>` (`observation.images.wrist_cam`
                                 stays as declared: names come from config.json's features, never from buffer names)
    policy_postprocessor.json    the unnormalizer and its state file (the `unnormalize_outputs` statistics)
    everything else              copied (tokenizer files, a local vlm_model_name folder)

The result is served as LeRobot >= 0.4 serves it: 0.6's image padding (centred for pi0), prompt truncation and
sampler. For square frames and prompts within tokenizer_max_length that agrees with 0.3 to ~1e-4 (the sampler's
time steps); otherwise serve the original folder, which omni_ros runs with 0.3's preprocessing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from omni_ros.policy.layouts import lerobot, lerobot_legacy
from omni_ros.policy.layouts.common import CheckpointError
from omni_ros.policy.layouts.lerobot_files import features, read_json
from omni_ros.policy.layouts.pi0_weights import modern_key
from omni_ros.policy.layouts.weights import SafetensorsFile

# The fields of LeRobot 0.6.1's configs that a 0.3 config.json of the type also has (kept as they are).
COMMON = (
    "type", "n_obs_steps", "input_features", "output_features", "device", "use_amp", "push_to_hub", "repo_id",
    "private", "tags", "license", "chunk_size", "n_action_steps", "normalization_mapping", "max_state_dim",
    "max_action_dim", "empty_cameras", "tokenizer_max_length", "freeze_vision_encoder", "train_expert_only",
    "optimizer_lr", "optimizer_betas", "optimizer_eps", "optimizer_weight_decay", "optimizer_grad_clip_norm",
    "scheduler_warmup_steps", "scheduler_decay_steps", "scheduler_decay_lr",
)  # fmt: skip
SMOLVLA_ONLY = (
    "resize_imgs_with_padding", "adapt_to_pi_aloha", "use_delta_joint_actions_aloha", "num_steps", "use_cache",
    "train_state_proj", "vlm_model_name", "load_vlm_weights", "add_image_special_tokens", "attention_mode",
    "prefix_length", "pad_language_to", "num_expert_layers", "num_vlm_layers", "self_attn_every_n_layers",
    "expert_width_multiplier", "min_period", "max_period",
)  # fmt: skip
NORMALIZER, UNNORMALIZER = "normalizer_processor", "unnormalizer_processor"


def _config(old: dict, kind: str) -> tuple[dict, list[str]]:
    """(the 0.6.1 config.json, the old fields left out)."""
    keep = COMMON + (SMOLVLA_ONLY if kind == "smolvla" else ())
    new = {k: old[k] for k in keep if k in old}
    if kind == "pi0":
        steps = int(old.get("n_action_steps", old.get("chunk_size", 50)))
        new["chunk_size"] = new["n_action_steps"] = steps
        new["num_inference_steps"] = int(old.get("num_steps", 10))
        resize = old.get("resize_imgs_with_padding") or [224, 224]
        new["image_resolution"] = list(resize)
        # LeRobot 0.6.1 names its variants; the widths come from the weights (0.3's pi0 was gemma_2b / 300m).
        new["paligemma_variant"], new["action_expert_variant"], new["dtype"] = "gemma_2b", "gemma_300m", "float32"
        new["min_period"], new["max_period"] = 4e-3, 4.0  # 0.3's pi0 hard-coded these
    renamed = {"num_steps", "resize_imgs_with_padding"} if kind == "pi0" else set()
    dropped = sorted(set(old) - set(new) - renamed)
    return new, dropped


def _stats(file: SafetensorsFile, config: dict, module: str) -> dict[str, Any]:
    """`<feature key>.<stat>` -> tensor of the buffers of `module`, names mapped forward from the features."""
    declared = {**(config.get("input_features") or {}), **(config.get("output_features") or {})}
    by_buffer = {"buffer_" + key.replace(".", "_"): key for key in declared}
    out = {}
    for name in file.names():
        if name.startswith(module):
            buffer, _, stat = name[len(module) :].rpartition(".")
            out[f"{by_buffer[buffer]}.{stat}"] = file.view(name).clone().contiguous()
    return out


def _steps(kind: str, config: dict, tokenizer_name: str) -> tuple[list[dict], list[dict]]:
    """LeRobot 0.6.1's pre- and post-processor steps for `kind` (the normalizers' state files named by index)."""
    feats = {**(config.get("input_features") or {}), **(config.get("output_features") or {})}
    mapping = config.get("normalization_mapping") or lerobot_legacy.DEFAULT_MAPPING
    norm = {"eps": 1e-8, "features": feats, "norm_map": mapping}
    tokenizer = {
        "max_length": int(config.get("tokenizer_max_length", 48)),
        "task_key": "task",
        "padding_side": "right",
        "padding": "max_length" if kind == "pi0" else str(config.get("pad_language_to", "longest")),
        "truncation": True,
        "tokenizer_name": tokenizer_name,
    }
    device = {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}
    pre = [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": f"{kind}_new_line_processor", "config": {}},
        {"registry_name": "tokenizer_processor", "config": tokenizer},
        device,
    ]
    post = [{"registry_name": UNNORMALIZER, "config": {**norm, "features": config.get("output_features") or {}}}]
    if kind == "pi0":
        relative = {"enabled": False, "exclude_joints": ["gripper"], "action_names": None}
        pre.append({"registry_name": "relative_actions_processor", "config": relative})
        post.append({"registry_name": "absolute_actions_processor", "config": {"enabled": False}})
    pre.append({"registry_name": NORMALIZER, "config": norm})
    post.append(device)
    return pre, post


def migrate(old: Path, new: Path, force: bool = False) -> dict[str, Any]:
    """Write `old` (a LeRobot <= 0.3 folder) to `new` in LeRobot >= 0.4's layout; returns what was done."""
    old, new = Path(old), Path(new)
    config = read_json(old / "config.json")
    kind = lerobot.policy_type(config, old / "config.json")
    if lerobot.era(old) != lerobot_legacy.ERA:
        raise CheckpointError(f"{old}: already in LeRobot >= 0.4's layout (it has policy_preprocessor.json)")
    if kind not in ("pi0", "smolvla"):
        raise CheckpointError(f"{old}: a LeRobot <= 0.3 '{kind}' folder; omni_ros migrates pi0 and smolvla")
    for option, what in lerobot.LEGACY_UNSUPPORTED.items():
        if config.get(option):
            raise CheckpointError(f"{old}/config.json: {option} ({what}) has no LeRobot >= 0.4 equivalent")
    _, state_dim, action_dim = features(config, old / "config.json")
    lerobot_legacy.read_stats(old, config, state_dim, action_dim)  # every check the loader makes
    if new.exists():
        if not force:
            raise CheckpointError(f"{new} exists (--force replaces it)")
        if new.resolve() == old.resolve():
            raise CheckpointError("--out must differ from the folder migrated")
    # Written beside the target and renamed at the end: a failure leaves no half-written checkpoint under `new`.
    final, new = new, new.with_name(new.name + ".partial")
    if new.exists():
        shutil.rmtree(new)
    new.mkdir(parents=True)
    try:
        report = _write(old, new, config, kind, file=SafetensorsFile(old / "model.safetensors"))
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    new.rename(final)
    return {"type": kind, "from": str(old), "to": str(final), **report}


def _write(old: Path, new: Path, config: dict, kind: str, file: SafetensorsFile) -> dict[str, Any]:
    from safetensors.torch import save_file

    for item in old.iterdir():  # tokenizer files, a local SmolVLM folder, a README
        if item.name in ("config.json", "model.safetensors"):
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, new / item.name)

    tensors = {}
    for name in file.names():
        if name.startswith(lerobot_legacy.MODULES):
            continue
        key = name
        if kind == "pi0":
            prefix = "model." if name.startswith("model.") else ""
            key = prefix + modern_key(name[len(prefix) :])
        tensors[key] = file.view(name).clone().contiguous()
    save_file(tensors, str(new / "model.safetensors"), {"format": "pt"})

    new_config, dropped = _config(config, kind)
    (new / "config.json").write_text(json.dumps(new_config, indent=4) + "\n")
    name = lerobot.PALIGEMMA if kind == "pi0" else str(config.get("vlm_model_name") or "")
    pre, post = _steps(kind, config, name)
    written = []
    for which, steps, stats in (
        ("pre", pre, {**_stats(file, config, "normalize_inputs."), **_stats(file, config, "normalize_targets.")}),
        ("post", post, _stats(file, config, "unnormalize_outputs.")),
    ):
        for index, step in enumerate(steps):
            if step["registry_name"] in (NORMALIZER, UNNORMALIZER):
                state_file = f"policy_{which}processor_step_{index}_{step['registry_name']}.safetensors"
                step["state_file"] = state_file
                save_file(stats, str(new / state_file))
                written.append(state_file)
        doc = {"name": f"policy_{which}processor", "steps": steps}
        (new / f"policy_{which}processor.json").write_text(json.dumps(doc, indent=2) + "\n")
    return {
        "tensors": len(tensors),
        "statistics_files": written,
        "dropped_config_fields": dropped,
    }
