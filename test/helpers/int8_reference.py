"""The exact int8 product of an `Int8Linear` for a float input: the layer's own int8 operands (its weight, the
input quantized per row as the layer quantizes it), summed in float64 (which holds every int8 sum exactly at
these widths), scaled back by both scales, plus the bias: the reference every int8 kernel must reach up to
float32 rounding."""

from __future__ import annotations

import torch

from omni_ros.policy.precision.int8_linear import Int8Linear, quantize_rows


def exact_int8_product(layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    q, scale = quantize_rows(x.reshape(-1, layer.in_features).float())
    sums = q.double() @ layer.qweight.double().t()
    out = sums * scale.double() * layer.weight_scale.double()
    if layer.bias is not None:
        out = out + layer.bias.double()
    return out.float().reshape(*x.shape[:-1], layer.out_features)
