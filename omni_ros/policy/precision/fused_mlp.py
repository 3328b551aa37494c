"""A bf16 MLP fused into oneDNN's products: the kernel a bf16 precision swaps into every module with an MLP.

With bf16 linears alone an MLP makes five passes over its widest activation: the first product's bfloat16
output cast to float32, the activation (several elementwise ops), the gate times up, and the cast back to
bfloat16 for the down projection. On a full-size SmolVLA's vision tower (2 cameras, 1024 patches each, one
thread, AMX Xeon) those passes cost more than the GEMMs around them. Here the activation is a post-op of the
first product (computed on its float32 accumulator, then rounded to bfloat16 once), the gated product's
multiplication a post-op of the up projection, and the hidden activation stays bfloat16 until the down
projection reads it: the MLP of a SigLIP block ran 86 ms against 167 (fc1 2048 x 768 -> 3072, scratch), as close
to float32 (0.38% relative error against 0.43% there; a full-size SmolVLA's chunk 0.41% against 0.38%).
Under autograd (guided RTC), or where a layer is not a packed bf16 linear, the eager kernel runs.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from omni_ros.policy.layers import MlpKernel, mlp
from omni_ros.policy.linear_swap import set_kernel
from omni_ros.policy.precision.bf16_linear import Bf16Linear

# Our activation names -> oneDNN's unary post-op and its algorithm.
_POST_OPS = {"gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"), "silu": ("swish", "")}


def _packed(layer: nn.Module | None) -> bool:
    return layer is None or (isinstance(layer, Bf16Linear) and layer.packed)


def bf16_mlp(first: nn.Module, up: nn.Module | None, down: nn.Module, activation: str, x: torch.Tensor) -> torch.Tensor:
    """`layers.mlp` with the activation and the gate's multiplication fused into the bf16 products; float32 out."""
    if (torch.is_grad_enabled() and x.requires_grad) or not (_packed(first) and _packed(up) and _packed(down)):
        return mlp(first, up, down, activation, x)
    first_, down_ = cast(Bf16Linear, first), cast(Bf16Linear, down)
    xb = first_.bf16_input(x)
    hidden = first_.product(xb, *_POST_OPS[activation])
    if up is not None and torch.compiler.is_compiling():
        # The binary post-op has no tracing rule (torch 2.13); in a compiled step the multiplication is fused anyway.
        hidden = hidden * cast(Bf16Linear, up).product(xb)
    elif up is not None:
        hidden = cast(Bf16Linear, up).product_times(xb, hidden)
    return down_.product(hidden).to(x.dtype)


def use_mlp_kernel(model: nn.Module, kernel: MlpKernel) -> int:
    """Set `kernel` on every module of `model` with an `mlp_kernel`; returns how many."""
    return set_kernel(model, "mlp_kernel", kernel)
