"""Built-in architectures of the pi0 family: `tiny` (tests), `demo` (the shipped sim policy), `small`, `pi0`."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from omni_ros.policy.pi0.configuration import ModelConfig, TokenizerConfig, TransformerConfig, VisionConfig
from omni_ros.policy.pi0.modeling import Pi0Model

# Every word of the simulator's prompts (omni_ros.sim.task); anything else maps to the unknown token.
DEMO_VOCABULARY = (
    *("reach", "touch", "move", "go", "put", "point", "at", "to", "on", "the", "gripper", "block", "cube"),
    *("red", "green", "blue", "yellow", "purple", "orange", "cyan"),
)


def _tiny() -> ModelConfig:
    return ModelConfig(
        name="tiny",
        action_horizon=8,
        num_steps=4,
        vision=VisionConfig(image_size=32, patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64),
        backbone=TransformerConfig(width=32, depth=2, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64),
        expert=TransformerConfig(width=16, depth=2, num_heads=1, num_kv_heads=1, head_dim=16, mlp_dim=32),
        tokenizer=TokenizerConfig(max_tokens=16),
    )


def _demo() -> ModelConfig:
    # The built-in demo (checkpoints/demo): the simulated 3-joint arm, sized to train on a 2-core CPU in
    # about 20 minutes. 48 px tiles in 8 px patches keep a 5 cm block about two pixels wide in the top-down
    # view and give 36 tokens per camera; one token per prompt word (the color is one token).
    return ModelConfig(
        name="demo",
        camera_names=["base", "wrist"],
        state_dim=3,
        action_dim=3,
        action_horizon=16,
        action_dt=0.05,
        num_steps=5,
        relative_actions=True,
        goal_head=True,
        vision=VisionConfig(
            image_size=48,
            patch_size=8,
            width=64,
            depth=2,
            num_heads=2,
            mlp_dim=128,
            keypoints=16,
            keypoints_only=True,
            film=True,
        ),
        backbone=TransformerConfig(width=128, depth=2, num_heads=4, num_kv_heads=1, head_dim=32, mlp_dim=256),
        expert=TransformerConfig(width=64, depth=2, num_heads=2, num_kv_heads=1, head_dim=32, mlp_dim=128),
        tokenizer=TokenizerConfig(kind="words", max_tokens=12, vocab=list(DEMO_VOCABULARY)),
        vocab_size=32,
    )


def _small() -> ModelConfig:
    return ModelConfig(name="small")


def _pi0() -> ModelConfig:
    # pi0 dimensions: PaliGemma (So400m/14 at 224 -> 256 tokens, Gemma 2B) + a 300M-class expert.
    return ModelConfig(
        name="pi0",
        camera_names=["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"],
        state_dim=32,
        action_dim=32,
        vision=VisionConfig(image_size=224, patch_size=14, width=1152, depth=27, num_heads=16, mlp_dim=4304),
        backbone=TransformerConfig(width=2048, depth=18, num_heads=8, num_kv_heads=1, head_dim=256, mlp_dim=16384),
        expert=TransformerConfig(width=1024, depth=18, num_heads=8, num_kv_heads=1, head_dim=256, mlp_dim=4096),
        tokenizer=TokenizerConfig(kind="bytes", max_tokens=48),
        vocab_size=257_152,
    )


PRESETS = {"tiny": _tiny, "demo": _demo, "small": _small, "pi0": _pi0}


def preset(name: str, **overrides) -> ModelConfig:
    """A built-in architecture, with top-level fields (cameras, dims, horizon, ...) overridden."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset '{name}'; choose one of {sorted(PRESETS)}")
    config = PRESETS[name]()
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if "camera_names" in overrides:
        overrides["camera_names"] = list(overrides["camera_names"])
    return dataclasses.replace(config, **overrides)


def build_preset(name: str, weights_seed: int = 0, **overrides: Any) -> Pi0Model:
    """A model of preset `name` with random weights drawn from `weights_seed` (the global RNG is untouched)."""
    return seeded_model(preset(name, **overrides), weights_seed)


def seeded_model(cfg: ModelConfig, seed: int) -> Pi0Model:
    """A model of `cfg` with random weights drawn from `seed` (the global RNG is untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Pi0Model(cfg)
