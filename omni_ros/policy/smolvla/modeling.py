"""SmolVLA: SmolVLM (vision + the first layers of its text decoder) and a flow-matching action expert.

Inference is the three stages every family has (static shapes per config in the export form):

    embed_prefix(inputs)                             -> prefix, prefix_mask
    prefill(prefix, prefix_mask)                     -> KV cache, one (k, v) per expert layer   (once)
    denoise_step(cache, prefix_mask, state, x_t, t)  -> velocity                                (num_steps times)

The prefix is [image tokens of every camera slot, prompt tokens, one state token]. A camera slot whose mask
is off (a camera missing from the observation) has its tokens masked out of everything: positions count only
valid tokens and no query sees a masked key, so the result is the reference's (which drops the camera) up to
float rounding. Image and text embeddings are both scaled by sqrt(width). Image and prompt tokens attend to
each other, not to the state; the state token sees the whole valid prefix. Positions are cumsum(mask) - 1.

The expert's suffix is the H action tokens (the time mixed in by an MLP over [action, time embedding]),
attending causally among themselves. A self-attention layer reads [its VLM layer's cached keys/values, the
suffix's own] at positions continuing after the prefix; a cross-attention layer reads only the prefix,
through its own k/v projections of the VLM's cached (already rotated) keys and values, with query positions
from 0. Those projections depend on the prefix alone, so `prefill` applies them once and the cache holds
them: no denoising step recomputes anything about the prefix.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.layers import AttentionKernel, RotaryTable, additive_mask, apply_rope, attention, sdpa
from omni_ros.policy.pi0.action_expert import suffix_attention_mask, suffix_positions, time_embedding
from omni_ros.policy.sampler import euler_sample
from omni_ros.policy.smolvla.configuration import SmolVLAConfig
from omni_ros.policy.smolvla.modules import LlamaLayer, LlamaRMSNorm, SmolVLMVision, rope_tables

KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per expert layer: (B, kv_heads, P, head_dim) each


class TextModel(nn.Module):
    """The VLM's token embedding and its first `text.depth` decoder layers (no final norm, no lm_head: only
    the cached keys and values reach the actions)."""

    export_form = False
    attention_kernel: AttentionKernel = staticmethod(sdpa)  # swapped from outside (precision)

    def __init__(self, cfg: SmolVLAConfig) -> None:
        super().__init__()
        t = cfg.text
        self.cfg = t
        self.rope = RotaryTable(rope_tables, t.head_dim, cfg.rope_theta, cfg.prefix_len)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, t.width)
        self.layers = nn.ModuleList(
            LlamaLayer(t.width, t.num_heads, t.num_kv_heads, t.head_dim, t.mlp_dim, t.norm_eps) for _ in range(t.depth)
        )

    def embed_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens) * math.sqrt(self.cfg.width)

    def prefill(self, x: torch.Tensor, mask: torch.Tensor, keep: list[int]) -> dict[int, tuple]:
        """Rotated keys and values of layers `keep` for prefix x (B, P, W) with validity mask (B, P)."""
        positions = torch.cumsum(mask.long(), dim=1) - 1
        cos, sin = self.rope(positions, x.dtype)
        attn_mask = prefix_attention_mask(mask)
        if self.export_form:
            attn_mask = additive_mask(attn_mask, x.dtype)
        out: dict[int, tuple] = {}
        last = max(keep)
        for i, layer in enumerate(cast(Iterable[LlamaLayer], self.layers[: last + 1])):
            q, k, v = layer.qkv(x, cos, sin)
            if i in keep:
                out[i] = (k, v)
            # Layers past the last one read, and the last one's attention and MLP, would be dead work.
            if i < last:
                x = layer.finish(x, attention(q, k, v, attn_mask, self.export_form, self.attention_kernel))
        return out


def prefix_attention_mask(mask: torch.Tensor) -> torch.Tensor:
    """(B, 1, P, P) for a prefix whose last token is the state: valid tokens see valid tokens, but only the
    state sees the state. A padded row sees itself (an all-masked row is NaN in softmax); nothing reads it."""
    index = torch.arange(mask.shape[1], device=mask.device)
    state = index == mask.shape[1] - 1
    allowed = mask[:, None, :] & mask[:, :, None] & (~state[None, :] | state[:, None])[None]
    return (allowed | (index[:, None] == index[None, :]))[:, None]


class ActionExpert(nn.Module):
    export_form = False
    attention_kernel: AttentionKernel = staticmethod(sdpa)  # swapped from outside (precision)

    def __init__(self, cfg: SmolVLAConfig) -> None:
        super().__init__()
        t, e = cfg.text, cfg.expert
        self.cfg, self.head_dim = cfg, t.head_dim
        # Suffix positions continue after the prefix's valid tokens.
        self.rope = RotaryTable(rope_tables, t.head_dim, cfg.rope_theta, cfg.prefix_len + cfg.action_horizon)
        self.periods = (cfg.time_min_period, cfg.time_max_period)
        self.plan = cfg.layer_plan()
        self.action_in_proj = nn.Linear(cfg.max_action_dim, e.width)
        self.time_mlp_in = nn.Linear(2 * e.width, e.width)
        self.time_mlp_out = nn.Linear(e.width, e.width)
        kv = t.num_kv_heads * t.head_dim
        self.layers = nn.ModuleList(
            LlamaLayer(
                e.width, t.num_heads, t.num_kv_heads, t.head_dim, e.mlp_dim, t.norm_eps, kv if kind == "cross" else 0
            )
            for _, kind in self.plan
        )
        self.norm = LlamaRMSNorm(e.width, t.norm_eps)
        self.action_out_proj = nn.Linear(e.width, cfg.max_action_dim)
        self.register_buffer("causal", self.make_causal(), persistent=False)

    def make_causal(self) -> torch.Tensor:
        index = torch.arange(self.cfg.action_horizon)
        return index[:, None] >= index[None, :]

    def init_buffers(self) -> None:
        self.causal = self.make_causal().to(self.action_in_proj.weight.device)

    def cache(self, vlm_kv: dict[int, tuple]) -> KVCache:
        """The keys/values each expert layer reads: its VLM layer's, through the layer's k/v for cross layers."""
        cache: KVCache = []
        for (source, kind), layer in zip(self.plan, cast(Iterable[LlamaLayer], self.layers), strict=True):
            k, v = vlm_kv[source]
            if kind == "cross":
                b, heads, p, d = k.shape
                k = layer.k_proj(k.transpose(1, 2).reshape(b, p, heads * d)).view(b, p, -1, d).transpose(1, 2)
                v = layer.v_proj(v.transpose(1, 2).reshape(b, p, heads * d)).view(b, p, -1, d).transpose(1, 2)
            cache.append((k, v))
        return cache

    def forward(self, cache: KVCache, prefix_mask: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Velocity (B, H, max_action_dim) at noisy actions x_t, times t (B,)."""
        b, h = x_t.shape[:2]
        x = self.action_in_proj(x_t)
        time = time_embedding(t, x.shape[-1], *self.periods, float64=not self.export_form).to(x.dtype)
        if self.export_form:  # XNNPACK has no expand: broadcast by a product
            time = time.view(b, 1, -1) * torch.ones(1, h, 1, dtype=x.dtype, device=x.device)
        else:
            time = time[:, None, :].expand_as(x)
        x = self.time_mlp_out(F.silu(self.time_mlp_in(torch.cat([x, time], dim=-1))))

        d, dtype = self.head_dim, x.dtype
        self_rope = self.rope(suffix_positions(prefix_mask, h), dtype)
        cross_rope = self.rope(torch.arange(h, device=x.device)[None, :].repeat(b, 1), dtype)
        self_mask = suffix_attention_mask(prefix_mask, self.causal, self.export_form, dtype)
        cross_mask = prefix_mask[:, None, None, :]
        if self.export_form:
            cross_mask = additive_mask(cross_mask, dtype)
        for (_, kind), layer, (keys, values) in zip(
            self.plan, cast(Iterable[LlamaLayer], self.layers), cache, strict=True
        ):
            if kind == "self":
                q, k, v = layer.qkv(x, *self_rope)
                keys, values, mask = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2), self_mask
            else:
                hidden = layer.input_norm(x)
                q = layer.q_proj(hidden).view(b, h, layer.num_heads, d).transpose(1, 2)
                q, mask = apply_rope(q, *cross_rope), cross_mask
            x = layer.finish(x, attention(q, keys, values, mask, self.export_form, self.attention_kernel))
        return self.action_out_proj(self.norm(x))


class SmolVLAModel(nn.Module):
    export_form = False
    per_image_modules = ("vision",)  # one camera's image per batch item, each computed on its own (image_threads)

    def __init__(self, cfg: SmolVLAConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.vision = SmolVLMVision(cfg.vision, cfg.tile_size, cfg.text.width)
        self.text = TextModel(cfg)
        self.state_proj = nn.Linear(cfg.max_state_dim, cfg.text.width)
        self.expert = ActionExpert(cfg)
        self.apply(_init_weights)

    def encode_images(self, images: torch.Tensor, image_masks: torch.Tensor) -> torch.Tensor:
        """images (B, C, 3, S, S) in [-1, 1] -> image tokens (B, C * tokens_per_camera, W), scaled by sqrt(W).

        Eagerly only the cameras present are encoded (a missing one's tokens are masked, so zeros do); the
        export form encodes every slot, its shapes being static."""
        b, c = images.shape[:2]
        flat = images.flatten(0, 1)
        present = image_masks.flatten()
        if self.export_form or bool(present.all()):
            tokens = self.embed_images(flat)
        else:
            tokens = flat.new_zeros(b * c, self.cfg.tokens_per_camera, self.cfg.text.width)
            if bool(present.any()):
                tokens[present] = self.embed_images(flat[present])
        return tokens.reshape(b, c * tokens.shape[1], tokens.shape[2])

    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        """Tiles (N, 3, S, S) -> their prefix tokens (N, tokens_per_camera, W): SmolVLM's, times sqrt(W)."""
        return self.vision(images) * self.cfg.text.width**0.5

    def join_prefix(
        self,
        image_tokens: torch.Tensor,
        image_masks: torch.Tensor,
        tokens: torch.Tensor,
        token_mask: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[image tokens, embedded prompt, state token] (B, P, W) and the prefix validity mask (B, P)."""
        return (
            torch.cat([image_tokens, self.text.embed_text(tokens), self.state_proj(state)[:, None, :]], dim=1),
            prefix_mask_of(image_masks, token_mask, self.cfg.tokens_per_camera),
        )

    def embed_prefix(self, inputs: ModelInputs) -> tuple[torch.Tensor, torch.Tensor]:
        image_tokens = self.encode_images(inputs.images, inputs.image_masks)
        return self.join_prefix(image_tokens, inputs.image_masks, inputs.tokens, inputs.token_mask, inputs.state)

    def prefill(self, prefix: torch.Tensor, prefix_mask: torch.Tensor) -> KVCache:
        keep = sorted({source for source, _ in self.expert.plan})
        return self.expert.cache(self.text.prefill(prefix, prefix_mask, keep))

    def denoise_step(
        self, cache: KVCache, prefix_mask: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """Velocity at x_t; `state` is unused (it is the prefix's last token, already in the cache)."""
        return self.expert(cache, prefix_mask, x_t, t)

    def sample(self, inputs: ModelInputs, noise: torch.Tensor, num_steps: int | None = None) -> torch.Tensor:
        """Normalized action chunk (B, H, max_action_dim) from `noise` of the same shape."""
        prefix, prefix_mask = self.embed_prefix(inputs)
        cache = self.prefill(prefix, prefix_mask)
        return euler_sample(
            lambda x, t: self.denoise_step(cache, prefix_mask, inputs.state, x, t),
            noise,
            num_steps or self.cfg.num_steps,
            self.cfg.euler_time,
        )


def prefix_mask_of(image_masks: torch.Tensor, token_mask: torch.Tensor, tokens_per_camera: int) -> torch.Tensor:
    """Validity (B, P) of [image tokens, prompt tokens, state token]."""
    state = torch.ones_like(token_mask[:, :1])
    return torch.cat([image_masks.repeat_interleave(tokens_per_camera, dim=1), token_mask, state], dim=1)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
