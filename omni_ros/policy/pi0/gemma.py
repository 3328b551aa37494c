"""Gemma-style decoder blocks of the pi0 family: RMSNorm with (1 + weight) scaling and a gated GELU MLP,
and pi0.5's adaptive variant (adaRMS: scale, shift and a residual gate from the flow-matching time).

Modules with an `export_form` attribute have a second, numerically equivalent form that ExecuTorch's
XNNPACK backend delegates (see `omni_ros.policy.layers`).
"""

from __future__ import annotations

import torch
from torch import nn

from omni_ros.policy.layers import MlpKernel, apply_rope, gelu, mean_last, mlp
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


class AdaRMSNorm(nn.Module):
    """RMSNorm whose scale and shift come from a condition (pi0.5's time), plus a gate for the residual."""

    export_form = False

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, W), cond (B, cond_dim) -> (normalized x, gate (B, 1, W))."""
        x32 = x.float()
        mean_sq = mean_last(x32 * x32) if self.export_form else x32.pow(2).mean(-1, keepdim=True)
        normed = x32 * torch.rsqrt(mean_sq + self.eps)
        # cond (B, cond_dim) conditions every token alike; (B, T, cond_dim) (per-token times) each token.
        dense = self.dense(cond)
        scale, shift, gate = (dense.unsqueeze(1) if dense.ndim == 2 else dense).chunk(3, dim=-1)
        return (normed * (1.0 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


class GatedMLP(nn.Module):
    export_form = False
    shared_input_linears = (("gate_proj", "up_proj"),)  # linears that read the same tensor (precision kernels)
    mlp_kernel: MlpKernel = staticmethod(mlp)  # swapped from outside (precision)
    mlp_linears = ("gate_proj", "up_proj", "down_proj")  # the MLP's first, up and down linears (precision kernels)

    def __init__(self, width: int, hidden: int, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate
        self.activation = "gelu_tanh" if approximate == "tanh" else "gelu"
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.export_form:
            return self.down_proj(gelu(self.gate_proj(x), self.approximate, True) * self.up_proj(x))
        return self.mlp_kernel(self.gate_proj, self.up_proj, self.down_proj, self.activation, x)


class DecoderLayer(nn.Module):
    """Pre-norm attention + gated MLP, split so callers can mix in cached keys/values."""

    # Linears that read the same tensor (a precision's kernels may run them as one product).
    shared_input_linears: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"),)

    def __init__(self, cfg: TransformerConfig, eps: float, approximate: str = "none") -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # nn.Module: variants swap in other norms and MLPs (AdaptiveDecoderLayer, SmolVLA's LlamaLayer).
        self.input_norm: nn.Module = RMSNorm(cfg.width, eps)
        self.q_proj = nn.Linear(cfg.width, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.width, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.width, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.width, bias=False)
        self.post_attn_norm: nn.Module = RMSNorm(cfg.width, eps)
        self.mlp: nn.Module = GatedMLP(cfg.width, cfg.mlp_dim, approximate)

    def project(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Queries, keys and values of normalized h (B, T, W), rotated: (B, heads, T, head_dim)."""
        b, t, _ = h.shape
        q = self.q_proj(h).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Queries, keys and values of x (B, T, W), rotated: (B, heads, T, head_dim)."""
        return self.project(self.input_norm(x), cos, sin)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual updates after attention: x + o_proj(attn), then the MLP."""
        x = x + self.o_proj(attn)
        return x + self.mlp(self.post_attn_norm(x))


class AdaptiveDecoderLayer(DecoderLayer):
    """pi0.5's expert layer: both norms are adaRMS on the time condition and both residuals are gated."""

    def __init__(self, cfg: TransformerConfig, eps: float, approximate: str = "none") -> None:
        super().__init__(cfg, eps, approximate)
        self.input_norm = AdaRMSNorm(cfg.width, cfg.width, eps)
        self.post_attn_norm = AdaRMSNorm(cfg.width, cfg.width, eps)

    def qkv_gated(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cond: torch.Tensor):
        """(q, k, v, gate of the attention residual) of x under condition cond (B, W)."""
        h, gate = self.input_norm(x, cond)
        return (*self.project(h, cos, sin), gate)

    def finish_gated(self, x: torch.Tensor, attn: torch.Tensor, gate: torch.Tensor, cond: torch.Tensor):
        x = x + self.o_proj(attn) * gate
        h, mlp_gate = self.post_attn_norm(x, cond)
        return x + self.mlp(h) * mlp_gate
