"""Observations <-> the pi0-style model's tensors (omni_ros's own conventions). Shared by inference and
training, so a policy is trained on exactly the preprocessing it runs with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from omni_ros.observation import Observation, ObservationSpec, make_observation
from omni_ros.policy.base import PolicyMetadata
from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.policy.tokenizer import Tokenizer, make_tokenizer


class Pi0Processor:
    """Raw observation -> `ModelInputs`, and normalized model output -> robot actions.

    Tiles are uint8 resize-with-pad (`make_observation`), pixels x / 127.5 - 1, the state normalized with the
    checkpoint's statistics; actions are un-normalized and, with `relative_actions`, added to the state.
    """

    def __init__(self, cfg: ModelConfig, norm_stats: NormStats, tokenizer: Tokenizer | None = None) -> None:
        norm_stats.check(cfg.state_dim, cfg.action_dim)
        self.cfg = cfg
        self.norm_stats = norm_stats
        self.tokenizer = tokenizer or make_tokenizer(cfg.tokenizer)
        self.spec: ObservationSpec = cfg.observation_spec()

    @property
    def noise_shape(self) -> tuple[int, int]:
        """(action_horizon, model action dim): the shape of one request's explicit noise."""
        return (self.cfg.action_horizon, self.cfg.action_dim)

    def metadata(self, name: str, backend: str) -> PolicyMetadata:
        return self.cfg.policy_metadata(name, backend)

    def parse(self, raw: Mapping[str, Any]) -> Observation:
        return make_observation(self.spec, raw)

    def inputs(
        self,
        observations: Sequence[Observation],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> ModelInputs:
        return model_inputs(self.cfg, self.tokenizer, self.norm_stats, observations, device, dtype)

    def actions(self, normalized: np.ndarray, observation: Observation) -> np.ndarray:
        return robot_actions(self.cfg, self.norm_stats, normalized, observation.state)


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


def fit_norm_stats(cfg: ModelConfig, states: np.ndarray, actions: np.ndarray) -> NormStats:
    """Statistics of states (N, state_dim) and of the targets the model learns (deltas when relative)."""
    return NormStats.fit(states, _relative(cfg, actions, states, -1.0))


def _relative(cfg: ModelConfig, actions: np.ndarray, states: np.ndarray, sign: float) -> np.ndarray:
    if not cfg.relative_actions:
        return actions
    if cfg.action_dim > cfg.state_dim:
        raise ValueError(f"relative_actions needs action_dim <= state_dim, got {cfg.action_dim} > {cfg.state_dim}")
    # The first action_dim state entries are the joint positions the actions command.
    offset = np.asarray(states, dtype=np.float32)[..., None, : cfg.action_dim]
    return (actions + sign * offset).astype(np.float32)
