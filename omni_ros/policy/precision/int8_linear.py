"""int8 GEMMs inside a float32 model: `Int8Linear` replaces an `nn.Linear`.

Weights are quantized once, symmetric per output channel (scale = max |w| / 127); activations at run time,
symmetric per token (per row of the flattened input), so one outlier token does not flatten every other
token's resolution (per tensor, the committed fixtures' actions were up to 3.3% off float32's, per token
2.4%). The integer product accumulates in int32 and is scaled back to float32 with both scales.

Two kernels run the product, chosen per CPU (omni_ros/policy/precision/choice.py `int8_kernel_for`):

- `onednn`: oneDNN's int8 linear (`onednn::qlinear_pointwise`: AMX_INT8 tiles or VNNI dot products) on a
  weight reordered once at load into oneDNN's blocked layout, with a float32 output. The kernel takes one
  activation scale per call, so it runs with scale 1 and the per-token scales multiply its float32 output
  (one pass over the output: on an AMX Xeon this was still 1.6x faster than torch's `_int_mm`, which re-reads
  a plain weight each call, and 1.3-1.8x the packed bf16 GEMM at pi0's shapes; scratch measurements written up
  in docs/precision.md). Where the build has no such kernel, and on AMD CPUs (`qlinear_pays`), `_int_mm`.
  On a CPU without an int8 dot product neither has a fast path (45x slower than float32 at pi0 edge's vision
  shapes on an AVX2 EPYC, bench/gemm_kernels.py) nor exact sums (`integer_products_exact`), so there
  (`emulate=True`, and whatever the caller asked where the hardware lacks the instructions) the same quantized
  operands go through a float32 GEMM: the dequantized activations times the dequantized weight, packed for
  oneDNN, which is the int8 product scaled back up to float32 rounding of the sums;
- `xnnpack`: ExecuTorch's XNNPACK delegate, one method per linear in a program built once per checkpoint and
  CPU and cached (omni_ros/policy/precision/xnnpack_linears.py); where a call has more rows than the program
  was planned for, the rows go through it in slices.

A product of at most `VECTOR_ROWS` rows (a decoding step: pi0-FAST feeds one token at a time) is a matrix-vector
product whose time is reading the weight, and there quantizing the activations and entering the int8 GEMM cost
more than they save: oneDNN's int8 decode step ran 2x slower than float32's. Those rows take the int8 weight
with bfloat16 activations instead (`torch._weight_int8pack_mm`: int8 read, float32 sums), whatever the kernel,
so every CPU computes the same numbers: the edge pi0-FAST's decode step in 0.55x the packed float32 time, with
the same tokens (scratch A/B in one process, AMX Xeon, one thread; bench/pi0_fast.py measures the chunk). The
kernel needs the input width to be a multiple of 16 (measured: other widths give wrong sums or crash), so other
layers keep the GEMM path.

Under autograd (guided real-time chunking differentiates through a denoising step) the layer is the float
product of the input with the dequantized weight: integer GEMMs have no gradient, and the guidance only needs
the direction.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.precision.shared_input import SharedInput

# A row (or weight channel) of zeros quantizes with this scale instead of 0/0.
_TINY = 1e-12
# Products of at most this many rows read the int8 weight with bfloat16 activations (the module docstring says why).
VECTOR_ROWS = 4
# torch._weight_int8pack_mm's input width must be a multiple of this (others: wrong sums, or a crash).
_VECTOR_K_MULTIPLE = 16


def qlinear_available() -> bool:
    """Whether this torch build has oneDNN's int8 linear (x86 builds with mkldnn do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_prepack")


def qlinear_pays() -> bool:
    """Whether oneDNN's int8 linear is the product to use here: not on AMD CPUs. On an AMD EPYC with AVX-512
    VNNI (no AMX) it took 12.8 s for one 560 x 512 -> 2048 product (51 x 256 -> 1024: 296 ms) against `_int_mm`'s
    12.6 ms (0.17 ms) and packed bf16's 8.5 ms: a path some 1,000x slower, not a kernel (scratch, one thread,
    torch 2.13). On the AMX Xeon it was the fastest int8 product."""
    from omni_ros import cpu_features

    return qlinear_available() and not cpu_features.detect().amd


def integer_products_exact() -> bool:
    """Whether this CPU's integer kernels (oneDNN's qlinear, `_int_mm`) compute exact int8 sums: only with an int8
    dot product. Without one (AVX2: `vpmaddubsw`) oneDNN adds pairs of u8 x s8 products in saturating 16-bit lanes;
    with oneDNN held to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`) 64- and 24-wide layers came out 7-19% off float32 against
    under 1% with the instructions. The hardware decides, not the (possibly overridden, cpu_features.FLAGS_ENV)
    flags; where the flags cannot be read nothing is assumed missing."""
    from omni_ros import cpu_features

    cpu = cpu_features.hardware()
    return bool(cpu.int8_dot) or not cpu.known


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float -> int8 weight (out, in) and float32 scales (out,), symmetric per output channel."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(_TINY)
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K) float32 -> int8 (M, K) and scales (M, 1), symmetric per row."""
    # abs().amax(): 5x faster than linalg.vector_norm(ord=inf) at pi0 edge's shapes, which had cost as much
    # as the int8 GEMMs themselves (torch 2.13, one thread).
    scale = x.abs().amax(dim=-1, keepdim=True).div_(127.0).clamp_min_(_TINY)
    # |x / scale| <= 127 by construction: no clamp needed before the cast.
    return torch.div(x, scale).round_().to(torch.int8), scale


class Int8Linear(nn.Module):
    """`nn.Linear` as an int8 GEMM (weights per channel, activations per token); float32 in and out."""

    swapped_linear = True  # its weight is no parameter: weight_count counts it

    def __init__(self, linear: nn.Linear, emulate: bool = False, shared: SharedInput | None = None) -> None:
        super().__init__()
        self.shared = shared  # the quantized input, shared with the model's other int8 linears
        self.in_features, self.out_features = linear.in_features, linear.out_features
        qweight, self.weight_scale = quantize_weight(linear.weight)
        # (out, in) contiguous: the layout of the few-rows kernel; `_int_mm` reads its transpose.
        self.qweight = qweight.contiguous()
        self.vector = linear.in_features % _VECTOR_K_MULTIPLE == 0 and hasattr(torch, "_weight_int8pack_mm")
        self.vector_scale = torch.ones(self.out_features, dtype=torch.bfloat16)  # the kernel's own scales: 1
        self.bias = None if linear.bias is None else linear.bias.detach().float()
        # Set by the XNNPACK builder: input tensor -> this layer's output rows (M, out), from an ExecuTorch method.
        self.xnnpack: Any = None
        # Set by the XNNPACK builder on an MLP's first linear: the whole MLP's method (xnnpack_mlp.py).
        self.xnnpack_mlp: Any = None
        self.kernel = "onednn"
        self.packed: Any = None  # oneDNN's reordered int8 weight (native int8 CPUs)
        self.emulated: nn.Module | None = None
        # Asked for the integer kernels on a CPU where they would saturate: the same operands, emulated.
        emulate = emulate or not integer_products_exact()
        if not emulate and not qlinear_pays():
            self.kernel = "int_mm"
        if emulate:
            from omni_ros.policy.cpu_linear import PackedLinear, packed_linear_available

            dequantized = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
            with torch.no_grad():
                dequantized.weight.copy_(self.dequantized_weight())
                if self.bias is not None:
                    dequantized.bias.copy_(self.bias)
            self.emulated = PackedLinear(dequantized) if packed_linear_available() else dequantized
            self.kernel = "emulated"
        elif qlinear_pays():
            self.packed = torch.ops.onednn.qlinear_prepack(qweight, None)
            # The kernel wants per-channel zero points even for a symmetric weight.
            self.zero_points = torch.zeros(self.out_features, dtype=torch.long)

    @property
    def weight(self) -> torch.Tensor:
        """The int8 weight (out, in); its `.device` is the layer's."""
        return self.qweight

    def dequantized_weight(self) -> torch.Tensor:
        return self.qweight.float() * self.weight_scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            return F.linear(x, self.dequantized_weight().to(x.dtype), None if self.bias is None else self.bias)
        lead = x.shape[:-1]
        if self.vector and x.numel() <= VECTOR_ROWS * self.in_features:
            out = self._vector(x.reshape(-1, self.in_features))
        elif self.xnnpack is not None:
            out = self.xnnpack(x)
        else:
            q, scale = self._quantized(x)
            out = self.emulated(q.float().mul_(scale)) if self.emulated is not None else self._onednn(q, scale)
        return out.reshape(*lead, self.out_features).to(x.dtype)

    def _vector(self, rows: torch.Tensor) -> torch.Tensor:
        # Channel scales applied in float32 after the product (bf16 scales would add a 0.4% error per channel).
        out = torch._weight_int8pack_mm(rows.to(torch.bfloat16), self.qweight, self.vector_scale).float()
        out.mul_(self.weight_scale)
        return out if self.bias is None else out.add_(self.bias)

    def _quantized(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def convert(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return quantize_rows(t.reshape(-1, self.in_features).float())

        return convert(x) if self.shared is None else self.shared.get(x, convert)

    def _onednn(self, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            # int32 sums x channel scale -> float32 inside the kernel; the row scale (and bias) outside it.
            out = torch.ops.onednn.qlinear_pointwise(
                q, 1.0, 0, self.packed, self.weight_scale, self.zero_points, None, 1.0, 0, torch.float32,
                "none", [None], "",
            )  # fmt: skip
            # In place: a fresh output-sized tensor costs more than the pass (page faults on this size).
            out.mul_(scale)
            return out if self.bias is None else out.add_(self.bias)
        acc = torch._int_mm(q, self.qweight.t())
        # Two passes over the output: int32 x row scale -> float32, then x channel scale (+ bias).
        out = torch.mul(acc, scale)
        if self.bias is None:
            return out.mul_(self.weight_scale)
        return torch.addcmul(self.bias, out, self.weight_scale)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"kernel={self.kernel}" + (f", <= {VECTOR_ROWS} rows: int8 weight x bf16" if self.vector else "")
        )
