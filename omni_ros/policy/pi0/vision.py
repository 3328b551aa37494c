"""SigLIP-style vision encoder: one tile per camera -> image tokens in backbone width."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.layers import AttentionKernel, MlpKernel, attention, gelu, layer_norm, mlp, sdpa
from omni_ros.policy.pi0.configuration import VisionConfig


class VitShape(Protocol):
    """What a ViT block reads from a vision config (pi0's VisionConfig, SmolVLA's)."""

    @property
    def width(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def mlp_dim(self) -> int: ...


class VitBlock(nn.Module):
    export_form = False
    attention_kernel: AttentionKernel = staticmethod(sdpa)  # swapped from outside (precision)
    mlp_kernel: MlpKernel = staticmethod(mlp)  # swapped from outside (precision)
    mlp_linears = ("fc1", None, "fc2")  # the MLP's first, up and down linears (precision kernels)
    attention_only_outputs = ("qkv",)  # linears whose output nothing but the attention kernel reads

    def __init__(self, cfg: VitShape, approximate: str = "none") -> None:
        super().__init__()
        self.num_heads, self.approximate = cfg.num_heads, approximate
        self.activation = "gelu_tanh" if approximate == "tanh" else "gelu"
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
            return x + self.fc2(gelu(self.fc1(layer_norm(self.norm2, x, True)), self.approximate, True))
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.num_heads, w // self.num_heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(self.attention_kernel(q, k, v, None).transpose(1, 2).reshape(b, n, w))
        return x + self.mlp_kernel(self.fc1, None, self.fc2, self.activation, self.norm2(x))


class SpatialKeypoints(nn.Module):
    """K keypoint tokens from a patch grid: per learned feature, a softmax over the grid gives weights whose
    mean grid position (x, y in [-1, 1], sub-patch precise) is embedded, plus a per-keypoint identity."""

    def __init__(self, width: int, side: int, keypoints: int, out_width: int) -> None:
        super().__init__()
        self.side = side
        self.logits = nn.Linear(width, keypoints)
        self.register_buffer("grid", self.make_grid(), persistent=False)
        self.embed = nn.Linear(2, out_width)
        self.identity = nn.Parameter(torch.randn(1, keypoints, out_width) * 0.02)

    def make_grid(self) -> torch.Tensor:
        """(x, y) in [-1, 1] of every grid cell, (side * side, 2), row-major."""
        axis = torch.linspace(-1.0, 1.0, self.side)
        yy, xx = torch.meshgrid(axis, axis, indexing="ij")
        return torch.stack([xx.flatten(), yy.flatten()], dim=-1)

    def init_buffers(self) -> None:
        """Recompute the constant grid (after a model built on the meta device got real storage)."""
        self.grid = self.make_grid().to(self.logits.weight.device)

    def reset_parameters(self) -> None:
        """PyTorch's default (fan-in) init, not the transformer's N(0, 0.02): with that, the softmax over the
        grid starts uniform and the coordinates barely reach the token, and training stalls (measured)."""
        self.logits.reset_parameters()
        self.embed.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Grid features (N, side * side, width) -> keypoint tokens (N, K, out_width)."""
        weights = torch.softmax(self.logits(x).float(), dim=1).to(x.dtype)  # over the grid
        points = torch.matmul(weights.transpose(1, 2), self.grid.to(x.dtype))  # (N, K, 2)
        return self.embed(points) + self.identity


class VisionEncoder(nn.Module):
    """Patch embedding + learned positions + pre-norm blocks + projection to `out_width` (+ keypoint tokens)."""

    export_form = False

    def __init__(self, cfg: VisionConfig, out_width: int, condition_width: int = 0, approximate: str = "none") -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, cfg.width, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.pos_embed = nn.Parameter(torch.randn(1, cfg.grid_tokens, cfg.width) * 0.02)
        self.blocks = nn.ModuleList(VitBlock(cfg, approximate) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.width, eps=1e-6)
        # Keypoint-only encoders emit no patch tokens, so they have no patch projection either.
        self.proj = None if cfg.keypoints_only else nn.Linear(cfg.width, out_width)
        side = cfg.image_size // cfg.patch_size
        self.keypoints = SpatialKeypoints(cfg.width, side, cfg.keypoints, out_width) if cfg.keypoints else None
        self.film = None
        if cfg.film:
            if condition_width <= 0:
                raise ValueError("vision.film needs the width of the prompt condition")
            self.film = nn.Linear(condition_width, 2 * cfg.width)

    def reset_conditioning(self) -> None:
        """Fan-in init for the keypoints and the FiLM (called after the model-wide N(0, 0.02) init)."""
        if self.keypoints is not None:
            self.keypoints.reset_parameters()
        if self.film is not None:
            self.film.reset_parameters()

    def forward(self, images: torch.Tensor, condition: torch.Tensor | None = None) -> torch.Tensor:
        """images (N, 3, S, S) in [-1, 1] (+ condition (N, condition_width) with FiLM) -> tokens (N, num_tokens,
        out_width)."""
        x = self.patch_embed(images).flatten(2).transpose(1, 2) + self.pos_embed
        if not self.export_form:
            # The transposed patch grid would make the residual stream (and every op reading it) strided through
            # all blocks: the add keeps its first operand's layout.
            x = x.contiguous()
        for block in self.blocks:
            x = block(x)
        x = layer_norm(self.norm, x, self.export_form)
        if self.film is not None:
            if condition is None:
                raise ValueError("this vision encoder is prompt-conditioned (vision.film): pass the condition")
            # Normalized, so that the modulation's strength does not depend on the embedding scale.
            condition = F.layer_norm(condition, condition.shape[-1:])
            scale, shift = self.film(condition).chunk(2, dim=-1)
            x = x * (1.0 + scale.unsqueeze(1)) + shift.unsqueeze(1)
        if self.keypoints is None:
            assert self.proj is not None  # only keypoint encoders have no patch projection
            return self.proj(x)
        if self.proj is None:
            return self.keypoints(x)
        return torch.cat([self.proj(x), self.keypoints(x)], dim=1)
