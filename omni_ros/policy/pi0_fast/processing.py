"""Observations <-> pi0-FAST tensors, as LeRobot 0.6.1's `pi0_fast` pre- and post-processors do (DESIGN.md 8c).

images   the pi0 reference pipeline: float [0, 1], bilinear resize-with-pad (centred), x * 2 - 1; a declared
         camera the observation lacks is an image of -1 with its mask off (LeRobot appends it; a masked slot
         attends to nothing and advances no position, so keeping the declared slot is the same)
prompt   "Task: {task}, State: {bins};\\n" (no "Action: " suffix): the task stripped, "_" and "\\n" as spaces,
         bins = digitize(MEAN_STD-normalized state, linspace(-1, 1, 257)[:-1]) - 1 (not clipped: -1..255),
         only the robot's state dims; tokenized with BOS, right-padded to tokenizer max_tokens (200)
actions  the decoded chunk (n_action_steps, action_dim), un-normalized
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from omni_ros.observation import Observation, ObservationError
from omni_ros.policy.family_base import ChunkProcessor
from omni_ros.policy.inputs import ModelInputs, stack_inputs
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pi0.processing import resize_with_pad_float
from omni_ros.policy.pi0_fast.configuration import Pi0FastConfig
from omni_ros.policy.reference_images import camera_tiles
from omni_ros.policy.rtc import RtcError, RtcRequest
from omni_ros.policy.tokenizer import Tokenizer

RTC_REASON = (
    "pi0-FAST decodes its chunk as discrete tokens, which real-time chunking (guidance or inpainting of a "
    "flow-matching denoiser) cannot steer"
)


def fast_prompt(task: str, normalized_state: np.ndarray) -> str:
    bins = np.digitize(normalized_state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {cleaned}, State: {' '.join(str(int(b)) for b in bins)};\n"


class Pi0FastProcessor(ChunkProcessor[Pi0FastConfig]):
    def __init__(self, cfg: Pi0FastConfig, norm_stats: NormStats, tokenizer: Tokenizer) -> None:
        super().__init__(cfg, norm_stats, tokenizer)

    @property
    def noise_shape(self) -> tuple[int, int] | None:
        return None  # greedy decoding draws nothing

    def inputs(
        self,
        observations: Sequence[Observation],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> ModelInputs:
        cfg = self.cfg
        images, masks, tokens, token_masks, states = [], [], [], [], []
        for o in observations:
            if not any(o.image_masks[n] for n in cfg.camera_names):
                raise ObservationError(f"pi0-FAST needs at least one of its cameras {list(cfg.camera_names)}")
            images.append(camera_tiles(o, cfg.camera_names, cfg.vision.image_size, resize_with_pad_float))
            masks.append([o.image_masks[n] for n in cfg.camera_names])
            state = self.norm_stats.normalize_state(o.state)
            ids, valid = self.tokenizer.encode(fast_prompt(o.prompt, state), cfg.tokenizer.max_tokens)
            tokens.append(ids)
            token_masks.append(valid)
            states.append(state)
        return stack_inputs(images, masks, tokens, token_masks, states, device, dtype)

    def actions(self, normalized: np.ndarray, observation: Observation) -> np.ndarray:
        return self.norm_stats.unnormalize_actions(normalized[:, : self.cfg.action_dim]).astype(np.float32)

    def rtc_target(self, request: RtcRequest, observation: Observation) -> np.ndarray | None:
        raise RtcError(f"real-time chunking does not apply: {RTC_REASON}")
