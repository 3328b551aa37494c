"""Linears that read one tensor as one product: the q / k / v and gate / up a module declares together in
`shared_input_linears`, for oneDNN's int8 kernel.

A denoising step multiplies 50 rows by each weight, and there each call's fixed cost (a oneDNN primitive and its
parallel region, the row scaling around it), not its arithmetic or the weight it reads, sets the time: a
full-size SmolVLA step's int8 products took 7.3x the time it takes to read their weights, stacked
(docs/precision.md, bench/results/gemm_kernels_smolvla_weight_read_amx.json). Stacked, that step's 96 products
are 64, and its compiled int8 chunk ran 0.978x the unstacked one (denoising 0.975x) with the same actions, bit for bit
(bench/results/realtime_stacked.json: both policies in one process, chunks alternating). bf16 stacks nothing:
its stacked chunk was 1.022x the unstacked one in the same run (its MLPs keep their fused kernel anyway:
fused_mlp.py makes the activation a post-op of the first product, which a stacked product cannot give half
its columns).

The stacked layer is the precision's own `Int8Linear` (swapped in like any other linear) over the members'
float weights side by side: weights per output channel and activations per token make its columns the members'
own numbers (the same integers and scales). Each member is a slice of its output, kept for the very input tensor
that produced it (per thread, unmodified: as SharedInput keeps conversions); a member called with another tensor
computes the product again, never wrong. Traced into a compiled graph every member computes the stacked product
and the compiler merges the identical calls into one.

Left apart: the XNNPACK kernels (they stack their groups themselves, xnnpack_linears.py), float32 (its numbers
stay LeRobot's), the robot-side layers, and members whose input widths or biases differ.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from omni_ros.policy.linear_swap import float_cpu_linear
from omni_ros.policy.precision.shared_input import SharedInput


class StackedLinears(nn.Module):
    """The stacked product of a group of linears; its last output kept per thread for the input that made it."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer  # a float nn.Linear until the precision swaps it
        # The same rule as a shared input conversion: per thread, for that very unmodified tensor; computed afresh
        # while tracing, where the compiler merges the members' identical calls.
        self._last = SharedInput()

    def output(self, x: torch.Tensor) -> torch.Tensor:
        return self._last.get(x, self.layer)


class StackedSlice(nn.Module):
    """One member of a stacked group: its columns of the group's product."""

    swapped_linear = True  # weight_count counts its share of the stacked weights

    def __init__(self, stacked: StackedLinears, start: int, stop: int, linear: nn.Linear) -> None:
        super().__init__()
        self.stacked = stacked  # the same module in every member (named_modules yields it once)
        self.start, self.stop = start, stop
        self.in_features, self.out_features = linear.in_features, stop - start
        # The member's own bias, read by weight_count (the product adds the stacked layer's copy of it).
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stacked.output(x)[..., self.start : self.stop]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, columns {self.start}:{self.stop}"


def stack_shared_input_linears(model: nn.Module, keep: Callable[[nn.Module, str], bool]) -> int:
    """Replace each group of float32 linears a module of `model` declares in `shared_input_linears` by one
    stacked linear and a `StackedSlice` per member, in place (before the precision swaps the linears); members
    `keep(module, name)` accepts stay apart. Returns how many groups were stacked."""
    from omni_ros.policy.layouts.weights import release_mapped_pages

    count = 0
    for module in list(model.modules()):
        for names in getattr(module, "shared_input_linears", ()):
            members = [(n, getattr(module, n)) for n in names if not keep(module, n)]
            linears = [m for _, m in members]
            if len(members) < 2 or not all(float_cpu_linear(m) for m in linears):
                continue
            if len({m.in_features for m in linears}) != 1 or len({m.bias is None for m in linears}) != 1:
                continue
            width, bias = sum(m.out_features for m in linears), linears[0].bias is not None
            # Built on the meta device and given the stacked tensors: no random initialization of weights that are
            # replaced at once (a full-size pi0's groups are over a billion of them).
            layer = nn.Linear(linears[0].in_features, width, bias=bias, device="meta")
            layer.weight = nn.Parameter(torch.cat([m.weight.detach() for m in linears]), requires_grad=False)
            if bias:
                biases = [m.bias.detach() for m in linears if m.bias is not None]
                layer.bias = nn.Parameter(torch.cat(biases), requires_grad=False)
            stacked, start = StackedLinears(layer), 0
            for name, linear in members:
                setattr(module, name, StackedSlice(stacked, start, start + linear.out_features, linear))
                start += linear.out_features
                release_mapped_pages(linear.weight.detach())
            count += 1
    return count
