"""X-VLA as LeRobot 0.6.1 computes it (DESIGN.md 8d): Florence-2's encoder side and a soft-prompted action head.

    encode(inputs)                -> vlm tokens, aux tokens       (once per chunk)
    head(encoded, domain, x_t, t) -> the clean action estimate    (num_steps times)

Every view present goes through DaViT and the projector (tokens = [mean token, grid tokens]); the FIRST view's
tokens and the embedded prompt go through the BART encoder together, every position attended (text padding
too, as the reference does); the other views (zeros for the empty slots after the present ones) go straight to
the head's aux projection. Flow matching predicts the clean action: x_t = noise * t + action * (1 - t) with the
previous step's action, t = i / steps from 1 down. Module and parameter names are those of LeRobot's native
Florence-2 tree (`vlm.vision_tower...`, `vlm.language_model.encoder...`, `transformer...`).

Modules with an `export_form` attribute also compute the same numbers in ops ExecuTorch's XNNPACK backend
delegates (norms spelled out, `bmm` attention, slices for unbinds, products for broadcasts), switched on for an
export by `omni_ros.export.forms.use_export_forms`: torch's own SDPA and LayerNorm export as ops XNNPACK leaves
to the portable kernels, which cut the full-size int8 program into 247 pieces and made it slower than torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.layers import AttentionKernel, MlpKernel, attention, bmm_attention, layer_norm, mlp, sdpa
from omni_ros.policy.xvla.action_space import build_action_space
from omni_ros.policy.xvla.configuration import BartConfig, DaViTConfig, HeadConfig, XVLAConfig

# (clean, x_t, t) -> the step's clean estimate, `clean(x_t, t)` being the network's (see XVLAModel.denoise).
CleanStep = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
EstimateHook = Callable[[CleanStep, torch.Tensor, torch.Tensor], torch.Tensor]


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, w = x.shape
    return x.view(b, n, heads, w // heads).transpose(1, 2)


class FFN(nn.Module):
    mlp_kernel: MlpKernel = staticmethod(mlp)  # swapped from outside (precision)
    mlp_linears = ("fc1", None, "fc2")  # the MLP's first, up and down linears (precision kernels)

    def __init__(self, width: int, hidden: int, activation: str) -> None:
        super().__init__()
        self.fc1, self.fc2, self.activation = nn.Linear(width, hidden), nn.Linear(hidden, width), activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_kernel(self.fc1, None, self.fc2, self.activation, x)


class ConvEmbed(nn.Module):
    export_form = False  # (what use_export_forms switches: the norms spelled out for XNNPACK)

    def __init__(self, cfg: DaViTConfig, stage: int) -> None:
        super().__init__()
        c_in = 3 if stage == 0 else cfg.embed_dim[stage - 1]
        c_out = cfg.embed_dim[stage]
        self.pre_norm = cfg.patch_prenorm[stage]
        self.conv = nn.Conv2d(
            c_in, c_out, cfg.patch_size[stage], stride=cfg.patch_stride[stage], padding=cfg.patch_padding[stage]
        )
        self.norm = nn.LayerNorm(c_in if self.pre_norm else c_out)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(self.norm, x.permute(0, 2, 3, 1), self.export_form).permute(0, 3, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            return self.conv(self._norm(x))
        return self._norm(self.conv(x))


def _window_spans(n: int, s: int) -> list[tuple[slice, int]]:
    """Along one axis of n tokens in windows of s (the last one padded): (which windows, real tokens in each)."""
    count = -(-n // s)
    last = n - (count - 1) * s
    if last == s:
        return [(slice(0, count), s)]
    return ([(slice(0, count - 1), s)] if count > 1 else []) + [(slice(count - 1, count), last)]


class WindowAttention(nn.Module):
    """Attention inside window x window tiles; the grid is zero-padded right and bottom AFTER norm1, so the pad
    tokens carry the qkv bias and are attended to (as in Florence-2).

    Only what the real tokens' outputs need is computed: the projections run on the real tokens (a pad token's
    q / k / v is whatever the qkv layer makes of a zero row, its bias, computed once), and only the real tokens
    query (the pad tokens are keys and values; their outputs would be cropped). At 224 px the grids (56, 28, 14,
    7) pad to (60, 36, 24, 12): on the padded tiles the third stage's qkv, attention and proj, most of the
    tower, were nearly three times the work."""

    attention_kernel: AttentionKernel = staticmethod(sdpa)  # swapped from outside (precision)
    export_form = False  # (what use_export_forms switches: `_export_forward`)

    def __init__(self, dim: int, heads: int, window: int, qkv_bias: bool) -> None:
        super().__init__()
        self.heads, self.window = heads, window
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, h, w, C) normalized tokens -> (B, h * w, C)."""
        if self.export_form:
            return self._export_forward(x)
        b, h, w, c = x.shape
        s, heads = self.window, self.heads
        qkv = self.qkv(x.reshape(b, h * w, c)).view(b, h, w, 3 * c)
        hp, wp = h + (s - h % s) % s, w + (s - w % s) % s
        if (hp, wp) != (h, w):
            # The qkv layer's own answer for a zero row (whatever kernel a precision swapped in), not its bias
            # read from the weights: the pad tokens are what projecting the zero padding would have made.
            pad = self.qkv(x.new_zeros(1, 1, c)).view(3 * c)
            padded = pad.expand(b, hp, wp, 3 * c).clone()
            padded[:, :h, :w] = qkv
            qkv = padded
        tiles = qkv.view(b, hp // s, s, wp // s, s, 3 * c).permute(0, 1, 3, 2, 4, 5)  # (B, ny, nx, s, s, 3C)
        # Only the real tokens' rows are written; the rest is cropped below, never read.
        out = x.new_empty(b, hp // s, wp // s, s, s, c)
        # The windows by how many of their rows and columns are real: the full ones, the last row's, the last
        # column's, the corner (a call each).
        for ys, rows in _window_spans(h, s):
            for xs, cols in _window_spans(w, s):
                group = tiles[:, ys, xs]
                ny, nx = group.shape[1:3]
                k, v = group.reshape(-1, s * s, 3, heads, c // heads)[:, :, 1:].permute(2, 0, 3, 1, 4)
                q = group[..., :rows, :cols, :c].reshape(-1, rows * cols, heads, c // heads).transpose(1, 2)
                attended = self.attention_kernel(q, k, v, None).transpose(1, 2)
                out[:, ys, xs, :rows, :cols] = attended.reshape(b, ny, nx, rows, cols, c)
        out = out.permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
        return self.proj(out[:, :h, :w].reshape(b, h * w, c))

    def _export_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The same outputs in ops XNNPACK delegates: the pad tokens' q / k / v joined by concatenation (a product
        broadcasts them: no expand), every token of a window queries (its rows are independent: the real ones
        are what `forward` computes, the pads' are cropped), one `bmm` attention over all windows, and q / k / v
        cut by slices (no unbind, no in-place writes: copies XNNPACK does not delegate). The pad queries add
        little: attention is ~2% of a DaViT stage's products, the projections stay on the real tokens."""
        b, h, w, c = x.shape
        s, heads = self.window, self.heads
        qkv = self.qkv(x.reshape(b, h * w, c)).view(b, h, w, 3 * c)
        hp, wp = h + (s - h % s) % s, w + (s - w % s) % s
        pad = self.qkv(x[:1, :1, :1] * 0.0)  # (1, 1, 1, 3C): the qkv layer's answer for a zero row
        if wp != w:
            qkv = torch.cat([qkv, pad * torch.ones(b, h, wp - w, 1, dtype=x.dtype, device=x.device)], dim=2)
        if hp != h:
            qkv = torch.cat([qkv, pad * torch.ones(b, hp - h, wp, 1, dtype=x.dtype, device=x.device)], dim=1)
        ny, nx = hp // s, wp // s
        # Images and window rows share one dimension: 5-D tiles, not 6-D (Qualcomm's HTP takes at most rank 5).
        tiles = qkv.view(b * ny, s, nx, s, 3 * c).permute(0, 2, 1, 3, 4).reshape(b * ny * nx, s * s, 3 * c)
        q, k, v = (_split_heads(tiles[..., i * c : (i + 1) * c], heads) for i in range(3))
        out = bmm_attention(q, k, v, None).view(b * ny, nx, s, s, c).permute(0, 2, 1, 3, 4).reshape(b, hp, wp, c)
        return self.proj(out[:, :h, :w].reshape(b, h * w, c))


class ChannelAttention(nn.Module):
    """Attention across the channels of each group (queries are channels, scaled by tokens^-0.5)."""

    export_form = False  # (what use_export_forms switches: one `bmm` attention, q / k / v cut by slices)

    def __init__(self, dim: int, groups: int, qkv_bias: bool) -> None:
        super().__init__()
        self.groups = groups
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        g = self.groups
        if self.export_form:
            qkv = self.qkv(x)
            q, k, v = (qkv[..., i * c : (i + 1) * c].reshape(b, n, g, c // g).permute(0, 2, 3, 1) for i in range(3))
            # bmm_attention scales by its last dim's -0.5 power: n here, as below; out (b, c/g, g, n).
            out = bmm_attention(q, k, v, None).view(b, c // g, g, n).permute(0, 3, 2, 1)
            return self.proj(out.reshape(b, n, c))
        q, k, v = self.qkv(x).view(b, n, 3, g, c // g).permute(2, 0, 3, 4, 1)
        out = F.scaled_dot_product_attention(q, k, v, scale=n**-0.5)  # (b, groups, c/groups, n)
        return self.proj(out.permute(0, 3, 1, 2).reshape(b, n, c))


class DaViTBlockHalf(nn.Module):
    """conv1 residual, norm1 -> attention residual, conv2 residual, norm2 -> FFN residual (on (B, C, H, W))."""

    export_form = False  # (what use_export_forms switches: the norms spelled out for XNNPACK)

    def __init__(self, cfg: DaViTConfig, stage: int, spatial: bool) -> None:
        super().__init__()
        dim = cfg.embed_dim[stage]
        self.spatial = spatial
        self.conv1 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm1 = nn.LayerNorm(dim)
        if spatial:
            self.window_attn = WindowAttention(dim, cfg.num_heads[stage], cfg.window_size, cfg.qkv_bias)
        else:
            self.channel_attn = ChannelAttention(dim, cfg.num_groups[stage], cfg.qkv_bias)
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = FFN(dim, int(dim * cfg.mlp_ratio), cfg.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        x = (self.conv1(x) + x).flatten(2).transpose(1, 2)
        y = layer_norm(self.norm1, x, self.export_form)
        y = self.window_attn(y.view(b, h, w, c)) if self.spatial else self.channel_attn(y)
        x = (x + y).transpose(1, 2).reshape(b, c, h, w)
        x = (self.conv2(x) + x).flatten(2).transpose(1, 2)
        x = x + self.ffn(layer_norm(self.norm2, x, self.export_form))
        return x.transpose(1, 2).reshape(b, c, h, w)


class DaViTBlock(nn.Module):
    def __init__(self, cfg: DaViTConfig, stage: int) -> None:
        super().__init__()
        self.spatial_block = DaViTBlockHalf(cfg, stage, spatial=True)
        self.channel_block = DaViTBlockHalf(cfg, stage, spatial=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.channel_block(self.spatial_block(x))


class DaViT(nn.Module):
    def __init__(self, cfg: DaViTConfig) -> None:
        super().__init__()
        self.convs = nn.ModuleList(ConvEmbed(cfg, i) for i in range(len(cfg.embed_dim)))
        self.blocks = nn.ModuleList(
            nn.ModuleList(DaViTBlock(cfg, i) for _ in range(cfg.depths[i])) for i in range(len(cfg.embed_dim))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, stage in zip(self.convs, self.blocks, strict=True):
            x = conv(x)
            for block in cast(nn.ModuleList, stage):
                x = block(x)
        return x


class PositionEmbedding2D(nn.Module):
    def __init__(self, cfg: DaViTConfig) -> None:
        super().__init__()
        dim = cfg.embed_dim[-1]
        self.row_embeddings = nn.Embedding(cfg.max_position_embeddings, dim // 2)
        self.column_embeddings = nn.Embedding(cfg.max_position_embeddings, dim - dim // 2)

    def forward(self, h: int, w: int) -> torch.Tensor:
        """(C, h, w): the column embedding in the first channels, the row embedding in the rest."""
        if max(h, w) > self.row_embeddings.num_embeddings:
            raise ValueError(
                f"image grid {h}x{w} exceeds Florence-2's {self.row_embeddings.num_embeddings} learned positions"
            )
        dev = self.row_embeddings.weight.device
        cols = self.column_embeddings(torch.arange(w, device=dev))[None].expand(h, w, -1)
        rows = self.row_embeddings(torch.arange(h, device=dev))[:, None].expand(h, w, -1)
        return torch.cat([cols, rows], dim=-1).permute(2, 0, 1)


def temporal_row(dim: int) -> torch.Tensor:
    """Row 0 of Florence-2's cosine temporal table: sin(0) = 0 in the even channels, cos(0) = 1 in the odd."""
    row = torch.zeros(dim)
    row[1::2] = 1.0
    return row


class Projector(nn.Module):
    export_form = False  # (what use_export_forms switches: the norm spelled out for XNNPACK)

    def __init__(self, cfg: DaViTConfig) -> None:
        super().__init__()
        self.image_projection = nn.Linear(cfg.embed_dim[-1], cfg.projection_dim, bias=False)
        self.image_proj_norm = nn.LayerNorm(cfg.projection_dim)
        self.image_position_embed = PositionEmbedding2D(cfg)
        self.register_buffer("temporal", temporal_row(cfg.embed_dim[-1]), persistent=False)

    def init_buffers(self) -> None:
        self.temporal = temporal_row(self.image_projection.in_features).to(self.image_projection.weight.device)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(N, C, h, w) -> (N, 1 + h * w, projection_dim): [mean over the grid, every grid token]."""
        _, _, h, w = features.shape
        x = (features + self.image_position_embed(h, w).to(features.dtype)).flatten(2).transpose(1, 2)
        x = x + self.temporal.to(x.dtype)
        x = torch.cat([x.mean(dim=1, keepdim=True), x], dim=1)
        return layer_norm(self.image_proj_norm, self.image_projection(x), self.export_form)


class BartAttention(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(width, width), nn.Linear(width, width)
        self.v_proj, self.out_proj = nn.Linear(width, width), nn.Linear(width, width)


class BartLayer(nn.Module):
    attention_kernel: AttentionKernel = staticmethod(sdpa)  # swapped from outside (precision)
    export_form = False  # (what use_export_forms switches: bmm attention, the norms spelled out)
    mlp_kernel: MlpKernel = staticmethod(mlp)  # swapped from outside (precision)
    mlp_linears = ("fc1", None, "fc2")  # the MLP's first, up and down linears (precision kernels)

    def __init__(self, cfg: BartConfig) -> None:
        super().__init__()
        w = cfg.width
        self.heads, self.activation = cfg.num_heads, cfg.activation
        self.self_attn = BartAttention(w)
        self.self_attn_layer_norm = nn.LayerNorm(w)
        self.fc1, self.fc2 = nn.Linear(w, cfg.mlp_dim), nn.Linear(cfg.mlp_dim, w)
        self.final_layer_norm = nn.LayerNorm(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.self_attn
        q, k, v = (_split_heads(proj(x), self.heads) for proj in (a.q_proj, a.k_proj, a.v_proj))
        attn = attention(q, k, v, None, self.export_form, self.attention_kernel)
        x = layer_norm(self.self_attn_layer_norm, x + a.out_proj(attn), self.export_form)
        mlp_out = self.mlp_kernel(self.fc1, None, self.fc2, self.activation, x)
        return layer_norm(self.final_layer_norm, x + mlp_out, self.export_form)


class BartEncoder(nn.Module):
    export_form = False  # (what use_export_forms switches: the norm spelled out for XNNPACK)

    def __init__(self, cfg: BartConfig) -> None:
        super().__init__()
        self.embed_scale = math.sqrt(cfg.width) if cfg.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.width)
        self.embed_positions = nn.Embedding(cfg.max_positions + 2, cfg.width)  # BART's offset of 2
        self.layernorm_embedding = nn.LayerNorm(cfg.width)
        self.layers = nn.ModuleList(BartLayer(cfg) for _ in range(cfg.depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        if n + 2 > self.embed_positions.num_embeddings:
            raise ValueError(f"{n} encoder tokens exceed BART's {self.embed_positions.num_embeddings - 2} positions")
        x = x + self.embed_positions.weight[2 : n + 2].to(x.dtype)
        x = layer_norm(self.layernorm_embedding, x, self.export_form)
        for layer in self.layers:
            x = layer(x)
        return x


class LanguageModel(nn.Module):
    def __init__(self, cfg: BartConfig) -> None:
        super().__init__()
        self.encoder = BartEncoder(cfg)


class Florence2(nn.Module):
    def __init__(self, cfg: XVLAConfig) -> None:
        super().__init__()
        self.vision_tower = DaViT(cfg.vision)
        self.multi_modal_projector = Projector(cfg.vision)
        self.language_model = LanguageModel(cfg.text)


class DomainLinear(nn.Module):
    """A linear layer per domain, its (in x out) weight stored flat in an embedding row (x @ W + b)."""

    def __init__(self, n_in: int, n_out: int, domains: int) -> None:
        super().__init__()
        self.n_in, self.n_out = n_in, n_out
        self.fc = nn.Embedding(domains, n_in * n_out)
        self.bias = nn.Embedding(domains, n_out)

    def forward(self, x: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
        weight = self.fc(domain).view(-1, self.n_in, self.n_out)
        return torch.matmul(x, weight) + self.bias(domain)[:, None, :]


class HeadAttention(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)


class HeadBlock(nn.Module):
    attention_kernel: AttentionKernel = staticmethod(sdpa)  # swapped from outside (precision)
    export_form = False  # (what use_export_forms switches: bmm attention, the norms spelled out)

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        w = cfg.width
        self.heads = cfg.num_heads
        self.norm1, self.norm2 = nn.LayerNorm(w), nn.LayerNorm(w)
        self.attn = HeadAttention(w)
        self.mlp = FFN(w, int(w * cfg.mlp_ratio), "gelu_tanh")

    def forward(self, x: torch.Tensor, rows: int | None = None, qkv: torch.Tensor | None = None) -> torch.Tensor:
        """The block's output for every token, or for the first `rows` only (their keys and values still come
        from every token): the head reads its last block's action tokens alone. `qkv`, if given, is
        `attn.qkv(norm1(x))` already computed (the first block's, partly reused across steps)."""
        w = x.shape[-1]
        qkv = self.attn.qkv(layer_norm(self.norm1, x, self.export_form)) if qkv is None else qkv
        # q / k / v cut by slices (an unbind is copies XNNPACK does not delegate).
        q, k, v = (_split_heads(qkv[..., i * w : (i + 1) * w], self.heads) for i in range(3))
        if rows is not None:
            q, x = q[:, :, :rows], x[:, :rows]
        x = x + self.attn.proj(attention(q, k, v, None, self.export_form, self.attention_kernel))
        return x + self.mlp(layer_norm(self.norm2, x, self.export_form))


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 100.0) -> torch.Tensor:
    """[cos, sin] of t * exp(-ln(max_period) * i / half) (X-VLA's order and period)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=t.dtype, device=t.device) / half)
    args = t[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1) if dim % 2 else emb


class HeadContext(NamedTuple):
    """The part of the head's sequence a chunk's steps share (`SoftPromptedTransformer.prepare`)."""

    tokens: torch.Tensor  # (B, M, width): VLM and aux tokens with their positions, then the soft prompts
    qkv: torch.Tensor  # (B, M, 3 * width): the first block's q / k / v of them


class SoftPromptedTransformer(nn.Module):
    export_form = False  # (what use_export_forms switches: the norms spelled out, broadcasts by products)

    def __init__(self, cfg: XVLAConfig) -> None:
        super().__init__()
        h = cfg.head
        self.cfg = h
        d = h.num_domains
        proj = cfg.vision.projection_dim
        proprio = cfg.max_state_dim if cfg.use_proprio else 0
        self.blocks = nn.ModuleList(HeadBlock(h) for _ in range(h.depth))
        if h.use_hetero_proj:
            self.vlm_proj: nn.Module = DomainLinear(proj, h.width, d)
            self.aux_visual_proj: nn.Module = DomainLinear(proj, h.width, d)
        else:
            self.vlm_proj, self.aux_visual_proj = nn.Linear(proj, h.width), nn.Linear(proj, h.width)
        self.pos_emb = nn.Parameter(torch.zeros(1, h.max_len_seq, h.width))
        self.norm = nn.LayerNorm(h.width)
        self.action_encoder = DomainLinear(cfg.model_dim_action + h.dim_time + proprio, h.width, d)
        self.action_decoder = DomainLinear(h.width, cfg.model_dim_action, d)
        if h.len_soft_prompts > 0:
            self.soft_prompt_hub = nn.Embedding(d, h.len_soft_prompts * h.width)

    def project(self, vlm: torch.Tensor, aux: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
        """The VLM and aux tokens in the head's width (the same every denoising step)."""
        hetero = self.cfg.use_hetero_proj
        out = self.vlm_proj(vlm, domain) if hetero else self.vlm_proj(vlm)
        if aux.shape[1] == 0:
            # One camera: no aux tokens. Their empty product adds nothing, and an int8 export cannot take it
            # (torchao's per-token quantization of zero tokens fails while tracing).
            return out
        return torch.cat([out, self.aux_visual_proj(aux, domain) if hetero else self.aux_visual_proj(aux)], dim=1)

    def prepare(self, context: torch.Tensor, domain: torch.Tensor, actions: int) -> HeadContext:
        """What every step of a chunk shares (once per chunk): the tokens after the `actions` action tokens,
        their positions added, then the domain's soft prompts (no positions); and the first block's q / k / v of
        them, which no step changes (the blocks after it see them mixed with the actions)."""
        b, m = context.shape[:2]
        if actions + m > self.pos_emb.shape[1]:
            raise ValueError(f"sequence of {actions + m} tokens exceeds max_len_seq {self.pos_emb.shape[1]}")
        tokens = context + self.pos_emb[:, actions : actions + m]
        if self.cfg.len_soft_prompts > 0:
            tokens = torch.cat([tokens, self.soft_prompt_hub(domain).view(b, self.cfg.len_soft_prompts, -1)], dim=1)
        first = cast(HeadBlock, self.blocks[0])
        return HeadContext(tokens, first.attn.qkv(layer_norm(first.norm1, tokens, self.export_form)))

    def step(
        self, head: HeadContext, domain: torch.Tensor, x_t: torch.Tensor, proprio: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """The clean action estimate (B, H, model_dim_action) for x_t at flow time t."""
        b, n = x_t.shape[:2]
        per_step = torch.cat([proprio, timestep_embedding(t, self.cfg.dim_time)], dim=-1)[:, None]
        if self.export_form:  # XNNPACK has no expand: broadcast by a product
            per_step = per_step * torch.ones(1, n, 1, dtype=x_t.dtype, device=x_t.device)
        else:
            per_step = per_step.expand(b, n, -1)
        actions = self.action_encoder(torch.cat([x_t, per_step], dim=-1), domain) + self.pos_emb[:, :n]
        first = cast(HeadBlock, self.blocks[0])
        qkv = torch.cat([first.attn.qkv(layer_norm(first.norm1, actions, self.export_form)), head.qkv], dim=1)
        x = torch.cat([actions, head.tokens], dim=1)
        # Only the action tokens leave the head: the last block's attention output, projection and MLP run on
        # them alone (the other ~200 tokens of a two-camera sequence are ~3% of a step's products).
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block(x, rows=n if i == last else None, qkv=qkv if i == 0 else None)
        return self.action_decoder(layer_norm(self.norm, x, self.export_form), domain)

    def forward(
        self, context: torch.Tensor, domain: torch.Tensor, x_t: torch.Tensor, proprio: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """One step from the projected context (`project`): `step(prepare(...))`, as an exported step runs it."""
        return self.step(self.prepare(context, domain, x_t.shape[1]), domain, x_t, proprio, t)


class XVLAModel(nn.Module):
    # Camera slots and prompt pads all reach the model (pads are attended, the slot order is positional).
    compactable = False

    def __init__(self, cfg: XVLAConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.action_space = build_action_space(cfg.action_mode, cfg.action_dim, cfg.model_dim_action)
        self.vlm = Florence2(cfg)
        self.transformer = SoftPromptedTransformer(cfg)

    def image_tokens(self, images: torch.Tensor) -> torch.Tensor:
        return self.vlm.multi_modal_projector(self.vlm.vision_tower(images))

    def encode(self, inputs: ModelInputs, domain: torch.Tensor) -> torch.Tensor:
        """The head's context (B, T, width): [first view + prompt through BART, the other views], projected."""
        images, masks = inputs.images, inputs.image_masks
        b, views = images.shape[:2]
        flat, valid = images.flatten(0, 1), masks.flatten()
        if not bool(valid.any()):
            raise ValueError("X-VLA needs at least one camera image")
        feats = self.image_tokens(flat[valid])
        tokens = feats.new_zeros(b * views, *feats.shape[1:])
        tokens[valid] = feats
        tokens = tokens.view(b, views, *feats.shape[1:])
        encoder = self.vlm.language_model.encoder
        text = encoder.embed_tokens(inputs.tokens).to(tokens.dtype) * encoder.embed_scale
        vlm = encoder(torch.cat([tokens[:, 0], text], dim=1))
        aux = tokens[:, 1:].reshape(b, -1, tokens.shape[-1])
        return self.transformer.project(vlm, aux, domain)

    def proprio(self, state: torch.Tensor) -> torch.Tensor:
        if not self.cfg.use_proprio:
            return state.new_zeros(state.shape[0], 0)
        width = self.cfg.max_state_dim
        return F.pad(state, (0, width - state.shape[-1])) if state.shape[-1] < width else state[..., :width]

    def denoise(
        self,
        context: torch.Tensor,
        domain: torch.Tensor,
        proprio: torch.Tensor,
        noise: torch.Tensor,
        num_steps: int,
        estimate: EstimateHook | None = None,
    ) -> torch.Tensor:
        """The chunk from noise (B, H, model_dim_action): each step re-noises the previous clean estimate.

        `estimate(clean, x_t, t)`, if given, makes each step's clean estimate from the network `clean(x_t, t)`
        (real-time chunking: guided or inpainted, omni_ros.policy.rtc); the re-noising stays as it is."""

        head = self.transformer.prepare(context, domain, noise.shape[1])

        def clean(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            p, x = self.action_space.preprocess(proprio, x_t)
            return self.transformer.step(head, domain, x, p, t)

        action = torch.zeros_like(noise)
        steps = max(1, int(num_steps))
        for i in range(steps, 0, -1):
            t = torch.full((noise.shape[0],), i / steps, device=noise.device, dtype=noise.dtype)
            x_t = noise * t[:, None, None] + action * (1 - t)[:, None, None]
            action = clean(x_t, t) if estimate is None else estimate(clean, x_t, t)
        return self.action_space.postprocess(action)

    def sample(self, inputs: ModelInputs, noise: torch.Tensor, domain: torch.Tensor, num_steps: int) -> torch.Tensor:
        """The action chunk (B, H, action width after the action space) from noise (B, H, model_dim_action)."""
        return self.denoise(self.encode(inputs, domain), domain, self.proprio(inputs.state), noise, num_steps)
