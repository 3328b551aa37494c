"""LeRobot 0.6.1's `pi0_fast` folder -> the pi0-FAST family (DESIGN.md 8c).

config.json                 type "pi0_fast", features, n_action_steps (the decode horizon), max_decoding_steps,
                            tokenizer_max_length (200), action_tokenizer_name, fast_skip_tokens, ...
model.safetensors           PaliGemma under `model.paligemma_with_expert.paligemma.` (no expert); the token
                            embedding is lm_head (LeRobot copies lm_head over embed_tokens when loading)
policy_*processor.json      MEAN_STD statistics of state and actions, the text tokenizer's name
tokenizer.json              the PaliGemma tokenizer (not written by LeRobot; found as for pi0)
<action_tokenizer_name>/    the FAST tokenizer: tokenizer.json + processor_config.json; a relative name
                            ("./fast_tokenizer") is a folder of the checkpoint
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omni_ros.policy.layouts.common import Checkpoint, CheckpointError
from omni_ros.policy.layouts.lerobot_files import features, norm_stats, processor_step
from omni_ros.policy.layouts.pi0_weights import LANGUAGE, PALI, modern_key, our_shapes, placer, prefix_architecture
from omni_ros.policy.layouts.tokenizer_files import find_tokenizer, in_hf_cache
from omni_ros.policy.layouts.weights import Place, Placement, SafetensorsFile

FAST_HUB_DEFAULT = "lerobot/fast-action-tokenizer"  # LeRobot's default action_tokenizer_name


def fast_placer(keys: list[str], shapes: Any, prefix: str) -> Place:
    """pi0's placement plus what pi0-FAST uses: the final norm, and lm_head as the (tied) token embedding."""
    names = {k: modern_key(k[len(prefix) :] if prefix and k.startswith(prefix) else k) for k in keys}
    has_head = PALI + "lm_head.weight" in names.values()
    base = placer(keys, shapes, prefix)

    def place(key: str) -> Placement | None:
        name = names[key]
        if name.startswith(LANGUAGE + "norm."):
            return Placement("final_norm." + name.rsplit(".", 1)[1])
        if name == PALI + "lm_head.weight":
            return Placement("backbone.embed_tokens.weight")
        if has_head and name == LANGUAGE + "embed_tokens.weight":
            return None  # LeRobot overwrites it with lm_head
        return base(key)

    return place


def fast_folder(path: Path, name: str) -> Path:
    """The FAST tokenizer folder `action_tokenizer_name` names: relative to the checkpoint, absolute, or a hub
    name already in the local Hugging Face cache; else one line saying which files to put where."""
    candidates = [path / name] if not Path(name).is_absolute() else [Path(name)]
    for folder in candidates:
        if (folder / "tokenizer.json").is_file():
            return folder
    cached = in_hf_cache(name, ("processor_config.json",)) if name and not name.startswith(".") else None
    if cached is not None and (cached.parent / "tokenizer.json").is_file():
        return cached.parent
    where = candidates[0] if name.startswith(".") or Path(name).is_absolute() else path / "fast_tokenizer"
    hint = "" if where == candidates[0] else f' and set "action_tokenizer_name": "./{where.name}" in config.json'
    raise CheckpointError(
        f"{path}: no FAST action tokenizer ({name}); put its tokenizer.json and processor_config.json in {where}"
        f"{hint} (omni_ros never downloads it)"
    )


def read_pi0_fast(path: Path, config: dict, tokenizer: Any) -> Checkpoint:
    from omni_ros.policy.pi0_fast.configuration import FastTokenizerConfig, Pi0FastConfig
    from omni_ros.policy.pi0_fast.fast import read_fast_folder

    source = path / "config.json"
    cameras, state_dim, action_dim = features(config, source)
    weights = path / "model.safetensors"
    file = SafetensorsFile(weights)
    keys = file.names()
    prefix = "model." if any(k.startswith("model.") for k in keys) else ""
    place = fast_placer(keys, file.shape, prefix)
    resolution = config.get("image_resolution") or [None]
    vision, backbone, rows, _ = prefix_architecture(our_shapes(keys, file.shape, place), resolution[0], str(weights))
    stats = norm_stats(path, config, state_dim, action_dim)
    tok_step = processor_step(path, "pre", "tokenizer_processor")
    hub_name = str(tok_step.get("config", {}).get("tokenizer_name") or "")
    text, origin, tok_cfg = find_tokenizer(path, tokenizer, hub_name, rows)
    tok_cfg.max_tokens = int(config.get("tokenizer_max_length") or 200)
    tok: Any = text
    end_id = tok.token_id("|")
    if end_id is None:
        raise CheckpointError(f"tokenizer {origin} has no '|' piece: pi0-FAST's end-of-action marker")
    prefix_ids = [int(i) for i in tok.ids("Action: ", special=False)]
    skip = int(config.get("fast_skip_tokens", 128))
    name = str(config.get("action_tokenizer_name") or FAST_HUB_DEFAULT)
    folder = fast_folder(path, name)
    fast_cfg, bpe_size = read_fast_folder(folder)
    text_vocab = int(tok.base_vocab_size)
    top = text_vocab - 1 - skip
    low = top - (bpe_size - 1)
    reserved = {int(end_id), *prefix_ids[:2]}
    if low < 0 or top >= rows or any(low <= i <= top for i in reserved):
        raise CheckpointError(
            f"FAST tokenizer {folder} has {bpe_size} tokens: with text vocabulary {text_vocab} and fast_skip_tokens "
            f"{skip} they are PaliGemma ids {low}..{top}, which do not fit this model's action-token range "
            f"(ids 0..{rows - 1}, not the end marker {end_id} nor 'Action:' {prefix_ids[:2]}): not this model's "
            "FAST tokenizer"
        )
    horizon = int(config.get("n_action_steps", config.get("chunk_size", 50)))
    model = Pi0FastConfig(
        name=path.name,
        camera_names=cameras,
        state_dim=state_dim,
        action_dim=action_dim,
        action_horizon=horizon,
        num_steps=1,  # no denoising: one greedy decode per chunk
        vision=vision,
        backbone=backbone,
        tokenizer=tok_cfg,
        vocab_size=rows,
        text_vocab_size=text_vocab,
        bos_id=int(tok.ids("", special=True)[0]) if tok.ids("", special=True) else 2,
        end_id=int(end_id),
        action_prefix_ids=prefix_ids,
        validate_action_prefix=bool(config.get("validate_action_token_prefix", True)),
        max_decoding_steps=int(config.get("max_decoding_steps", 256)),
        fast=FastTokenizerConfig(
            path=os.fspath(folder.resolve()),
            scale=float(fast_cfg.get("scale", 10)),
            vocab_size=bpe_size,
            min_token=int(fast_cfg.get("min_token", 0)),
            skip_tokens=skip,
        ),
    )
    if config.get("use_relative_actions"):
        raise CheckpointError(f"{source}: use_relative_actions is not supported for pi0_fast by omni_ros yet")
    if float(config.get("temperature", 0.0)) != 0.0:
        raise CheckpointError(f"{source}: temperature {config.get('temperature')}: omni_ros decodes greedily only")
    return Checkpoint(
        path=path,
        layout="lerobot",
        family="pi0_fast",
        config=model,
        weights=weights,
        norm_stats=stats,
        tokenizer=text,
        extra={"lerobot_type": "pi0_fast", "lerobot_era": ">=0.4", "fast_tokenizer": str(folder)},
        place=place,
        tokenizer_source=origin,
    )
