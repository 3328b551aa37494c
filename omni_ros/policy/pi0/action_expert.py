"""The action expert: a smaller transformer over the suffix [state token, H action tokens].

Each expert layer attends to the cached prefix keys/values of one backbone
layer (`layer_map`) and to the suffix itself: the state token sees the prefix
and itself, action tokens see the prefix, the state and every action token.
The flow-matching time is mixed into the action tokens by an MLP (pi0).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.layers import additive_mask, attention, rope_cos_sin
from omni_ros.policy.pi0.backbone import KVCache
from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.policy.pi0.gemma import DecoderLayer, RMSNorm


def time_embedding(t: torch.Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0) -> torch.Tensor:
    """Sine-cosine embedding (B, dim) of flow-matching times t (B,) in [0, 1]."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, device=t.device, dtype=torch.float32)
    period = min_period * (max_period / min_period) ** fraction
    angles = t.float()[:, None] * (2 * math.pi / period)[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def expert_layer_map(backbone_depth: int, expert_depth: int) -> list[int]:
    """Backbone layer whose cache each expert layer reads: evenly spaced, ending at the last one."""
    return [(j + 1) * backbone_depth // expert_depth - 1 for j in range(expert_depth)]


class ActionExpert(nn.Module):
    export_form = False

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e = cfg.expert
        self.cfg, self.rope_theta = e, cfg.rope_theta
        self.horizon = cfg.action_horizon
        self.state_proj = nn.Linear(cfg.state_dim, e.width)
        self.action_in_proj = nn.Linear(cfg.action_dim, e.width)
        self.time_mlp_in = nn.Linear(2 * e.width, e.width)
        self.time_mlp_out = nn.Linear(e.width, e.width)
        self.layers = nn.ModuleList(DecoderLayer(e, cfg.norm_eps) for _ in range(e.depth))
        self.final_norm = RMSNorm(e.width, cfg.norm_eps)
        self.action_out_proj = nn.Linear(e.width, cfg.action_dim)
        self.goal_out_proj = nn.Linear(e.width, cfg.action_dim) if cfg.goal_head else None
        self.layer_map = expert_layer_map(cfg.backbone.depth, e.depth)
        # Suffix self-attention: the state token (row 0) cannot see the actions.
        suffix_mask = torch.ones(1 + self.horizon, 1 + self.horizon, dtype=torch.bool)
        suffix_mask[0, 1:] = False
        self.register_buffer("suffix_mask", suffix_mask, persistent=False)

    def forward(
        self, cache: KVCache, prefix_mask: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """Velocity (B, H, action_dim) at noisy actions x_t (B, H, action_dim), times t (B,)."""
        return self.action_out_proj(self.suffix(cache, prefix_mask, state, x_t, t)[:, 1:])

    def goal(self, suffix: torch.Tensor) -> torch.Tensor:
        """The goal head's prediction (B, action_dim) from the state token of `suffix` (training only)."""
        if self.goal_out_proj is None:
            raise RuntimeError("this model has no goal head (ModelConfig.goal_head is false)")
        return self.goal_out_proj(suffix[:, 0])

    def suffix(
        self, cache: KVCache, prefix_mask: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """Final normalized hidden states (B, 1 + H, width) of [state token, action tokens]."""
        b = x_t.shape[0]
        actions = self.action_in_proj(x_t)
        time = time_embedding(t, actions.shape[-1]).to(actions.dtype)
        if self.export_form:
            # Broadcast by multiplying with ones: XNNPACK has no expand, and views replace `[:, None]`.
            time = time.view(b, 1, -1) * torch.ones(1, actions.shape[1], 1, dtype=actions.dtype, device=x_t.device)
            state_token = self.state_proj(state).view(b, 1, -1)
        else:
            time = time[:, None, :].expand_as(actions)
            state_token = self.state_proj(state)[:, None, :]
        actions = self.time_mlp_out(F.silu(self.time_mlp_in(torch.cat([actions, time], dim=-1))))
        x = torch.cat([state_token, actions], dim=1)

        s = x.shape[1]
        positions = prefix_mask.long().sum(dim=1, keepdim=True) + torch.arange(s, device=x.device)[None, :]
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.rope_theta, x.dtype)
        mask = torch.cat([prefix_mask[:, None, :].expand(b, s, -1), self.suffix_mask[None].expand(b, -1, -1)], dim=2)[
            :, None
        ]
        if self.export_form:
            mask = additive_mask(mask, x.dtype)
        for layer, source in zip(self.layers, self.layer_map, strict=True):
            q, k, v = layer.qkv(x, cos, sin)
            prefix_k, prefix_v = cache[source]
            keys, values = torch.cat([prefix_k, k], dim=2), torch.cat([prefix_v, v], dim=2)
            x = layer.finish(x, attention(q, keys, values, mask, self.export_form))
        return self.final_norm(x)
