"""bfloat16 attention inside a float32 model: the kernel a bf16 or int8 precision swaps into the attending modules.

After the GEMMs moved to bf16 / int8, attention was the largest single cost of pi0 edge (29% of a bf16
inference at one thread on an AMX Xeon). torch's CPU flash attention in bfloat16 (AMX tile products, float32
softmax statistics) ran the prefix attention 2.1x and the vision tower's 1.5x faster than
in float32, 0.38% relative error per call (scratch measurements, docs/precision.md). q, k and v are rounded
to bfloat16 and the result comes back as float32, so the rest of the model is untouched; under autograd
(guided RTC) the float32 kernel runs, as the int8 linears fall back to float products there.
"""

from __future__ import annotations

import torch
from torch import nn

from omni_ros import cpu_features
from omni_ros.policy.layers import AttentionKernel, sdpa
from omni_ros.policy.linear_swap import set_kernel


def bf16_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`layers.sdpa` with q, k, v in bfloat16; float32 out."""
    if torch.is_grad_enabled() and q.requires_grad:
        return sdpa(q, k, v, mask)
    bf16 = torch.bfloat16
    return sdpa(q.to(bf16), k.to(bf16), v.to(bf16), mask).to(q.dtype)


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512_BF16 / AMX); without it bf16 attention is slower."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bf16_attention_pays() -> bool:
    """Whether bf16 attention beats float32 here: on x86 only with AMX_BF16 tiles. With AVX512_BF16 alone (an
    AMD EPYC with AVX-512 VNNI and BF16, no AMX) torch's bf16 flash attention ran 1.05-1.34x slower than its
    float32 one at the pi0 edge and SmolVLA shapes, casts included (vision 3.64 vs 2.77 ms, prefix 11.8 vs
    10.1, a denoising step's 1.42 vs 1.06, SmolVLA's vision 97 vs 83; scratch, one thread). Elsewhere (Arm
    BF16) it is unmeasured, so float32, the kernel that is never wrong, stays."""
    return native_bf16() and cpu_features.detect().amx_bf16


def use_attention_kernel(model: nn.Module, kernel: AttentionKernel) -> int:
    """Set `kernel` on every module of `model` with an `attention_kernel`; returns how many."""
    return set_kernel(model, "attention_kernel", kernel)
