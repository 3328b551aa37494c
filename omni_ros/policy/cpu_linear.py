"""Linear layers on the CPU through oneDNN with weights packed once, for the eager CPU runner.

torch's `F.linear` on x86 CPUs calls MKL's sgemm on a plain (out, in) weight. oneDNN (which torch ships as
its mkldnn backend) runs the same product from a weight reordered once into its blocked layout, and on
the AMD EPYC (AVX2) of our CI machine that is faster at every pi0 and SmolVLA shape: 1.03-1.25x at one
thread, 1.02-1.49x at two, median 1.11x / 1.15x (`bench/cpu_linear.py`; pi0's (534, 512) x (512, 2048) MLP
product: 33 vs 36 GFLOP/s). GEMMs are two thirds of a pi0 or SmolVLA inference on a CPU, so this is the
largest single lever eager has (a whole chunk: pi0 edge 5-9%, full-size SmolVLA 16% faster).

`pack_linears(model)` swaps every float32 `nn.Linear` for a `PackedLinear` in place (the model is the
runner's, for inference); the dense weight is let go, so memory does not double (a weight still mapped
from its checkpoint file has its pages dropped). Where a gradient is needed (guided real-time chunking
differentiates through a denoising step) the layer reads its weight back to the dense layout for that
call: oneDNN's packed product has no autograd formula.
"""

from __future__ import annotations

import logging
import platform
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger("omni_ros.policy")


def packed_linear_available() -> bool:
    """oneDNN's packed linear is in this torch build, on an x86 CPU (where it was measured to win)."""
    machine = platform.machine().lower()
    ops = getattr(torch.ops, "mkldnn", None)
    return (
        machine in ("x86_64", "amd64")
        and torch.backends.mkldnn.is_available()
        and ops is not None
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


class _LaidOutLinear(nn.Module):
    """What the float32 layouts below share: `nn.Linear`'s sizes and bias, its weight held in another layout."""

    swapped_linear = True  # its weight is no parameter: weight_count counts it

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = None if linear.bias is None else linear.bias.detach()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class PackedLinear(_LaidOutLinear):
    """`nn.Linear` (float32, CPU) whose weight is held in oneDNN's packed layout."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)

    @property
    def weight(self) -> torch.Tensor:
        """The packed weight (its `.device` and `.dtype` are the layer's; read with `.to_dense()`)."""
        return self.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return F.linear(x, self.packed.to_dense(), self.bias)
        # Rows in 2-D, as torch's own packing pass hands them: inductor's frozen-graph pass that folds a reshape
        # before and after a packed linear asserts a 2-D input, and failed (SmolVLA's cross-attention k / v,
        # compiled float32, fell back to the eager prefill). The same product either way.
        rows = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), self.packed, self.bias, "none", [], "")
        return rows.view(*x.shape[:-1], self.out_features)


class TransposedLinear(_LaidOutLinear):
    """`nn.Linear` (float32, CPU) whose weight is held transposed, (in, out) contiguous: `x @ weight_t`.

    For a single row through a widening layer: one token's 512 -> 2048 product read its 4 MB weight from memory at
    18 GB/s this way against 8 GB/s from the plain (out, in) weight (MKL's sgemm with a transposed operand) and
    11 from oneDNN's packed one, one thread, weights not in cache (AMD EPYC, scratch micro-benchmark); narrowing
    and square layers gained nothing (2048 -> 512: 376 us against 239 plain and 305 packed). At hundreds of rows
    it is MKL's plain product again (within 1%)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        self.weight_t = linear.weight.detach().t().contiguous()

    @property
    def weight(self) -> torch.Tensor:
        """The (out, in) weight, as a view of the transposed one."""
        return self.weight_t.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias


def row_vector_layout(linear: nn.Linear) -> str:
    """The layout for a linear that mostly multiplies one row at a time (a decoder's token): "transposed" where it
    widens (2.2x the plain weight's speed at one thread on the AMD EPYC; on the Intel Xeon 172 against 204 us for
    512 -> 2048), otherwise "packed" on AMD CPUs (EPYC: 512 -> 512 66 us against 104 plain; at two threads packed
    won or tied every shape) and "plain" elsewhere: on the Intel Xeon (AMX) oneDNN's packed single-row product lost
    to MKL's plain one at every narrowing and square shape (512 -> 512 54 against 40 us, 2048 -> 512 240 against
    175; one thread, 24 weights in turn so none is cache resident, scratch), and the edge pi0-FAST's decode step
    took 7.4 ms with those linears plain against 9.2 packed (one thread; 5.0 vs 6.3 at two; scratch A/B in one
    process, bench/pi0_fast.py measures the chunk)."""
    from omni_ros import cpu_features

    if linear.out_features > linear.in_features:
        return "transposed"
    return "packed" if cpu_features.detect().amd else "plain"


def pack_linears(model: nn.Module) -> int:
    """Replace every float32 CPU `nn.Linear` of `model` by a `PackedLinear` (or, under `row_vector_modules`, the
    layout `row_vector_layout` picks), in place; returns how many were replaced (a "plain" one stays as it is).

    The linears under the modules a model lists in `row_vector_modules` (a decoder that feeds one token at a time,
    pi0-FAST's backbone) get `row_vector_layout`'s layout instead: the edge pi0-FAST's 64-token decode took 650 ms
    with those linears plain, 619-666 all packed and 518-524 with the widening ones transposed (one thread; at
    two: 655-672, 482-515, 482-515; scratch A/B, fresh processes, AMD EPYC; bench/pi0_fast.py measures the
    chunk)."""
    from omni_ros.policy.linear_swap import swap_linears

    rows = tuple(f"{prefix}." for prefix in getattr(model, "row_vector_modules", ()))

    def layout(name: str) -> str:
        return row_vector_layout(cast(nn.Linear, model.get_submodule(name))) if name.startswith(rows) else "packed"

    def make(name: str, linear: nn.Linear) -> nn.Module:
        return TransposedLinear(linear) if layout(name) == "transposed" else PackedLinear(linear)

    return swap_linears(model, make, keep=lambda name: layout(name) == "plain")


def weight_count(model: nn.Module) -> int:
    """Parameters of `model`, the weights and biases of its swapped linears included (they are not parameters:
    packed, bf16 and int8 layers hold plain tensors)."""
    swapped, inside = 0, list[str]()
    for name, m in model.named_modules():
        if any(name.startswith(outer + ".") for outer in inside):
            continue  # an emulation layer inside a swapped one is the same weights again
        if getattr(m, "swapped_linear", False):
            swapped += m.in_features * m.out_features + (0 if m.bias is None else m.bias.numel())
            inside.append(name)
    nested = {id(p) for outer in inside for p in model.get_submodule(outer).parameters()} if inside else set()
    return swapped + sum(p.numel() for p in model.parameters() if id(p) not in nested)
