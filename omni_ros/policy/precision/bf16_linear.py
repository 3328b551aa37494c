"""bfloat16 GEMMs inside a float32 model: `Bf16Linear` replaces an `nn.Linear`.

The input is rounded to bfloat16, multiplied by the bfloat16 weight with float32 accumulation (oneDNN from a
weight packed once: AMX tiles or AVX512_BF16 dot products), and the result comes back as float32. Every other
op of the model stays float32, which is what keeps the actions within 1% of float32's (the whole model in
bfloat16 was 7-33% off on the LeRobot fixtures, see omni_ros/policy/precision/choice.py).

On a CPU without native bf16 the same product is computed by float32 GEMMs from the bfloat16-rounded operands
(the rounded weight kept in float32, packed for oneDNN): a product of two bfloat16 numbers is exact in float32,
so the result is the one the bf16 instructions give (up to the order of the float32 sums), at float32 speed.
(torch's own bf16 GEMM without the instructions ran 2x slower than float32 here.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.cpu_linear import PackedLinear, packed_linear_available
from omni_ros.policy.precision.shared_input import SharedInput


def _to_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16)


class Bf16Linear(nn.Module):
    """`nn.Linear` computing in bfloat16 with float32 accumulation; float32 in, float32 out."""

    swapped_linear = True  # its weight is no parameter: weight_count counts it
    # Return the product in bfloat16, not float32: set (precision/__init__.py) on a layer whose output only a bf16
    # attention kernel reads, which would round it to bfloat16 again (the same numbers, two passes fewer). A layer
    # given a bfloat16 input (that attention's output) also answers in bfloat16: the residual add it feeds promotes.
    bf16_out = False

    def __init__(self, linear: nn.Linear, shared: SharedInput | None = None) -> None:
        super().__init__()
        self.shared = shared  # the bfloat16 input, shared with the model's other bf16 linears
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().to(torch.bfloat16)
        self.bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        # The hardware decides, not the (possibly overridden, cpu_features.FLAGS_ENV) flags: oneDNN's packed bf16
        # GEMM needs the instructions.
        self.packed = packed_linear_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        # oneDNN's blocked layout (read back with .to_dense() where autograd needs the plain weight).
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, None) if self.packed else weight
        self.emulated: nn.Module | None = None
        if not self.packed:
            rounded = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
            with torch.no_grad():
                rounded.weight.copy_(weight.float())
                if self.bias is not None:
                    rounded.bias.copy_(self.bias.float())
            self.emulated = PackedLinear(rounded) if packed_linear_available() else rounded

    def dense_weight(self) -> torch.Tensor:
        return self.weight.to_dense() if self.packed else self.weight

    def bf16_input(self, x: torch.Tensor) -> torch.Tensor:
        """`x` rounded to bfloat16 (shared with the other layers reading the same tensor)."""
        return x.to(torch.bfloat16) if self.shared is None else self.shared.get(x, _to_bf16)

    def product(self, xb: torch.Tensor, post_op: str = "none", algorithm: str = "") -> torch.Tensor:
        """oneDNN's packed product of a bfloat16 `xb` with a unary post-op on the float32 accumulator
        ("gelu" with algorithm "tanh" / "none", "swish" = SiLU), rounded to bfloat16 once (packed only)."""
        return torch.ops.mkldnn._linear_pointwise(xb, self.weight, self.bias, post_op, [], algorithm)

    def product_times(self, xb: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(xb @ weight.T + bias) * other, the multiplication a post-op of the product (packed only)."""
        return torch.ops.mkldnn._linear_pointwise.binary(xb, other, self.weight, self.bias, "mul")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            # Guided RTC differentiates through a denoising step: the plain bf16 product has a gradient.
            return F.linear(x.to(torch.bfloat16), self.dense_weight(), self.bias).to(x.dtype)
        xb = self.bf16_input(x)
        if self.packed:
            out = self.product(xb)
        else:
            # Emulated: exact bf16 x bf16 products summed in float32, the result rounded to bf16 as the kernel does.
            assert self.emulated is not None
            out = self.emulated(xb.float()).to(torch.bfloat16)
        return out if self.bf16_out else out.to(x.dtype)

    def extra_repr(self) -> str:
        packed = ", oneDNN packed" if self.packed else ", emulated"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{packed}"
