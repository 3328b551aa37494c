"""Transformer pieces every family shares: rotary embeddings, grouped-query attention, mask helpers.

Attention takes an explicit boolean mask so one function serves the
bidirectional prefix, the suffix reading the cached prefix, and padding.

Modules with an `export_form` attribute also have a second, numerically
equivalent form written only with operators ExecuTorch's XNNPACK backend
delegates (3-D `bmm` attention with an additive mask, norms as a 4-D mean).
It is slower in eager PyTorch, so it is off unless
`omni_ros.export.forms.use_export_forms` turns it on for an export.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def mean_last(x: torch.Tensor) -> torch.Tensor:
    """Mean over the last dim (keepdim) computed as a 4-D reduction: XNNPACK only delegates that form of mean."""
    lead = x.shape[:-1]
    return x.reshape(-1, 1, x.shape[-1], 1).mean(dim=(2, 3), keepdim=True).reshape(*lead, 1)


def layer_norm(norm: nn.LayerNorm, x: torch.Tensor, export_form: bool) -> torch.Tensor:
    """`norm(x)`, or the same LayerNorm spelled out with ops XNNPACK delegates."""
    if not export_form:
        return norm(x)
    centered = x - mean_last(x)
    return centered * torch.rsqrt(mean_last(centered * centered) + norm.eps) * norm.weight + norm.bias


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin tables of shape (B, 1, T, head_dim/2) for integer positions (B, T)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None, :, None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


# (positions (B, T), head_dim, theta, dtype) -> cos, sin of shape (B, 1, T, head_dim / 2): a family's convention.
RopeFn = Callable[[torch.Tensor, int, float, torch.dtype], tuple[torch.Tensor, torch.Tensor]]


class RotaryTable(nn.Module):
    """Rotary cos/sin for integer positions, as the family's `rope` computes them.

    The export form looks them up in a table of positions -1 .. max_position - 1 made by the same `rope` (the same
    numbers, bit for bit), so the exported graph has no sin/cos of an angle. Quantized for the HTP, an angle of
    position / theta^(2i/d) spans a hundred radians or more, and its rounding alone turns sin and cos into noise
    (measured on the SmolVLA fixture: keys 1.4 away on a scale of 3 with 16-bit activations); the table's entries
    stay in [-1, 1]. Position -1 is what a cumulative-sum position gives a padded token before the first valid one.
    """

    export_form = False

    def __init__(self, rope: RopeFn, head_dim: int, theta: float, max_position: int) -> None:
        super().__init__()
        self.rope, self.head_dim, self.theta, self.max_position = rope, head_dim, theta, max_position
        cos, sin = self.make_tables(torch.device("cpu"))
        self.cos_table: torch.Tensor
        self.sin_table: torch.Tensor
        self.register_buffer("cos_table", cos, persistent=False)
        self.register_buffer("sin_table", sin, persistent=False)

    def make_tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (max_position + 1, head_dim / 2) of positions -1 .. max_position - 1, float32."""
        rows = torch.arange(-1, self.max_position, device=device)[None]
        cos, sin = self.rope(rows, self.head_dim, self.theta, torch.float32)
        return cos[0, 0], sin[0, 0]

    def init_buffers(self) -> None:
        device = self.cos_table.device
        self.cos_table, self.sin_table = self.make_tables(torch.device("cpu") if device.type == "meta" else device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.export_form:
            return self.rope(positions, self.head_dim, self.theta, dtype)
        # A row lookup, as a token embedding is (one Gather each: the form every backend places).
        rows = positions + 1
        cos, sin = F.embedding(rows, self.cos_table), F.embedding(rows, self.sin_table)
        return cos[:, None].to(dtype), sin[:, None].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as a float bias: 0 where attended, a huge negative number elsewhere."""
    return torch.where(mask, torch.zeros((), dtype=dtype), torch.full((), -1e30, dtype=dtype))


AttentionKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


# A query of at most this many rows per head is folded: the heads sharing a K/V head become one head's rows.
FOLD_ROWS = 64


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The eager attention kernel: q (B, H, Tq, D), k/v (B, KV, Tk, D), boolean mask -> (B, H, Tq, D).

    Modules that attend hold their kernel as `attention_kernel` (this one by default), so a precision can swap
    in another from outside the model (omni_ros/policy/precision/attention.py), as it swaps linears.

    The mask costs torch's CPU flash attention a third of its time (pi0 edge's prefix, bf16, one thread: 3.4 ms
    with an all-True mask, 2.1 without), and the masks the families build are mostly True: a prefix that
    attends to all of itself, a denoising step whose state row alone may not see the actions, a decoding step
    that sees its prompt and the tokens before it. So rows that attend to every key run without a mask: all of
    them (the mask is dropped), or a trailing run of them at least as long as the masked rows before it (two
    calls; the masked rows' call leaves out the keys none of them attends to, and its mask where it is then all
    True). Each row's softmax is its own, so the numbers are the same. On a GPU the mask stays (reading it would
    stall the stream).
    """
    if mask is None or mask.dtype != torch.bool or mask.device.type != "cpu" or torch.compiler.is_compiling():
        # A compiled graph (omni_ros/policy/compiled_stages.py) cannot read the mask's values while tracing.
        return _sdpa(q, k, v, mask)
    # The checks read the mask through numpy (no copy): torch's reductions of a small bool tensor took 8 us
    # each, numpy's 1.6, which matters beside a decoding step's 20 us attention.
    m = mask.numpy()
    if m.all():
        return _sdpa(q, k, v, None)
    tq = q.shape[2]
    if m.shape[-2] != tq or tq < 2 or not m[..., tq // 2 :, :].all() or not m.any(axis=-1).all():
        # More masked rows than full ones after them, or a row that attends to nothing (whatever torch makes
        # of it). Leaving out the keys no row attends to would not pay here: a decoding step's cache is mostly
        # seen, and slicing k, v and the mask costs about what it saves (bf16, one row: 8 us of 23).
        return _sdpa(q, k, v, mask)
    full = m.all(axis=-1).reshape(-1, tq).all(axis=0)  # rows that attend to every key, in every batch
    masked = int(np.flatnonzero(~full)[-1]) + 1  # the rows before the trailing run of full ones
    k_head, v_head, head_mask, head = _seen_keys(k, v, mask[..., :masked, :], m[..., :masked, :])
    out = _sdpa(q[:, :, :masked], k_head, v_head, None if head.all() else head_mask)
    return torch.cat([out, _sdpa(q[:, :, masked:], k, v, None)], dim=2)


def _seen_keys(
    k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, m: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
    """k, v and the mask (torch and numpy) without the trailing keys no row attends to (every row attends to one)."""
    tk = m.shape[-1]
    seen = int(np.flatnonzero(m.reshape(-1, tk).any(axis=0))[-1]) + 1
    if seen == tk:
        return k, v, mask, m
    return k[:, :, :seen], v[:, :, :seen], mask[..., :seen], m[..., :seen]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    b, h, tq, d = q.shape
    kv = k.shape[1]
    if mask is None and kv != h and tq <= FOLD_ROWS:
        # A few rows per head (a denoising step's chunk, a decoding step's one token) fill the kernel's row
        # blocks poorly; the query heads of one K/V head folded into one head's rows fill them (pi0 edge's
        # denoising attention, 8 heads x 51 rows on one K/V head, bf16: 0.69x the time, one thread).
        rows = q.reshape(b, kv, (h // kv) * tq, d)
        return F.scaled_dot_product_attention(rows, k, v).view(b, h, tq, d)
    # Grouped-query attention in the kernel: K/V are read per group, not copied per query head
    # (repeat_interleave cost 0.6 ms of 3.5 per pi0 edge denoise attention, measured).
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=kv != h)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    export_form: bool = False,
    kernel: AttentionKernel = sdpa,
) -> torch.Tensor:
    """q (B, H, Tq, D), k/v (B, KV, Tk, D), mask (B, 1, Tq, Tk) -> (B, Tq, H*D).

    The mask is boolean (True = attend) or, in the export form, an additive float bias (`additive_mask`).
    """
    if export_form:
        return bmm_attention(q, k, v, mask)
    return kernel(q, k, v, mask).transpose(1, 2).flatten(2)


def bmm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Softmax attention as two 3-D `bmm`s, with an additive float mask `bias` (B, 1, Tq, Tk) or None."""
    b, h, tq, d = q.shape
    kv, tk = k.shape[1], k.shape[2]
    groups = h // kv
    # The query heads sharing one KV head are folded into the query length, so K/V are used as they are
    # (no repeat, no 4-D matmul, both of which become copies XNNPACK does not delegate).
    q3 = (q * d**-0.5).reshape(b * kv, groups * tq, d)
    scores = torch.bmm(q3, k.reshape(b * kv, tk, d).transpose(1, 2))
    if bias is not None:
        scores = (scores.view(b, h, tq, tk) + bias).view(b * kv, groups * tq, tk)
    out = torch.bmm(torch.softmax(scores, dim=-1), v.reshape(b * kv, tk, d))
    return out.view(b, h, tq, d).transpose(1, 2).reshape(b, tq, h * d)


# (first, up, down, activation, x) -> the block's MLP output: down(act(first(x))) for a two-layer MLP (`up` None:
# SigLIP's fc1 / fc2), down(act(first(x)) * up(x)) for a gated one (Gemma's and Llama's gate / up / down).
# Modules with an MLP hold their kernel as `mlp_kernel` (`mlp` by default), so that a precision swaps in a fused
# one from outside (omni_ros/policy/precision/fused_mlp.py), as it swaps the attention kernel.
MlpKernel = Callable[[nn.Module, "nn.Module | None", nn.Module, str, torch.Tensor], torch.Tensor]
ACTIVATIONS = ("gelu", "gelu_tanh", "silu")


def activate(x: torch.Tensor, activation: str) -> torch.Tensor:
    """One of `ACTIVATIONS` (gelu_tanh: the tanh approximation of GELU)."""
    if activation == "silu":
        return F.silu(x)
    return gelu(x, "tanh" if activation == "gelu_tanh" else "none")


def mlp(first: nn.Module, up: nn.Module | None, down: nn.Module, activation: str, x: torch.Tensor) -> torch.Tensor:
    """The eager MLP kernel (see `MlpKernel`)."""
    hidden = activate(first(x), activation)
    return down(hidden if up is None else hidden * up(x))


def gelu(x: torch.Tensor, approximate: str = "none", export_form: bool = False) -> torch.Tensor:
    """GELU, exact ("none") or the tanh approximation ("tanh", the reference pi0 models' choice).

    XNNPACK computes exact GELU even when the graph asks for tanh, so the export form writes the tanh
    approximation out in elementary ops, which it delegates as they are.
    """
    if approximate == "tanh" and export_form:
        return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    if approximate == "tanh" and not torch.is_grad_enabled() and x.device.type == "cpu":
        return gelu_tanh_inference(x)
    return F.gelu(x, approximate=approximate)


_SQRT_2_OVER_PI = 0.7978845608028654
_GELU_C0 = torch.tensor(2 * _SQRT_2_OVER_PI)


def gelu_tanh_inference(x: torch.Tensor) -> torch.Tensor:
    """The tanh GELU as x * sigmoid(2 * sqrt(2/pi) * (x + 0.044715 x^3)), the same function
    (0.5 * (1 + tanh(z)) = sigmoid(2z)), in four passes over one temporary.

    torch's tanh-GELU kernel took 9.0 ms for a (534, 2048) pi0 MLP activation on an AVX2 CPU, this sigmoid form
    in six elementwise passes 5.4 ms; on an AMX Xeon (522, 2048): torch 1.89 ms, six passes 1.65, these four
    (c0 + c1 x^2 as one addcmul) 1.31 (one thread, scratch). It agrees with torch's to 5e-7. In-place ops, so
    inference only (no autograd).
    """
    z = torch.addcmul(_GELU_C0, x, x, value=0.044715 * 2 * _SQRT_2_OVER_PI)  # c0 + c1 x^2 in one pass
    return z.mul_(x).sigmoid_().mul_(x)
