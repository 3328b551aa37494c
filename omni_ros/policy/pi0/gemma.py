"""Gemma-style decoder blocks of the pi0 family: RMSNorm with (1 + weight) scaling and a gated GELU MLP.

Modules with an `export_form` attribute have a second, numerically equivalent form that ExecuTorch's
XNNPACK backend delegates (see `omni_ros.policy.layers`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.layers import apply_rope, mean_last
from omni_ros.policy.pi0.configuration import TransformerConfig


class RMSNorm(nn.Module):
    export_form = False

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        # Zero-initialised and applied as (1 + weight), as in Gemma.
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        if self.export_form:
            x32 = x32 * torch.rsqrt(mean_last(x32 * x32) + self.eps)
        else:
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


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
