"""Gemma-style VLM backbone over the prefix [image tokens, prompt tokens].

The prefix attends bidirectionally (padding excluded) and never sees the
action suffix, so its keys/values depend only on the observation: `prefill`
runs once per inference and returns them as an explicit per-layer KV cache
that every denoising step of the action expert reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

import torch
from torch import nn

from omni_ros.policy.layers import AttentionKernel, additive_mask, attention, rope_cos_sin, sdpa
from omni_ros.policy.pi0.configuration import TransformerConfig
from omni_ros.policy.pi0.gemma import DecoderLayer

KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (B, kv_heads, P, head_dim) each


class Backbone(nn.Module):
    export_form = False
    attention_kernel: AttentionKernel = staticmethod(sdpa)  # swapped from outside (precision)

    def __init__(
        self, cfg: TransformerConfig, vocab_size: int, eps: float, rope_theta: float, approximate: str = "none"
    ) -> None:
        super().__init__()
        self.cfg, self.rope_theta = cfg, rope_theta
        self.embed_tokens = nn.Embedding(vocab_size, cfg.width)
        self.layers = nn.ModuleList(DecoderLayer(cfg, eps, approximate) for _ in range(cfg.depth))

    def embed_text(self, tokens: torch.Tensor) -> torch.Tensor:
        # Gemma scales token embeddings by sqrt(width).
        return self.embed_tokens(tokens) * math.sqrt(self.cfg.width)

    def prefill(self, x: torch.Tensor, mask: torch.Tensor) -> KVCache:
        """x (B, P, W) prefix embeddings, mask (B, P) valid tokens -> KV cache of every layer."""
        positions = torch.cumsum(mask.long(), dim=1) - 1
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.rope_theta, x.dtype)
        attn_mask = (mask[:, None, :] & mask[:, :, None])[:, None]  # (B, 1, P, P)
        # A padded query row would be all-masked (NaN in softmax); let it see itself.
        # (An identity from arange rather than torch.eye, whose export uses a uint16 arange beyond 255 tokens.)
        index = torch.arange(mask.shape[1], device=mask.device)
        attn_mask = attn_mask | (index[:, None] == index[None, :])
        if self.export_form:
            attn_mask = additive_mask(attn_mask, x.dtype)
        cache: KVCache = []
        last = len(self.layers) - 1
        for i, layer in enumerate(cast(Iterable[DecoderLayer], self.layers)):
            q, k, v = layer.qkv(x, cos, sin)
            cache.append((k, v))
            # Only the keys/values are consumed downstream: the last layer's
            # attention output and MLP would be dead work.
            if i < last:
                x = layer.finish(x, attention(q, k, v, attn_mask, self.export_form, self.attention_kernel))
        return cache
