"""Action experts: a smaller transformer over the suffix, reading the cached prefix.

Each expert layer attends to the cached prefix keys/values of one backbone layer (`layer_map`) and to the
suffix itself. Two variants, picked by `ModelConfig.variant` (`EXPERTS`):

    pi0   suffix [state token, H action tokens]; the state token sees the prefix and itself, action tokens
          see the prefix, the state and every action token; the time is mixed into each action token by an
          MLP over [action, time embedding].
    pi05  suffix [H action tokens] (the state is in the prompt); actions attend to the prefix and to each
          other; the time conditions every norm (adaRMS) through an MLP, and gates every residual.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.layers import AttentionKernel, additive_mask, attention, rope_cos_sin, sdpa
from omni_ros.policy.pi0.backbone import KVCache
from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.policy.pi0.gemma import AdaptiveDecoderLayer, AdaRMSNorm, DecoderLayer, RMSNorm


def time_embedding(
    t: torch.Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0, float64: bool = True
) -> torch.Tensor:
    """Sine-cosine embedding (B, dim) of flow-matching times t (B,) in [0, 1], in float32; (B, H, dim) of
    per-token times (B, H) (training-time RTC: a clean action prefix has time 0).

    Computed in float64 as the reference does (its periods span three decades). The export form passes
    float64=False, since the exported programs run float32 only: see `time_embedding_float32`.
    """
    if not float64:
        return time_embedding_float32(t, dim, min_period, max_period)
    fraction = torch.linspace(0.0, 1.0, dim // 2, device=t.device, dtype=torch.float64)
    period = min_period * (max_period / min_period) ** fraction
    angles = t.to(torch.float64)[..., None] * (2 * math.pi / period)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).float()


def time_embedding_float32(t: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """The float64 embedding's values with float32 operations only.

    The fastest frequency turns t into ~1,600 rad, where one float32 rounding of t * frequency is 1e-4 rad
    (measured: 4e-5 on a SmolVLA chunk). So the phase is kept as an exact sum p + e: p = fl(t * f) and e its
    rounding error (Dekker's product, with Veltkamp's split of t; f split into float32 parts in Python), plus
    t times the float32 rounding of f itself; then sin(p + e) = sin p + e cos p (e ~ 1e-4, e^2 negligible).
    """
    fraction = np.linspace(0.0, 1.0, dim // 2, dtype=np.float64)
    freq = 2 * math.pi / (min_period * (max_period / min_period) ** fraction)
    f32 = freq.astype(np.float32)
    f_hi = (f32.astype(np.float64) * 4097.0).astype(np.float32)
    f_hi = (f_hi - (f_hi - f32)).astype(np.float32)  # the top 12 bits of f32, as float32 arithmetic splits it

    def const(values: np.ndarray) -> torch.Tensor:
        return torch.tensor(values.astype(np.float32).tolist(), dtype=torch.float32, device=t.device)

    f, hi, lo, df = const(f32), const(f_hi), const(f32 - f_hi), const(freq - f32.astype(np.float64))
    x = t.float()[..., None]  # (B, 1), or (B, H, 1) for per-token times
    c = x * 4097.0
    x_hi = c - (c - x)
    x_lo = x - x_hi
    p = x * f
    e = (((x_hi * hi - p) + x_hi * lo + x_lo * hi) + x_lo * lo) + x * df
    sin, cos = p.sin(), p.cos()
    return torch.cat([sin + e * cos, cos - e * sin], dim=-1)


def expert_layer_map(backbone_depth: int, expert_depth: int) -> list[int]:
    """Backbone layer whose cache each expert layer reads: evenly spaced, ending at the last one."""
    return [(j + 1) * backbone_depth // expert_depth - 1 for j in range(expert_depth)]


def suffix_positions(prefix_mask: torch.Tensor, length: int) -> torch.Tensor:
    """RoPE positions (B, length) of the suffix: they continue after the valid prefix tokens."""
    return prefix_mask.long().sum(dim=1, keepdim=True) + torch.arange(length, device=prefix_mask.device)[None, :]


def suffix_attention_mask(prefix_mask: torch.Tensor, suffix_mask: torch.Tensor, export_form: bool, dtype):
    """(B, 1, S, P + S): every suffix token sees the valid prefix, and the suffix as `suffix_mask` (S, S) says."""
    b, s = prefix_mask.shape[0], suffix_mask.shape[0]
    mask = torch.cat([prefix_mask[:, None, :].expand(b, s, -1), suffix_mask[None].expand(b, -1, -1)], dim=2)[:, None]
    return additive_mask(mask, dtype) if export_form else mask


def with_prefix(cache: KVCache, source: int, k: torch.Tensor, v: torch.Tensor):
    prefix_k, prefix_v = cache[source]
    return torch.cat([prefix_k, k], dim=2), torch.cat([prefix_v, v], dim=2)


class ActionExpert(nn.Module):
    """pi0's expert."""

    export_form = False
    attention_kernel: AttentionKernel = staticmethod(sdpa)  # swapped from outside (precision)
    # Suffix tokens before the action tokens (the state token).
    state_tokens = 1

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e = cfg.expert
        self.cfg, self.rope_theta = e, cfg.rope_theta
        self.periods = (cfg.time_min_period, cfg.time_max_period)
        self.horizon = cfg.action_horizon
        approximate = "tanh" if cfg.mlp_activation == "gelu_tanh" else "none"
        self.state_proj = nn.Linear(cfg.model_state_dim, e.width)
        self.action_in_proj = nn.Linear(cfg.model_action_dim, e.width)
        self.time_mlp_in = nn.Linear(2 * e.width, e.width)
        self.time_mlp_out = nn.Linear(e.width, e.width)
        self.layers = nn.ModuleList(DecoderLayer(e, cfg.norm_eps, approximate) for _ in range(e.depth))
        self.final_norm = RMSNorm(e.width, cfg.norm_eps)
        self.action_out_proj = nn.Linear(e.width, cfg.model_action_dim)
        self.goal_out_proj = nn.Linear(e.width, cfg.action_dim) if cfg.goal_head else None
        self.layer_map = expert_layer_map(cfg.backbone.depth, e.depth)
        self.register_buffer("suffix_mask", self.make_suffix_mask(), persistent=False)

    def make_suffix_mask(self) -> torch.Tensor:
        # Suffix self-attention: the state token (row 0) cannot see the actions.
        mask = torch.ones(1 + self.horizon, 1 + self.horizon, dtype=torch.bool)
        mask[0, 1:] = False
        return mask

    def init_buffers(self) -> None:
        """Recompute the constant mask (after a model built on the meta device got real storage)."""
        self.suffix_mask = self.make_suffix_mask().to(self.action_in_proj.weight.device)

    def forward(
        self, cache: KVCache, prefix_mask: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """Velocity (B, H, model action dim) at noisy actions x_t, times t (B,)."""
        return self.action_out_proj(self.suffix(cache, prefix_mask, state, x_t, t)[:, 1:])

    def goal(self, suffix: torch.Tensor) -> torch.Tensor:
        """The goal head's prediction (B, action_dim) from the state token of `suffix` (training only)."""
        if self.goal_out_proj is None:
            raise RuntimeError("this model has no goal head (ModelConfig.goal_head is false)")
        return self.goal_out_proj(suffix[:, 0])

    def suffix(
        self, cache: KVCache, prefix_mask: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """Final normalized hidden states (B, 1 + H, width) of [state token, action tokens]; t is (B,) or per
        action token (B, H)."""
        b = x_t.shape[0]
        actions = self.action_in_proj(x_t)
        time = time_embedding(t, actions.shape[-1], *self.periods, float64=not self.export_form).to(actions.dtype)
        if time.ndim == 3:  # per-token times: already one embedding per action token
            state_token = self.state_proj(state).view(b, 1, -1)
        elif self.export_form:
            # Broadcast by multiplying with ones: XNNPACK has no expand, and views replace `[:, None]`.
            time = time.view(b, 1, -1) * torch.ones(1, actions.shape[1], 1, dtype=actions.dtype, device=x_t.device)
            state_token = self.state_proj(state).view(b, 1, -1)
        else:
            time = time[:, None, :].expand_as(actions)
            state_token = self.state_proj(state)[:, None, :]
        actions = self.time_mlp_out(F.silu(self.time_mlp_in(torch.cat([actions, time], dim=-1))))
        x = torch.cat([state_token, actions], dim=1)

        cos, sin = rope_cos_sin(suffix_positions(prefix_mask, x.shape[1]), self.cfg.head_dim, self.rope_theta, x.dtype)
        mask = suffix_attention_mask(prefix_mask, self.suffix_mask, self.export_form, x.dtype)
        for layer, source in zip(cast(Iterable[DecoderLayer], self.layers), self.layer_map, strict=True):
            q, k, v = layer.qkv(x, cos, sin)
            keys, values = with_prefix(cache, source, k, v)
            x = layer.finish(x, attention(q, keys, values, mask, self.export_form, self.attention_kernel))
        return self.final_norm(x)


class Pi05ActionExpert(nn.Module):
    """pi0.5's expert: adaRMS time conditioning, gated residuals, no state token."""

    export_form = False
    attention_kernel: AttentionKernel = staticmethod(sdpa)  # swapped from outside (precision)
    state_tokens = 0

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e = cfg.expert
        if cfg.goal_head:
            raise ValueError("the goal head reads the state token, which the pi05 variant does not have")
        self.cfg, self.rope_theta = e, cfg.rope_theta
        self.periods = (cfg.time_min_period, cfg.time_max_period)
        self.horizon = cfg.action_horizon
        approximate = "tanh" if cfg.mlp_activation == "gelu_tanh" else "none"
        self.action_in_proj = nn.Linear(cfg.model_action_dim, e.width)
        self.time_mlp_in = nn.Linear(e.width, e.width)
        self.time_mlp_out = nn.Linear(e.width, e.width)
        self.layers = nn.ModuleList(AdaptiveDecoderLayer(e, cfg.norm_eps, approximate) for _ in range(e.depth))
        self.final_norm = AdaRMSNorm(e.width, e.width, cfg.norm_eps)
        self.action_out_proj = nn.Linear(e.width, cfg.model_action_dim)
        self.layer_map = expert_layer_map(cfg.backbone.depth, e.depth)
        self.register_buffer("suffix_mask", self.make_suffix_mask(), persistent=False)

    def make_suffix_mask(self) -> torch.Tensor:
        return torch.ones(self.horizon, self.horizon, dtype=torch.bool)

    def init_buffers(self) -> None:
        self.suffix_mask = self.make_suffix_mask().to(self.action_in_proj.weight.device)

    def forward(
        self, cache: KVCache, prefix_mask: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """Velocity (B, H, model action dim); `state` is unused (it reached the model through the prompt)."""
        return self.action_out_proj(self.suffix(cache, prefix_mask, state, x_t, t))

    def suffix(
        self, cache: KVCache, prefix_mask: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """Final normalized hidden states (B, H, width) of the action tokens; t is (B,) or per token (B, H)."""
        x = self.action_in_proj(x_t)
        time = time_embedding(t, x.shape[-1], *self.periods, float64=not self.export_form).to(x.dtype)
        cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(time))))
        cos, sin = rope_cos_sin(suffix_positions(prefix_mask, x.shape[1]), self.cfg.head_dim, self.rope_theta, x.dtype)
        mask = suffix_attention_mask(prefix_mask, self.suffix_mask, self.export_form, x.dtype)
        for layer, source in zip(cast(Iterable[AdaptiveDecoderLayer], self.layers), self.layer_map, strict=True):
            q, k, v, gate = layer.qkv_gated(x, cos, sin, cond)
            keys, values = with_prefix(cache, source, k, v)
            x = layer.finish_gated(
                x, attention(q, keys, values, mask, self.export_form, self.attention_kernel), gate, cond
            )
        return self.final_norm(x, cond)[0]


EXPERTS: dict[str, type[ActionExpert] | type[Pi05ActionExpert]] = {"pi0": ActionExpert, "pi05": Pi05ActionExpert}
