"""SigLIP-style vision encoder: one tile per camera -> image tokens in backbone width."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.layers import attention, layer_norm
from omni_ros.policy.model_config import VisionConfig


class VitBlock(nn.Module):
    export_form = False

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.norm1 = nn.LayerNorm(cfg.width, eps=1e-6)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.norm2 = nn.LayerNorm(cfg.width, eps=1e-6)
        self.fc1 = nn.Linear(cfg.width, cfg.mlp_dim)
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, w = x.shape
        if self.export_form:
            # Slices instead of unbind (whose copies XNNPACK rejects), and the delegable attention/norm forms.
            qkv = self.qkv(layer_norm(self.norm1, x, True))
            q, k, v = (
                qkv[..., i * w : (i + 1) * w].reshape(b, n, self.num_heads, -1).transpose(1, 2) for i in range(3)
            )
            x = x + self.proj(attention(q, k, v, None, export_form=True))
            return x + self.fc2(F.gelu(self.fc1(layer_norm(self.norm2, x, True))))
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.num_heads, w // self.num_heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, w))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class VisionEncoder(nn.Module):
    """Patch embedding + learned positions + pre-norm blocks + projection to `out_width`."""

    export_form = False

    def __init__(self, cfg: VisionConfig, out_width: int) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, cfg.width, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.pos_embed = nn.Parameter(torch.randn(1, cfg.num_tokens, cfg.width) * 0.02)
        self.blocks = nn.ModuleList(VitBlock(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.width, eps=1e-6)
        self.proj = nn.Linear(cfg.width, out_width)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (N, 3, S, S) in [-1, 1] -> tokens (N, num_tokens, out_width)."""
        x = self.patch_embed(images).flatten(2).transpose(1, 2) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.proj(layer_norm(self.norm, x, self.export_form))
