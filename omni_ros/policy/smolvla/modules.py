"""SmolVLA's building blocks: SmolVLM's vision encoder + pixel-shuffle connector, its Llama-style decoder layers.

The decoder layer is the pi0 family's (q/k/v/o with grouped KV heads, `project` / `finish` split so a caller
mixes in cached keys and values) with Llama's pieces swapped in: RMSNorm `weight * x / rms` and a SiLU-gated
MLP. Modules with an `export_form` attribute have a second, numerically equivalent form that ExecuTorch's
XNNPACK backend delegates (see `omni_ros.policy.layers`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
from torch import nn

from omni_ros.policy.layers import MlpKernel, layer_norm, mean_last, mlp
from omni_ros.policy.pi0.configuration import TransformerConfig
from omni_ros.policy.pi0.gemma import DecoderLayer
from omni_ros.policy.pi0.vision import VitBlock
from omni_ros.policy.smolvla.configuration import VisionConfig


class LlamaRMSNorm(nn.Module):
    """x / rms(x) * weight, in float32 (Llama's; Gemma's pi0 norm scales by 1 + weight instead)."""

    export_form = False

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.export_form:  # exported programs are float32 throughout: no casts (each is graph nodes to lower)
            return self.weight * (x * torch.rsqrt(mean_last(x * x) + self.eps))
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class SiluMLP(nn.Module):
    mlp_kernel: MlpKernel = staticmethod(mlp)  # swapped from outside (precision)
    mlp_linears = ("gate_proj", "up_proj", "down_proj")  # the MLP's first, up and down linears (precision kernels)
    activation = "silu"
    shared_input_linears = (("gate_proj", "up_proj"),)  # linears that read the same tensor (precision kernels)

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_kernel(self.gate_proj, self.up_proj, self.down_proj, self.activation, x)


class LlamaLayer(DecoderLayer):
    """A decoder layer of SmolVLM's text model or of SmolVLA's expert.

    `kv_width` is the input width of k_proj / v_proj when it is not the layer's own: an expert layer that
    cross-attends projects the VLM's cached keys and values (kv_heads * head_dim wide), not its hidden states.
    """

    def __init__(
        self, width: int, heads: int, kv_heads: int, head_dim: int, mlp_dim: int, eps: float, kv_width: int = 0
    ) -> None:
        with torch.device("meta"):  # the Gemma pieces below are replaced at once: never allocate them
            super().__init__(TransformerConfig(width, 1, heads, kv_heads, head_dim, mlp_dim), eps)
        self.q_proj = nn.Linear(width, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(kv_width or width, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(kv_width or width, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, width, bias=False)
        if kv_width:  # cross-attending: q reads the layer's hidden states, k / v the VLM's keys and values
            self.shared_input_linears = (("k_proj", "v_proj"),)
        self.input_norm = LlamaRMSNorm(width, eps)
        self.post_attn_norm = LlamaRMSNorm(width, eps)
        self.mlp = SiluMLP(width, mlp_dim)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin (B, 1, T, head_dim/2) for positions (B, T), as SmolVLA computes them: position / theta^(2i/d)."""
    exponents = (2.0 / head_dim) * torch.arange(head_dim // 2, dtype=torch.float32, device=positions.device)
    radians = positions.float()[:, None, :, None] / (theta**exponents)
    return radians.cos().to(dtype), radians.sin().to(dtype)


def vision_position_ids(grid: int, native_side: int) -> torch.Tensor:
    """Position-embedding rows (grid * grid,) of a grid x grid patch image, as SmolVLM buckets them.

    SmolVLM maps each patch's fractional coordinate onto the native (native_side x native_side) table, so a
    tile of the native size reads the table in order; another size reads it resampled. Float32 as SmolVLM.
    """
    cpu = torch.device("cpu")  # a constant of the config: computed even while the model is built on meta
    boundaries = torch.arange(1 / native_side, 1.0, 1 / native_side, device=cpu)
    step = 1.0 / torch.tensor([grid], device=cpu)
    coords = (torch.arange(grid, dtype=torch.float32, device=cpu)[None, :] * step[:, None]).clamp(max=1.0 - 1e-6)
    buckets = torch.bucketize(coords, boundaries, right=True)[0]
    return (buckets[:, None] * native_side + buckets[None, :]).flatten()


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """(N, side * side, W) patch features -> (N, side^2 / scale^2, W * scale^2): SmolVLM's connector order."""
    n, seq, width = x.shape
    side = int(seq**0.5)
    x = x.reshape(n, side, side // scale, width * scale).permute(0, 2, 1, 3)
    x = x.reshape(n, side // scale, side // scale, width * scale * scale).permute(0, 2, 1, 3)
    return x.reshape(n, seq // (scale * scale), width * scale * scale)


class SmolVLMVision(nn.Module):
    """Patch embedding + positions + SigLIP blocks (tanh GELU) + post norm, then the pixel-shuffle connector
    (a linear without bias) into the text width: one tile (N, 3, S, S) -> (N, tokens_per_camera, out_width)."""

    export_form = False

    def __init__(self, cfg: VisionConfig, tile_size: int, out_width: int) -> None:
        super().__init__()
        self.cfg, self.tile_size = cfg, tile_size
        self.patch_embed = nn.Conv2d(3, cfg.width, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        native = cfg.image_size // cfg.patch_size
        self.pos_embed = nn.Parameter(torch.randn(native * native, cfg.width) * 0.02)
        self.blocks = nn.ModuleList(VitBlock(cfg, "tanh") for _ in range(cfg.depth))
        for block in cast(Iterable[VitBlock], self.blocks):
            block.norm1.eps = block.norm2.eps = cfg.norm_eps
        self.norm = nn.LayerNorm(cfg.width, eps=cfg.norm_eps)
        self.connector = nn.Linear(cfg.width * cfg.scale_factor**2, out_width, bias=False)
        ids = vision_position_ids(tile_size // cfg.patch_size, native)
        # The usual case (the tile is the encoder's native size) reads the table in order: no gather.
        self.in_order = bool(
            ids.numel() == native * native and torch.equal(ids, torch.arange(ids.numel(), device=ids.device))
        )
        self.register_buffer("position_ids", ids, persistent=False)

    def init_buffers(self) -> None:
        native = self.cfg.image_size // self.cfg.patch_size
        ids = vision_position_ids(self.tile_size // self.cfg.patch_size, native)
        self.position_ids = ids.to(self.pos_embed.device)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = x + (self.pos_embed if self.in_order else self.pos_embed[self.position_ids])
        if not self.export_form:
            x = x.contiguous()  # else the residual stream stays in the patch grid's transposed layout (pi0/vision.py)
        for block in self.blocks:
            x = block(x)
        x = layer_norm(self.norm, x, self.export_form)
        return self.connector(pixel_shuffle(x, self.cfg.scale_factor))
