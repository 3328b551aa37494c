"""Observations <-> the pi0 family's tensors.

`Pi0Processor` is omni_ros's own convention (shared by inference and training, so a policy is trained on
exactly the preprocessing it runs with). `ReferenceProcessor` reproduces how LeRobot and openpi prepare
pi0 / pi0.5 inputs, so their checkpoints see exactly the inputs they were trained on (the choices are data,
`ModelConfig.processing`, and the checkpoint layout that read the folder sets them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from omni_ros.observation import Observation
from omni_ros.policy.family_base import ChunkProcessor
from omni_ros.policy.inputs import ModelInputs, stack_inputs
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.policy.reference_images import camera_tiles, resize_with_pad_left_top
from omni_ros.policy.rtc import RtcRequest, normalized_plan
from omni_ros.policy.tokenizer import Tokenizer, make_tokenizer


class Pi0Processor(ChunkProcessor[ModelConfig]):
    """Raw observation -> `ModelInputs`, and normalized model output -> robot actions.

    Tiles are uint8 resize-with-pad (`make_observation`), pixels x / 127.5 - 1, the state normalized with the
    checkpoint's statistics; actions are un-normalized and, with `relative_actions`, added to the state.
    """

    tile = True  # parsing makes the uint8 tile

    def __init__(self, cfg: ModelConfig, norm_stats: NormStats, tokenizer: Tokenizer | None = None) -> None:
        super().__init__(cfg, norm_stats, tokenizer or make_tokenizer(cfg.tokenizer))

    def inputs(
        self,
        observations: Sequence[Observation],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> ModelInputs:
        return model_inputs(self.cfg, self.tokenizer, self.norm_stats, observations, device, dtype)

    def actions(self, normalized: np.ndarray, observation: Observation) -> np.ndarray:
        return robot_actions(self.cfg, self.norm_stats, normalized, observation.state)

    def rtc_target(self, request: RtcRequest, observation: Observation) -> np.ndarray:
        """The old plan of a real-time-chunking request in model units (H, action_dim): `actions` inverted."""
        return plan_target(self.cfg, self.norm_stats, request, observation, self.cfg.action_dim)


def model_inputs(
    cfg: ModelConfig,
    tokenizer: Tokenizer,
    norm_stats: NormStats,
    observations: Sequence[Observation],
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> ModelInputs:
    """images (B, C, 3, S, S) in [-1, 1], image_masks (B, C), tokens/token_mask (B, T), state (B, Ds) normalized."""
    names = cfg.camera_names
    images = np.stack([np.stack([o.images[n] for n in names]) for o in observations])  # (B, C, S, S, 3) uint8
    masks = np.array([[o.image_masks[n] for n in names] for o in observations], dtype=bool)
    encoded = [tokenizer.encode(o.prompt, cfg.tokenizer.max_tokens) for o in observations]
    states = np.stack([norm_stats.normalize_state(o.state) for o in observations])
    pixels = torch.from_numpy(images).to(device).permute(0, 1, 4, 2, 3).to(dtype) / 127.5 - 1.0
    return ModelInputs(
        images=pixels,
        image_masks=torch.from_numpy(masks).to(device),
        tokens=torch.from_numpy(np.stack([t for t, _ in encoded])).to(device),
        token_mask=torch.from_numpy(np.stack([m for _, m in encoded])).to(device),
        state=torch.from_numpy(states).to(device, dtype),
    )


def action_targets(cfg: ModelConfig, norm_stats: NormStats, actions: np.ndarray, states: np.ndarray) -> np.ndarray:
    """Robot-unit chunks (B, H, action_dim) -> the normalized targets the model learns.

    With `relative_actions`, the target is the chunk minus the state the model sees (B, state_dim), per joint and
    broadcast over the horizon; `robot_actions` is the inverse.
    """
    return norm_stats.normalize_actions(_relative(cfg, actions, states, -1.0))


def robot_actions(cfg: ModelConfig, norm_stats: NormStats, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
    """One normalized model output (H, action_dim) -> robot-unit actions, given the observation's state."""
    return _relative(cfg, norm_stats.unnormalize_actions(actions), state, 1.0).astype(np.float32)


def plan_target(
    cfg: ModelConfig, norm_stats: NormStats, request: RtcRequest, observation: Observation, width: int
) -> np.ndarray:
    """An RTC request's old plan (robot units) as the normalized chunk the model would have produced (H, width)."""
    state = np.asarray(observation.state, dtype=np.float32)[None]
    return normalized_plan(
        request,
        cfg.action_horizon,
        cfg.action_dim,
        width,
        lambda plan: action_targets(cfg, norm_stats, plan[None], state)[0],
    )


def fit_norm_stats(cfg: ModelConfig, states: np.ndarray, actions: np.ndarray) -> NormStats:
    """Statistics of states (N, state_dim) and of the targets the model learns (deltas when relative)."""
    return NormStats.fit(states, _relative(cfg, actions, states, -1.0))


def _relative(cfg: ModelConfig, actions: np.ndarray, states: np.ndarray, sign: float) -> np.ndarray:
    if not cfg.relative_actions:
        return actions
    if cfg.action_dim > cfg.state_dim:
        raise ValueError(f"relative_actions needs action_dim <= state_dim, got {cfg.action_dim} > {cfg.state_dim}")
    # The first action_dim state entries are the joint positions the actions command.
    offset = np.array(np.asarray(states, dtype=np.float32)[..., None, : cfg.action_dim])
    # Dims kept absolute (a gripper, typically) get no offset.
    offset[..., cfg.processing.absolute_dims] = 0.0
    return (actions + sign * offset).astype(np.float32)


class ReferenceProcessor(ChunkProcessor[ModelConfig]):
    """LeRobot's / openpi's pi0 and pi0.5 input pipeline, step for step.

    `processing.lerobot_era` "0.3" (a checkpoint LeRobot <= 0.3 saved) pads images at the left and top instead
    of centred and never truncates the prompt; a missing camera, which LeRobot 0.3 dropped, keeps its masked
    slot, which attends to nothing and advances no position: the same actions.

    images   uint8 -> float [0, 1] -> bilinear resize-with-pad to the model's square size (sizes truncated,
             centred zero padding) -> x * 2 - 1; a declared camera the observation lacks is an image of -1
             with its mask off (the reference's empty camera)
    state    normalized with the checkpoint's statistics (mean/std or quantiles, the tool's epsilon), then
             zero-padded to the model's width
    prompt   as given, plus "\n" (pi0) or written as pi0.5's "Task: ..., State: <bins>;\nAction: ", tokenized
             with the checkpoint's tokenizer (BOS, no lowercasing), right-padded to tokenizer max_tokens
    actions  the first action_dim of the model's output, un-normalized (and made absolute if relative)
    """

    def __init__(self, cfg: ModelConfig, norm_stats: NormStats, tokenizer: Tokenizer) -> None:
        super().__init__(cfg, norm_stats, tokenizer)

    def tokenize(self, observation: Observation, normalized_state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and mask of the observation's prompt, written as the checkpoint's tool writes it."""
        fmt, max_tokens, text = self.cfg.processing.prompt_format, self.cfg.tokenizer.max_tokens, observation.prompt
        if fmt == "newline" and self.cfg.processing.lerobot_era == "0.3":
            # LeRobot 0.3 padded to max_length without truncation: a longer prompt stays whole.
            tok: Any = self.tokenizer
            ids = tok.ids(text if text.endswith("\n") else text + "\n")
            return tok.pad(ids, max(max_tokens, len(ids)))
        if fmt == "newline":
            return self.tokenizer.encode(text if text.endswith("\n") else text + "\n", max_tokens)
        if fmt == "pi05":
            return self.tokenizer.encode(pi05_prompt(text, normalized_state), max_tokens)
        if fmt == "openpi":
            # openpi tokenizes the cleaned task (with BOS) and the "\n" separately.
            tok = self.tokenizer
            cleaned = text.strip().replace("_", " ").replace("\n", " ")
            return tok.pad(tok.ids(cleaned) + tok.ids("\n", special=False), max_tokens)
        return self.tokenizer.encode(text, max_tokens)

    def inputs(
        self,
        observations: Sequence[Observation],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> ModelInputs:
        cfg, size = self.cfg, self.cfg.vision.image_size
        resize = resize_with_pad_left_top if cfg.processing.lerobot_era == "0.3" else resize_with_pad_float
        images, masks, tokens, token_masks, states = [], [], [], [], []
        for o in observations:
            images.append(camera_tiles(o, cfg.camera_names, size, resize))
            masks.append([o.image_masks[n] for n in cfg.camera_names])
            state = self.norm_stats.normalize_state(o.state)
            ids, valid = self.tokenize(o, state)
            tokens.append(ids)
            token_masks.append(valid)
            states.append(np.pad(state, (0, cfg.model_state_dim - cfg.state_dim)))
        longest = max(len(t) for t in tokens)
        if any(len(t) < longest for t in tokens):  # an untruncated long prompt: pad the batch to it (masked)
            tok: Any = self.tokenizer
            tokens = [np.pad(t, (0, longest - len(t)), constant_values=getattr(tok, "pad_id", 0)) for t in tokens]
            token_masks = [np.pad(m, (0, longest - len(m))) for m in token_masks]
        return stack_inputs(images, masks, tokens, token_masks, states, device, dtype)

    def actions(self, normalized: np.ndarray, observation: Observation) -> np.ndarray:
        return robot_actions(self.cfg, self.norm_stats, normalized[:, : self.cfg.action_dim], observation.state)

    def rtc_target(self, request: RtcRequest, observation: Observation) -> np.ndarray:
        """The old plan in model units, zero-padded to the model's action width (H, model_action_dim)."""
        return plan_target(self.cfg, self.norm_stats, request, observation, self.cfg.model_action_dim)


def resize_with_pad_float(image: torch.Tensor, size: int) -> torch.Tensor:
    """(3, h, w) float in [0, 1] -> (3, size, size): bilinear to fit (align_corners=False, no antialias, the
    target sizes truncated, not rounded), clamped to [0, 1], centred zero padding (the extra row or column of
    an odd margin goes at the bottom / right)."""
    _, h, w = image.shape
    if (h, w) == (size, size):
        return image
    ratio = max(w / size, h / size)
    new_h, new_w = int(h / ratio), int(w / ratio)
    resized = F.interpolate(image[None], size=(new_h, new_w), mode="bilinear", align_corners=False)[0]
    resized = resized.clamp(0.0, 1.0)
    top, left = (size - new_h) // 2, (size - new_w) // 2
    return F.pad(resized, (left, size - new_w - left, top, size - new_h - top), value=0.0)


def pi05_prompt(task: str, normalized_state: np.ndarray) -> str:
    """pi0.5's prompt: the task (underscores and newlines as spaces) and the normalized state in 256 bins.

    The state is not clipped first: values beyond [-1, 1] land in bins -1 and 255, as in the reference.
    """
    bins = np.digitize(normalized_state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {cleaned}, State: {' '.join(str(int(b)) for b in bins)};\nAction: "
