"""Weight quantization recipes (torchao source transforms): applied before export, and by the int8 XNNPACK kernels
of `policy.precision` (omni_ros/policy/precision/xnnpack_linears.py).

    none          float32 weights and activations
    int8-dynamic  int8 weights per output channel, activations quantized to int8 per token at run time
    8da4w         int4 weights in groups of `group_size`, int8 dynamic activations (the smallest file)

Only `nn.Linear` layers are quantized. XNNPACK delegates the quantize/dequantize
ops these recipes insert, so the linears run as integer GEMMs.
"""

from __future__ import annotations

import logging

from torch import nn

QUANTIZE = ("none", "int8-dynamic", "8da4w")
GROUP_SIZE = 32


def quantize_model(model: nn.Module, recipe: str, group_size: int = GROUP_SIZE) -> nn.Module:
    """Quantize the linears of `model` in place for `recipe`; returns the model."""
    if recipe not in QUANTIZE:
        raise ValueError(f"unknown quantization '{recipe}'; choose one of {', '.join(QUANTIZE)}")
    if recipe == "none":
        return model
    import torch

    # torchao logs optional-kernel load failures at import; they do not concern CPU export.
    logging.getLogger("torchao").setLevel(logging.ERROR)
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    if recipe == "int8-dynamic":
        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))

        def wanted(module: nn.Module, _fqn: str) -> bool:
            return isinstance(module, nn.Linear)
    else:
        # torch.int4 exists at run time (torch >= 2.3) but torch's stubs do not declare it.
        config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group_size))  # type: ignore[attr-defined]

        def wanted(module: nn.Module, _fqn: str) -> bool:
            # Groups must tile the input: a 14-dim action projection cannot be grouped by 32 and stays float.
            return isinstance(module, nn.Linear) and module.in_features % group_size == 0

    # Each top-level part separately: a module reachable by two paths would otherwise be quantized twice.
    for child in model.children():
        quantize_(child, config, filter_fn=wanted)
    return model
