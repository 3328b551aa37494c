"""The pi0-style model: vision encoder + VLM backbone + flow-matching action expert.

Inference is three stages, each a method that `torch.export` can take on its
own (static shapes per config, no data-dependent Python control flow):

    embed_prefix(inputs)                             -> prefix, prefix_mask
    prefill(prefix, prefix_mask)                     -> kv cache   (once)
    denoise_step(cache, prefix_mask, state, x_t, t)  -> velocity   (num_steps times)

`inputs` is a `ModelInputs` of normalized tensors; the family's processor builds it.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.pi0.action_expert import EXPERTS, ActionExpert
from omni_ros.policy.pi0.backbone import Backbone, KVCache
from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.policy.pi0.vision import VisionEncoder
from omni_ros.policy.rtc import clean_prefix
from omni_ros.policy.sampler import euler_sample, noisy_actions, sample_time


class Pi0Model(nn.Module):
    per_image_modules = ("vision",)  # one camera's image per batch item, each computed on its own (image_threads)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        approximate = "tanh" if cfg.mlp_activation == "gelu_tanh" else "none"
        self.vision = VisionEncoder(
            cfg.vision, cfg.backbone.width, condition_width=cfg.backbone.width, approximate=approximate
        )
        self.backbone = Backbone(cfg.backbone, cfg.vocab_size, cfg.norm_eps, cfg.rope_theta, approximate)
        self.expert = EXPERTS[cfg.variant](cfg)
        self.apply(_init_weights)
        self.vision.reset_conditioning()

    def encode_images(
        self, images: torch.Tensor, tokens: torch.Tensor | None = None, token_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """images (B, cameras, 3, S, S) in [-1, 1] -> tokens (B, cameras * tokens_per_camera, W).

        A prompt-conditioned encoder (vision.film) also needs the prompt's tokens and mask (B, T).
        """
        b, c = images.shape[:2]
        condition = None
        if self.cfg.vision.film:
            if tokens is None or token_mask is None:
                raise ValueError("vision.film: encode_images needs the prompt tokens and token_mask")
            condition = self.prompt_condition(tokens, token_mask, images.dtype)
            condition = condition.repeat_interleave(c, dim=0)
        image_tokens = self.vision(images.flatten(0, 1), condition)
        return image_tokens.reshape(b, c * image_tokens.shape[1], image_tokens.shape[2])

    def prompt_condition(self, tokens: torch.Tensor, token_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Mean embedding (B, W) of the valid prompt tokens: what a FiLM vision encoder is conditioned on."""
        weights = token_mask.to(dtype).unsqueeze(-1)
        embedded = self.backbone.embed_text(tokens).to(dtype)
        return (embedded * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)

    def embed_prefix(self, inputs: ModelInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix embeddings [image tokens, prompt tokens] (B, P, W) and their validity mask (B, P)."""
        image_tokens = self.encode_images(inputs.images, inputs.tokens, inputs.token_mask)
        return self.join_prefix(image_tokens, inputs.image_masks, inputs.tokens, inputs.token_mask)

    def join_prefix(
        self, image_tokens: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor, token_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[image tokens, embedded prompt] (B, P, W) and the prefix validity mask (B, P)."""
        per_camera = image_tokens.shape[1] // image_masks.shape[1]
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
        self, inputs: ModelInputs, noise: torch.Tensor, num_steps: int | None = None, use_cache: bool = True
    ) -> torch.Tensor:
        """Normalized action chunk (B, H, action_dim) from `noise` of the same shape.

        use_cache=False recomputes the prefix at every step: the reference the
        cached path must equal, and the baseline the benchmark compares with.
        """
        num_steps = num_steps or self.cfg.num_steps
        state = inputs.state
        prefix, prefix_mask = self.embed_prefix(inputs)
        if use_cache:
            cache = self.prefill(prefix, prefix_mask)
            return euler_sample(
                lambda x, t: self.denoise_step(cache, prefix_mask, state, x, t), noise, num_steps, self.cfg.euler_time
            )
        return euler_sample(
            lambda x, t: self.denoise_step(self.prefill(prefix, prefix_mask), prefix_mask, state, x, t),
            noise,
            num_steps,
            self.cfg.euler_time,
        )

    def loss(
        self,
        inputs: ModelInputs,
        actions: torch.Tensor,
        generator: torch.Generator | None = None,
        goal: torch.Tensor | None = None,
        goal_weight: float = 0.0,
        rtc_delay: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Flow-matching loss: MSE between predicted and target velocity at random times.

        With a goal head, `goal_weight` * MSE of its prediction against `goal` (B, action_dim) is added.
        `rtc_delay` (B,) int: training-time RTC, the first rtc_delay[b] actions of example b stay clean (time 0)
        and carry no loss.
        """
        noise = torch.randn(actions.shape, generator=generator, device=actions.device, dtype=actions.dtype)
        t = sample_time(actions.shape[0], generator, actions.device).to(actions.dtype)
        x_t, target = noisy_actions(actions, noise, t)
        weight = None
        if rtc_delay is not None:
            x_t, t, weight = clean_prefix(actions, x_t, t, rtc_delay)
        prefix, prefix_mask = self.embed_prefix(inputs)
        suffix = self.expert.suffix(self.prefill(prefix, prefix_mask), prefix_mask, inputs.state, x_t, t)
        velocity = self.expert.action_out_proj(suffix[:, self.expert.state_tokens :])
        if weight is None:
            loss = F.mse_loss(velocity.float(), target.float())
        else:
            squared = (velocity.float() - target.float()) ** 2 * weight[..., None]
            loss = squared.sum() / (weight.sum() * actions.shape[-1]).clamp(min=1.0)
        if goal is not None and goal_weight > 0:
            # Only pi0's expert has a goal head (pi05's refuses one at construction).
            loss = loss + goal_weight * F.mse_loss(cast(ActionExpert, self.expert).goal(suffix).float(), goal.float())
        return loss


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)


def init_buffers(model: nn.Module) -> nn.Module:
    """Recompute every constant buffer of `model` (those are not in checkpoints): after `to_empty`."""
    for module in model.modules():
        if module is not model and hasattr(module, "init_buffers"):
            cast(Any, module).init_buffers()  # a method (nn.Module types attributes as Tensor | Module)
    return model


def count_parameters(model: nn.Module) -> dict[str, int]:
    parts = {name: sum(p.numel() for p in child.parameters()) for name, child in model.named_children()}
    parts["total"] = sum(parts.values())
    return parts
