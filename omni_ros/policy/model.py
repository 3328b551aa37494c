"""The pi0-style model: vision encoder + VLM backbone + flow-matching action expert.

Inference is three stages, each a method that `torch.export` can take on its
own (static shapes per config, no data-dependent Python control flow):

    embed_prefix(images, image_masks, tokens, token_mask) -> prefix, prefix_mask
    prefill(prefix, prefix_mask)                          -> kv cache   (once)
    denoise_step(cache, prefix_mask, state, x_t, t)       -> velocity   (num_steps times)

Inputs are already normalized tensors; `TorchPolicy` does the numpy side.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.action_expert import ActionExpert
from omni_ros.policy.backbone import Backbone, KVCache
from omni_ros.policy.model_config import ModelConfig
from omni_ros.policy.sampler import euler_sample, noisy_actions, sample_time
from omni_ros.policy.vision import VisionEncoder


class Pi0Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.vision = VisionEncoder(cfg.vision, cfg.backbone.width)
        self.backbone = Backbone(cfg.backbone, cfg.vocab_size, cfg.norm_eps, cfg.rope_theta)
        self.expert = ActionExpert(cfg)
        self.apply(_init_weights)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, cameras, 3, S, S) in [-1, 1] -> tokens (B, cameras * tokens_per_camera, W)."""
        b, c = images.shape[:2]
        tokens = self.vision(images.flatten(0, 1))
        return tokens.reshape(b, c * tokens.shape[1], tokens.shape[2])

    def embed_prefix(
        self, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor, token_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix embeddings [image tokens, prompt tokens] (B, P, W) and their validity mask (B, P)."""
        image_tokens = self.encode_images(images)
        per_camera = image_tokens.shape[1] // images.shape[1]
        image_token_mask = image_masks.repeat_interleave(per_camera, dim=1)
        prefix = torch.cat([image_tokens, self.backbone.embed_text(tokens).to(image_tokens.dtype)], dim=1)
        return prefix, torch.cat([image_token_mask, token_mask], dim=1)

    def prefill(self, prefix: torch.Tensor, prefix_mask: torch.Tensor) -> KVCache:
        return self.backbone.prefill(prefix, prefix_mask)

    def denoise_step(
        self, cache: KVCache, prefix_mask: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        return self.expert(cache, prefix_mask, state, x_t, t)

    def sample(
        self,
        images: torch.Tensor,
        image_masks: torch.Tensor,
        tokens: torch.Tensor,
        token_mask: torch.Tensor,
        state: torch.Tensor,
        noise: torch.Tensor,
        num_steps: int | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Normalized action chunk (B, H, action_dim) from `noise` of the same shape.

        use_cache=False recomputes the prefix at every step: the reference the
        cached path must equal, and the baseline the benchmark compares with.
        """
        num_steps = num_steps or self.cfg.num_steps
        prefix, prefix_mask = self.embed_prefix(images, image_masks, tokens, token_mask)
        if use_cache:
            cache = self.prefill(prefix, prefix_mask)
            return euler_sample(lambda x, t: self.denoise_step(cache, prefix_mask, state, x, t), noise, num_steps)
        return euler_sample(
            lambda x, t: self.denoise_step(self.prefill(prefix, prefix_mask), prefix_mask, state, x, t),
            noise,
            num_steps,
        )

    def loss(
        self,
        images: torch.Tensor,
        image_masks: torch.Tensor,
        tokens: torch.Tensor,
        token_mask: torch.Tensor,
        state: torch.Tensor,
        actions: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Flow-matching loss: MSE between predicted and target velocity at random times."""
        noise = torch.randn(actions.shape, generator=generator, device=actions.device, dtype=actions.dtype)
        t = sample_time(actions.shape[0], generator, actions.device).to(actions.dtype)
        x_t, target = noisy_actions(actions, noise, t)
        prefix, prefix_mask = self.embed_prefix(images, image_masks, tokens, token_mask)
        velocity = self.denoise_step(self.prefill(prefix, prefix_mask), prefix_mask, state, x_t, t)
        return F.mse_loss(velocity.float(), target.float())


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)


def count_parameters(model: nn.Module) -> dict[str, int]:
    parts = {name: sum(p.numel() for p in child.parameters()) for name, child in model.named_children()}
    parts["total"] = sum(parts.values())
    return parts
