"""Validated observations -> model input tensors. Shared by inference and training,
so a policy is trained on exactly the preprocessing it runs with."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from omni_ros.observation import Observation
from omni_ros.policy.model_config import ModelConfig
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.tokenizer import Tokenizer


def model_inputs(
    cfg: ModelConfig,
    tokenizer: Tokenizer,
    norm_stats: NormStats,
    observations: Sequence[Observation],
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """images (B, C, 3, S, S) in [-1, 1], image_masks (B, C), tokens/token_mask (B, T), state (B, Ds) normalized."""
    names = cfg.camera_names
    images = np.stack([np.stack([o.images[n] for n in names]) for o in observations])  # (B, C, S, S, 3) uint8
    masks = np.array([[o.image_masks[n] for n in names] for o in observations], dtype=bool)
    encoded = [tokenizer.encode(o.prompt, cfg.tokenizer.max_tokens) for o in observations]
    states = np.stack([norm_stats.normalize_state(o.state) for o in observations])
    pixels = torch.from_numpy(images).to(device).permute(0, 1, 4, 2, 3).to(dtype) / 127.5 - 1.0
    return {
        "images": pixels,
        "image_masks": torch.from_numpy(masks).to(device),
        "tokens": torch.from_numpy(np.stack([t for t, _ in encoded])).to(device),
        "token_mask": torch.from_numpy(np.stack([m for _, m in encoded])).to(device),
        "state": torch.from_numpy(states).to(device, dtype),
    }
