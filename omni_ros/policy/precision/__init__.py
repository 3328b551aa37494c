"""`policy.precision`: the GEMMs of a built model in fp32, bf16 or int8, chosen from the CPU's instructions.

    choice = choose("auto")                         # PrecisionChoice("int8", "avx512_vnni", kernel="xnnpack")
    applied = apply_precision(model, choice)        # swaps the model's nn.Linear modules in place

A precision is a transform applied to a built model from outside, one module per kernel, as
`omni_ros/policy/cpu_linear.py` packs float32 weights: `Bf16Linear` (bf16_linear.py), `Int8Linear`
(int8_linear.py, with XNNPACK's kernels attached by xnnpack_linears.py where they are the faster ones). No
family's model code knows about it. See choice.py for what `auto` picks and why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from omni_ros.policy.linear_swap import float_cpu_linear, swap_linears
from omni_ros.policy.precision.choice import (
    INT8_KERNELS,
    PRECISIONS,
    PrecisionChoice,
    PrecisionError,
    check_name,
    choose,
    int8_kernel_for,
    program_choice,
)

__all__ = [
    "INT8_KERNELS",
    "PRECISIONS",
    "AppliedPrecision",
    "PrecisionChoice",
    "PrecisionError",
    "apply_precision",
    "check_name",
    "choose",
    "int8_kernel_for",
    "program_choice",
    "swap_linears",
]
logger = logging.getLogger("omni_ros.policy")


@dataclass(frozen=True)
class AppliedPrecision:
    """What `apply_precision` did: the choice, how many linears it replaced, and the kernel cache it used."""

    choice: PrecisionChoice
    linears: int
    cache: Path | None = None
    attention: str = "fp32"  # the attention kernel's dtype (bf16 where the CPU has the instructions)
    # MLPs run as one kernel: the activation a post-op of the bf16 products (fused_mlp.py), or one XNNPACK
    # method for the whole int8 MLP (xnnpack_mlp.py)
    fused_mlps: int = 0


# The layers between the model and the robot's numbers (state in, actions in and out, the flow time's MLP) stay
# float32 whatever the precision: they are a sliver of the FLOPs, and the action projection's rounding lands on
# the actions undamped (bf16 everywhere put SmolVLA's fixture 1.2% off float32, these kept float32 0.6%).
ROBOT_SIDE = frozenset({"state_proj", "action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out"})


def robot_side(name: str) -> bool:
    return name.rpartition(".")[2] in ROBOT_SIDE


def apply_precision(
    model: nn.Module,
    choice: PrecisionChoice,
    *,
    cpu_linear: str = "packed",
    cache_dir: str | Path | None = None,
    label: str = "model",
    num_threads: int = 0,
    source: str | None = None,
) -> AppliedPrecision:
    """Swap the linears of a float32 CPU `model` for `choice`'s kernels, in place (the model is the runner's).

    fp32 packs the weights for oneDNN when `cpu_linear` is "packed" (dense: nn.Linear as it is); where the
    model is not float32 on the CPU (CUDA, `policy.dtype: bfloat16`) nothing is swapped.
    """
    if choice.precision == "fp32":
        if cpu_linear != "packed":
            return AppliedPrecision(choice, 0)
        from omni_ros.policy.cpu_linear import pack_linears, packed_linear_available

        return AppliedPrecision(choice, pack_linears(model) if packed_linear_available() else 0)
    if not any(float_cpu_linear(m) for m in model.modules()):
        return AppliedPrecision(choice, 0)  # a bfloat16 or GPU model: its dtype is its precision
    from omni_ros.policy.cpu_linear import PackedLinear, packed_linear_available

    packed = cpu_linear == "packed" and packed_linear_available()

    def float32(linear: nn.Linear) -> nn.Module:
        return PackedLinear(linear) if packed else linear

    from omni_ros.policy.precision.shared_input import SharedInput
    from omni_ros.policy.precision.stacked_linears import stack_shared_input_linears
    from omni_ros.policy.precision.tied_head import use_tied_heads

    shared = SharedInput()  # one conversion per input tensor for all of this model's bf16 / int8 linears
    if choice.precision == "int8" and choice.kernel != "xnnpack":  # XNNPACK's methods stack theirs themselves
        stack_shared_input_linears(model, lambda module, name: robot_side(name))
    if choice.precision == "bf16":
        from omni_ros.policy.precision.bf16_linear import Bf16Linear

        def make_bf16(name: str, linear: nn.Linear) -> nn.Module:
            return float32(linear) if robot_side(name) else Bf16Linear(linear, shared)

        count = swap_linears(model, make_bf16)
        count += use_tied_heads(model, lambda linear: Bf16Linear(linear, shared))
        return AppliedPrecision(choice, count, attention=_attention(model), fused_mlps=_fused_mlps(model))
    from omni_ros.policy.precision.int8_linear import Int8Linear

    kept: dict[str, tuple[nn.Linear, Int8Linear]] = {}
    # oneDNN's int8 GEMM without an int8 dot product: the same operands through a float32 GEMM.
    emulate = choice.kernel == "onednn" and not choice.native

    def make(name: str, linear: nn.Linear) -> nn.Module:
        if robot_side(name):
            return float32(linear)
        layer = Int8Linear(linear, emulate=emulate, shared=shared)
        if choice.kernel == "xnnpack":
            kept[name] = (linear, layer)  # the float weights are what the XNNPACK program is built from
        return layer

    count = swap_linears(model, make)
    # A tied head is no nn.Linear (nor an XNNPACK method: its products are one token's, the int8 vector path).
    count += use_tied_heads(model, lambda linear: Int8Linear(linear, emulate=emulate, shared=shared))
    folder = None
    fused = 0
    if kept:
        from omni_ros.cpu_features import detect
        from omni_ros.policy.precision.kernel_cache import cache_root
        from omni_ros.policy.precision.xnnpack_linears import attach_xnnpack, groups
        from omni_ros.policy.precision.xnnpack_mlp import mlp_specs, use_xnnpack_mlps

        root = cache_root(str(cache_dir) if cache_dir else None)
        threads = num_threads or torch.get_num_threads()
        # Each MLP is one method; the other linears are grouped by the input they read.
        mlps = mlp_specs(model, set(kept))
        in_mlps = {name for spec in mlps for name in spec.linears}
        rest = [name for name in kept if name not in in_mlps]
        grouping = groups(model, rest, {name: kept[name][0].in_features for name in rest})
        folder = attach_xnnpack(
            kept,
            grouping=grouping,
            mlps=mlps,
            cache_root=root,
            label=label,
            cpu=detect(),
            num_threads=threads,
            source=source,
        )
        fused = use_xnnpack_mlps(model, mlps)
    return AppliedPrecision(choice, count, folder, attention=_attention(model), fused_mlps=fused)


def _fused_mlps(model: nn.Module) -> int:
    """The fused bf16 MLP kernel on every MLP of a bf16 model where oneDNN packs bf16 (fused_mlp.py says why)."""
    from omni_ros.policy.precision.attention import native_bf16
    from omni_ros.policy.precision.fused_mlp import bf16_mlp, use_mlp_kernel

    return use_mlp_kernel(model, bf16_mlp) if native_bf16() else 0


def _attention(model: nn.Module) -> str:
    """bf16 attention for a bf16 / int8 model on a CPU with bf16 tiles (attention.py says why); else fp32."""
    from omni_ros.policy.precision.attention import bf16_attention_pays, bf16_sdpa, use_attention_kernel

    if not bf16_attention_pays():
        return "fp32"
    use_attention_kernel(model, bf16_sdpa)
    from omni_ros.policy.precision.bf16_linear import Bf16Linear

    # A projection only the bf16 kernel reads answers in bfloat16 (the values the kernel would round it to).
    for module in model.modules():
        for name in getattr(type(module), "attention_only_outputs", ()):
            layer = getattr(module, name)
            if isinstance(layer, Bf16Linear):
                layer.bf16_out = True
    return "bf16"
