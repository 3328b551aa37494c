"""Fine-tuning: the flow-matching training step on batches of (observation, action chunk)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from omni_ros.observation import Observation
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pi0.processing import action_targets, model_inputs
from omni_ros.policy.tokenizer import Tokenizer, make_tokenizer


class Trainer:
    """Holds model, optimizer and RNG; `step` runs one optimisation step and returns the loss."""

    def __init__(
        self,
        model: Pi0Model,
        norm_stats: NormStats,
        lr: float = 3e-4,
        weight_decay: float = 1e-4,
        grad_clip: float = 1.0,
        seed: int = 0,
        tokenizer: Tokenizer | None = None,
        goal_weight: float = 0.0,
    ) -> None:
        self.model = model.train()
        self.norm_stats = norm_stats
        self.tokenizer = tokenizer or make_tokenizer(model.cfg.tokenizer)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        self.grad_clip = grad_clip
        if goal_weight > 0 and not model.cfg.goal_head:
            raise ValueError("goal_weight > 0 needs a model with a goal head (ModelConfig.goal_head: true)")
        self.goal_weight = goal_weight
        # Flow-matching noise is drawn on the model's device, so the generator must live there too.
        self.generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
        self.steps = 0

    def batch(
        self, observations: Sequence[Observation], actions: np.ndarray, goals: np.ndarray | None = None
    ) -> dict[str, Any]:
        """Model inputs and targets for validated observations and their (B, H, action_dim) chunks in robot units.

        Relative targets use the observations' states as given (noise included), as the model sees them.
        `goals` (B, action_dim), the joint positions each chunk heads for, are the goal head's targets, in the
        same normalized (and, if so configured, relative) units as the actions.
        """
        device = next(self.model.parameters()).device
        cfg = self.model.cfg
        states = np.stack([o.state for o in observations])
        targets = action_targets(cfg, self.norm_stats, np.asarray(actions, dtype=np.float32), states)
        batch: dict[str, Any] = {
            "inputs": model_inputs(cfg, self.tokenizer, self.norm_stats, observations, device),
            "actions": torch.from_numpy(targets).to(device),
        }
        if goals is not None and self.goal_weight > 0:
            goal = action_targets(cfg, self.norm_stats, np.asarray(goals, dtype=np.float32)[:, None, :], states)
            batch["goal"] = torch.from_numpy(goal[:, 0]).to(device)
        return batch

    def step(self, batch: dict[str, Any]) -> float:
        self.model.train()
        loss = self.model.loss(**batch, generator=self.generator, goal_weight=self.goal_weight)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.steps += 1
        return float(loss.detach())
