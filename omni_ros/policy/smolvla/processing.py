"""Observations <-> SmolVLA's tensors, step for step as LeRobot 0.6.1 prepares them.

images   uint8 -> float [0, 1] -> bilinear resize to fit the square tile (no antialias, sizes truncated),
         zero padding at the LEFT and TOP (not centred as pi0) -> x * 2 - 1. A declared camera the
         observation lacks is left out of the prefix (LeRobot drops it): here its slot stays, with its mask
         off, which the model treats exactly as absent (see omni_ros.policy.smolvla.modeling)
state    normalized with the checkpoint's statistics (LeRobot's epsilon), zero-padded to max_state_dim
prompt   as given plus "\n", tokenized with the checkpoint's tokenizer as it is (SmolVLM's adds no BOS),
         cut from the LEFT to tokenizer max_tokens (the prompt's end is kept), right-padded to the
         batch's longest (LeRobot's "longest"; a static program pads to max_tokens, identical under the mask)
actions  the first action_dim of the model's output, un-normalized
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from omni_ros.observation import Observation
from omni_ros.policy.family_base import ChunkProcessor
from omni_ros.policy.inputs import ModelInputs, stack_inputs
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.reference_images import camera_tiles, resize_with_pad_left_top
from omni_ros.policy.rtc import RtcRequest, normalized_plan
from omni_ros.policy.smolvla.configuration import SmolVLAConfig
from omni_ros.policy.tokenizer import Tokenizer


class SmolVLAProcessor(ChunkProcessor[SmolVLAConfig]):
    def __init__(self, cfg: SmolVLAConfig, norm_stats: NormStats, tokenizer: Tokenizer) -> None:
        for method in ("ids", "pad"):
            if not hasattr(tokenizer, method):
                raise TypeError(f"SmolVLA needs a file tokenizer (tokenizer.json), got {type(tokenizer).__name__}")
        super().__init__(cfg, norm_stats, tokenizer)

    def tokenize(self, prompt: str) -> list[int]:
        """Token ids of the prompt as LeRobot's SmolVLA writes it (a trailing newline), the last max_tokens kept."""
        tok: Any = self.tokenizer
        ids = tok.ids(prompt if prompt.endswith("\n") else prompt + "\n")
        if self.cfg.lerobot_era == "0.3":
            return ids  # LeRobot 0.3 passed max_length without truncation: a longer prompt stays whole
        return ids[-self.cfg.tokenizer.max_tokens :]

    def inputs(
        self,
        observations: Sequence[Observation],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> ModelInputs:
        cfg, size = self.cfg, self.cfg.tile_size
        images, masks, states, prompts = [], [], [], []
        for o in observations:
            images.append(camera_tiles(o, cfg.camera_names, size, resize_with_pad_left_top))
            masks.append([o.image_masks[n] for n in cfg.camera_names])
            state = self.norm_stats.normalize_state(o.state)
            states.append(np.pad(state, (0, cfg.max_state_dim - cfg.state_dim)))
            prompts.append(self.tokenize(o.prompt))
        longest = max(1, max(len(ids) for ids in prompts))
        tok: Any = self.tokenizer  # a file tokenizer (checked in __init__), which pads
        padded = [tok.pad(ids, longest) for ids in prompts]
        return stack_inputs(images, masks, [t for t, _ in padded], [m for _, m in padded], states, device, dtype)

    def actions(self, normalized: np.ndarray, observation: Observation) -> np.ndarray:
        return self.norm_stats.unnormalize_actions(normalized[:, : self.cfg.action_dim])

    def rtc_target(self, request: RtcRequest, observation: Observation) -> np.ndarray:
        """The old plan of a real-time-chunking request in model units (H, max_action_dim): `actions` inverted."""
        cfg = self.cfg
        return normalized_plan(
            request, cfg.action_horizon, cfg.action_dim, cfg.max_action_dim, self.norm_stats.normalize_actions
        )
