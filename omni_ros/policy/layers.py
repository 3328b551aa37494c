"""Transformer building blocks shared by the backbone and the action expert.

Gemma-style: RMSNorm with (1 + weight) scaling, rotary position embeddings,
grouped-query attention, and a gated GELU MLP. Attention takes an explicit
boolean mask so one function serves the bidirectional prefix, the suffix
reading the cached prefix, and padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.model_config import TransformerConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        # Zero-initialised and applied as (1 + weight), as in Gemma.
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables of shape (B, 1, T, head_dim/2) for integer positions (B, T)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None, :, None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q (B, H, Tq, D), k/v (B, KV, Tk, D), mask (B, 1, Tq, Tk) bool -> (B, Tq, H*D)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).flatten(2)


class GatedMLP(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Exact GELU: XNNPACK computes exact GELU even when asked for tanh.
        return self.down_proj(F.gelu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention + gated MLP, split so callers can mix in cached keys/values."""

    def __init__(self, cfg: TransformerConfig, eps: float) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.input_norm = RMSNorm(cfg.width, eps)
        self.q_proj = nn.Linear(cfg.width, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.width, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.width, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.width, bias=False)
        self.post_attn_norm = RMSNorm(cfg.width, eps)
        self.mlp = GatedMLP(cfg.width, cfg.mlp_dim)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Queries, keys and values of x (B, T, W), rotated: (B, heads, T, head_dim)."""
        b, t, _ = x.shape
        h = self.input_norm(x)
        q = self.q_proj(h).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual updates after attention: x + o_proj(attn), then the MLP."""
        x = x + self.o_proj(attn)
        return x + self.mlp(self.post_attn_norm(x))
