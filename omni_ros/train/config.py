"""The training recipe (a YAML file such as config/train_demo.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omni_ros.typed_config import FieldError


@dataclass
class TrainConfig:
    """Every knob of one training run; the command line may override a few."""

    # Architecture of a fresh model (omni_ros.policy.pi0.presets.PRESETS) ...
    preset: str = "demo"
    # Fields of the preset to change, nested as in a checkpoint's config.json (e.g. {vision: {image_size: 64}}).
    model: dict[str, Any] = field(default_factory=dict)
    # ... or start from the weights of this checkpoint (fine-tuning); its architecture wins.
    init_checkpoint: str | None = None
    steps: int = 6000
    batch_size: int = 32
    # Peak learning rate, reached after `warmup_steps`, then cosine decay to `final_lr_fraction` of it.
    lr: float = 1e-3
    warmup_steps: int = 200
    final_lr_fraction: float = 0.05
    weight_decay: float = 1e-4
    grad_clip: float = 1.0
    # Augmentation: Gaussian noise on the proprioceptive state input, std drawn per sample from
    # U(0, state_noise) (robot units). The labels stay exact, so the model must read the arm's pose and
    # the goal from the cameras instead of extrapolating the state alone (the "copycat" shortcut).
    state_noise: float = 0.0
    # Weight of the goal head's loss (needs a model with goal_head and data with goals; 0: off).
    goal_weight: float = 0.0
    # Seeds the weights, the batch order and the flow-matching noise.
    seed: int = 0
    device: str = "cpu"
    # torch intra-op threads on CPU (0: torch's default).
    threads: int = 2
    # Write the checkpoint and the resumable training state every this many steps.
    checkpoint_every: int = 500
    log_every: int = 50

    def __post_init__(self) -> None:
        # The loop divides by these and draws batches of this size.
        for key in ("batch_size", "checkpoint_every", "log_every"):
            if getattr(self, key) < 1:
                raise FieldError(key, f"must be >= 1, got {getattr(self, key)}")
        for key in ("steps", "warmup_steps", "threads"):
            if getattr(self, key) < 0:
                raise FieldError(key, f"must be >= 0, got {getattr(self, key)}")
        if not self.lr > 0:
            raise FieldError("lr", f"must be positive, got {self.lr}")
        if not 0.0 <= self.final_lr_fraction <= 1.0:
            raise FieldError("final_lr_fraction", f"is a fraction of lr, 0..1; got {self.final_lr_fraction}")
        for key in ("weight_decay", "state_noise", "goal_weight"):
            if getattr(self, key) < 0:
                raise FieldError(key, f"must be >= 0, got {getattr(self, key)}")
