"""Which precision a policy's GEMMs run in, chosen from the CPU's instructions: `policy.precision`.

    auto   the fastest path whose accuracy is verified on this CPU (the node's, `serve`'s and `eval`'s default)
    fp32   float32 GEMMs (oneDNN from packed weights on x86)
    bf16   bfloat16 GEMMs with float32 accumulation, the rest of the model in float32
    int8   int8 weights per output channel, activations quantized per token at run time, int32 accumulation

Only the linear layers change (and, on a CPU with native bf16, attention runs in bf16: attention.py); norms, the
Euler state and everything else stay float32. Casting the
whole model to bfloat16 (`policy.dtype: bfloat16`) is another thing: on the committed LeRobot fixtures it moved
the actions 7-33% (relative L2) from float32's, while bf16 GEMMs alone moved them 0.3-0.9% and int8 ones 0.9-2.4%
(test/test_precision_accuracy.py asserts 1% and 4%).

`auto` on a CPU, in order: AMX_BF16 -> bf16 (tile GEMMs; oneDNN's bf16 ran faster there than every int8 kernel
once activations are quantized, bench/gemm_kernels.py), an int8 dot product (VNNI / AVX_VNNI / AMX_INT8, Arm
dotprod / i8mm) -> int8, AVX512_BF16 / Arm BF16 -> bf16, else fp32. An explicit int8 or bf16 on a CPU without
the instructions computes the same numbers, slowly, and says so once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from omni_ros import cpu_features
from omni_ros.cpu_features import CpuFeatures
from omni_ros.errors import OmniRosError

logger = logging.getLogger("omni_ros.policy")

PRECISIONS = ("auto", "fp32", "bf16", "int8")
INT8_KERNELS = ("auto", "onednn", "xnnpack", "program")
# Warnings already given in this process: one per (precision, missing feature), not one per load.
_warned: set[tuple[str, str]] = set()


class PrecisionError(OmniRosError, ValueError):
    """A precision that cannot be served here (unknown name, wrong backend or device): caught at configure."""


@dataclass(frozen=True)
class PrecisionChoice:
    """What a policy's GEMMs run in, the kernel that runs them, and why (said by info, status and metadata)."""

    precision: str  # fp32 | bf16 | int8
    reason: str  # the CPU feature (or setting) that decided it: "avx512_vnni", "policy.precision int8", ...
    kernel: str = ""  # int8: onednn | xnnpack | program; empty where the precision has one kernel
    native: bool = True  # False: the CPU lacks the instructions; the numbers are right, the speed is not

    def describe(self) -> str:
        """One line for humans and metadata: "int8: avx512_vnni" (plus the kernel where there is a choice)."""
        kernel = f" ({self.kernel})" if self.kernel else ""
        return f"{self.precision}{kernel}: {self.reason}"


def check_name(precision: str, field: str = "policy.precision") -> None:
    if precision not in PRECISIONS:
        raise PrecisionError(f"{field} must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def choose(
    requested: str,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    int8_kernel: str = "auto",
    features: CpuFeatures | None = None,
) -> PrecisionChoice:
    """Resolve `policy.precision` for the torch backend on `device` (features: this CPU's unless given)."""
    check_name(requested)
    if int8_kernel not in INT8_KERNELS:
        raise PrecisionError(f"policy.int8_kernel must be one of {', '.join(INT8_KERNELS)}, got {int8_kernel!r}")
    if not device.startswith("cpu"):
        # The GPU path is the model's dtype; the CPU kernels below do not apply there.
        if requested in ("bf16", "int8"):
            raise PrecisionError(
                f"policy.precision {requested} chooses CPU GEMM kernels; on {device} set policy.dtype "
                "(float32 or bfloat16) and policy.precision auto or fp32"
            )
        return PrecisionChoice("bf16" if dtype == "bfloat16" else "fp32", f"policy.dtype {dtype} on {device}")
    if dtype == "bfloat16":
        if requested in ("fp32", "int8"):
            raise PrecisionError(
                f"policy.precision {requested} needs policy.dtype float32 (it sets the GEMM kernels of a float32 "
                "model; policy.dtype bfloat16 casts the whole model)"
            )
        return PrecisionChoice("bf16", "policy.dtype bfloat16 (the whole model in bf16)")
    cpu = features or cpu_features.detect()
    if requested == "auto":
        if cpu.amx_bf16:
            return PrecisionChoice("bf16", "amx_bf16")
        if cpu.int8_dot:
            return PrecisionChoice("int8", cpu.int8_dot[0], kernel=int8_kernel_for(cpu, int8_kernel))
        if cpu.bf16:
            return PrecisionChoice("bf16", cpu.bf16[0])
        return PrecisionChoice("fp32", "no int8 dot product or native bf16 on this CPU" if cpu.known else "default")
    if requested == "fp32":
        return PrecisionChoice("fp32", "policy.precision fp32")
    kind = "int8" if requested == "int8" else "bf16"
    missing = cpu.missing(kind)
    if missing is not None:
        _warn_once(kind, missing)
    found = cpu.int8_dot if kind == "int8" else cpu.bf16
    reason = f"policy.precision {requested}" + (f", {found[0]}" if found else f", emulated: no {missing}")
    kernel = int8_kernel_for(cpu, int8_kernel) if kind == "int8" else ""
    return PrecisionChoice(kind, reason, kernel=kernel, native=missing is None)


def int8_kernel_for(cpu: CpuFeatures, requested: str = "auto") -> str:
    """The int8 GEMM kernel for this CPU: oneDNN where it has AMX_INT8 tiles (or no int8 dot product at all: the
    same integers, at float speed), XNNPACK's where it has VNNI without AMX or is an Arm CPU (there XNNPACK's
    int8 GEMMs ran 3.0x oneDNN's float32 ones and FBGEMM's int8 1.47x, bench/gemm_kernels.py). Where XNNPACK's
    is chosen on x86, the backends' loader of a checkpoint folder runs its stages as one exported XNNPACK program
    instead when the load allows it (omni_ros/backends/stage_program.py: this layer cannot run programs).

    On an AMX Xeon XNNPACK's int8 GEMMs were still the fastest alone, but the per-linear program took 582 s to
    build for the edge pi0 (114 linears) and the whole chunk was no faster than with oneDNN's (715 vs 782 ms, one
    thread, one loaded run): the rest of the chunk, not the GEMMs, sets its time there."""
    if requested != "auto":
        return requested
    if cpu.arch == "aarch64":
        return "xnnpack"
    if "amx_int8" in cpu.int8_dot or not cpu.int8_dot:
        return "onednn"
    return "xnnpack"


def _warn_once(kind: str, missing: str) -> None:
    if (kind, missing) in _warned:
        return
    _warned.add((kind, missing))
    logger.warning(
        "policy.precision %s: this CPU lacks %s, so %s GEMMs run no faster than float32 (same numbers); "
        "policy.precision auto picks what this CPU runs fastest",
        kind,
        missing,
        kind,
    )


# An exported program's quantization (its sidecar's `quantize`) -> the precision its GEMMs run in.
PROGRAM_PRECISIONS = {
    "none": "fp32",
    "int8-dynamic": "int8",
    "8da4w": "int8",  # int4 weights, int8 activations: int8 dot products
    "8a8w": "int8",
    "16a8w": "int8",
    "fp16": "fp16",
}


def program_choice(quantize: str, requested: str, source: str) -> PrecisionChoice:
    """The precision of an exported program (ExecuTorch / ONNX), checked against `policy.precision`."""
    check_name(requested)
    precision = PROGRAM_PRECISIONS.get(quantize, quantize)
    if requested not in ("auto", precision):
        hint = "int8-dynamic" if requested == "int8" else "none"
        raise PrecisionError(
            f"{source}: the program was exported as {quantize} ({precision}), policy.precision asks for {requested}; "
            f"use precision auto or export it again with --precision {requested} (--quantize {hint})"
        )
    return PrecisionChoice(precision, f"exported program ({quantize})")
