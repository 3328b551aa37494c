"""A tied output head in the precision's kernels: the logits of a token decoder whose lm_head is its embedding.

pi0-FAST reads its logits as the final hidden state times the token embedding table (tied, no `nn.Linear`), so
swapping the linears left the largest product of a real checkpoint's decode step in float32: at 257,152 x 2048
the head reads 2.1 GB a token, more than every decoder layer of the bf16 or int8 model together. A model with such
a head holds it as a kernel slot, `head_kernel(hidden, weight)` (`F.linear` by default), and names the embedding
in `tied_head` (a dotted module path); `use_tied_heads` fills the slot with a `Bf16Linear` or `Int8Linear` of that
same weight, so the head follows `policy.precision` as every linear does: bf16 reads the bfloat16 table, int8
the int8 one (per-row scales; one token a step takes the int8 weight x bfloat16 path of int8_linear.py). The
float32 embedding stays for the token lookups. Under autograd, or with another weight, the float product runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

HeadKernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _head_kernel(layer: nn.Module, tied: torch.Tensor) -> HeadKernel:
    def kernel(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if weight is not tied or (torch.is_grad_enabled() and hidden.requires_grad):
            return F.linear(hidden, weight)
        return layer(hidden)

    return kernel


def use_tied_heads(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> int:
    """Fill the `head_kernel` slot of every module of `model` that declares a `tied_head` with the layer `make`
    builds from an `nn.Linear` over the tied embedding's weight (not copied); returns how many."""
    count = 0
    for module in model.modules():
        path = getattr(type(module), "tied_head", None)
        if path is None:
            continue
        embedding = module.get_submodule(path)
        weight = embedding.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            continue  # a bfloat16 or GPU model: its dtype is its precision, as for its linears
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        linear.weight = weight  # the embedding's own parameter: the layer reads it once to make its copy
        # An instance attribute (as set_kernel does), so the class default stays float32 for other models.
        holder: Any = module
        holder.head_kernel = _head_kernel(make(linear), weight)
        count += 1
    return count
