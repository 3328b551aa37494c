"""The kernels a bf16 / int8 precision puts around the GEMMs, each against what it replaced, at real shapes.

    .venv/bin/python bench/precision_kernels.py [--threads 1] [--runs 20] [--out bench/results/precision_kernels.json]

One process, one thread count, every pair timed alternately in rounds (the median of each), so the ratios
within the file compare like with like on a shared machine:

- MLPs (omni_ros/policy/precision/fused_mlp.py): the bf16 MLP fused into oneDNN's products against the bf16
  linears with the activation in float32 between them, for a SigLIP block of a full-size SmolVLA (2 cameras x
  1024 patches, 768 -> 3072, tanh GELU), a pi0 edge Gemma block (560 rows, 512 -> 2048 gated, tanh GELU) and a
  SmolVLA expert block (50 rows, 720 -> 2048 gated SiLU); relative L2 distance of each from float32.
- Attention (attention.py): float32 flash attention (its GFLOPS, and its time over one inference's calls: what
  bench/int8_budget.py adds to the GEMM floor) and bf16 q / k / v against it, at the SmolVLA vision tower's shape
  (2 x 12 heads x 1024 x 64, no mask) and the edge pi0's: vision (2 x 16 heads x 256 x 24), prefix (8 heads, 1 KV
  head, 560 x 64, masked) and a denoising step (51 queries over 611 keys), and the full-size SmolVLA's prefix
  and denoising steps (15 heads, 5 KV heads). Run it at the thread count of the GEMMs it is set beside
  (`--threads 2 --out bench/results/precision_kernels_2threads_vnni.json` for SmolVLA's).
- int8 attention, which the product does not run (why attention stays float32): at the SmolVLA vision tower's
  shape, float32 flash attention against the int8 attention this stack offers: ExecuTorch's quantized SDPA
  (`llama.custom_quantized_sdpa`, q / k / v int8 per token; its float32 `llama.custom_sdpa` beside it) and int8
  scores from torch's `_int_mm` (per-token q and k) with the softmax and p v in float32; the quantization of
  q / k / v is left out of the int8 times (in their favour); relative L2 distance of each from float32; and the
  scores' product alone, int8 `_int_mm` against float32 `bmm`.
- int8 linears (int8_linear.py): oneDNN's qlinear on a reordered weight, torch's `_int_mm` and packed bf16, one
  linear at a prefill shape (560 x 512 -> 2048) and at a denoising step's (51 x 256 -> 1024), activation
  quantization included (what a call costs in the model).

Where the CPU lacks native bf16 (or oneDNN's int8 linear), the rows that need it are left out, with the reason.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from common import emit
from torch import nn


def _alternating_ms(fns: dict[str, Callable[[], object]], runs: int, rounds: int = 5) -> dict[str, float]:
    """Median ms per call of each function, timed in alternating rounds of `runs` calls after a warm-up."""
    for fn in fns.values():
        fn(), fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(runs):
                fn()
            times[name].append((time.perf_counter() - start) / runs * 1e3)
    return {name: round(statistics.median(t), 3) for name, t in times.items()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return round(float((a.float() - b.float()).norm() / b.float().norm()), 5)


MLPS = {
    # name: (leading shape of the input, width, hidden, gated, activation)
    "siglip_smolvla_full": ((2, 1024), 768, 3072, False, "gelu_tanh"),
    "gemma_pi0_edge_prefill": ((1, 560), 512, 2048, True, "gelu_tanh"),
    "llama_smolvla_expert_step": ((1, 50), 720, 2048, True, "silu"),
}


def mlp_rows(runs: int) -> dict[str, Any]:
    from omni_ros.policy.layers import mlp
    from omni_ros.policy.precision.bf16_linear import Bf16Linear
    from omni_ros.policy.precision.fused_mlp import bf16_mlp
    from omni_ros.policy.precision.shared_input import SharedInput

    rows: dict[str, Any] = {}
    for name, (lead, width, hidden, gated, activation) in MLPS.items():
        torch.manual_seed(0)
        first, down = nn.Linear(width, hidden, bias=not gated), nn.Linear(hidden, width, bias=not gated)
        up = nn.Linear(width, hidden, bias=False) if gated else None
        for layer in (first, up, down):
            if layer is not None:
                nn.init.normal_(layer.weight, std=width**-0.5)
        x = torch.randn(*lead, width)
        shared = SharedInput()
        b_first, b_down = Bf16Linear(first, shared), Bf16Linear(down, shared)
        b_up = None if up is None else Bf16Linear(up, shared)
        with torch.inference_mode():
            reference = mlp(first, up, down, activation, x)
            fns = {
                "fp32_ms": partial(mlp, first, up, down, activation, x),
                "bf16_linears_ms": partial(mlp, b_first, b_up, b_down, activation, x),
                "bf16_fused_ms": partial(bf16_mlp, b_first, b_up, b_down, activation, x),
            }
            row: dict[str, Any] = {"input": [*lead, width], "hidden": hidden, "gated": gated, "activation": activation}
            row.update(_alternating_ms(fns, runs))
            row["fused_speedup"] = round(row["bf16_linears_ms"] / row["bf16_fused_ms"], 2)
            row["bf16_linears_rel_l2"] = _rel(mlp(b_first, b_up, b_down, activation, x), reference)
            row["bf16_fused_rel_l2"] = _rel(bf16_mlp(b_first, b_up, b_down, activation, x), reference)
        rows[name] = row
    return rows


# name -> (q shape, k / v shape, the keys a mask hides (None: no mask), calls in one inference): the attention
# calls of the edge pi0 of bench/vs_lerobot.py (SigLIP 384 x 6 with 16 heads over 2 x 256 patches; the Gemma
# prefix of 560 tokens and a denoising step's 51 rows over the prefix and themselves, 8 query heads and 1 KV head;
# 6 layers each, 10 steps) and of the full-size SmolVLA of bench/smolvla.py (SigLIP 768 x 12 over 2 x 1024
# patches; 16 text layers over a 177-token prefix and 16 expert layers, 15 query heads and 5 KV heads, half of
# them attending to the prefix and the 50 actions, half to the prefix only). The masks hide prompt padding.
ATTENTION_SHAPES: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, int] | None, int]] = {
    "pi0_edge_vision": ((2, 16, 256, 24), (2, 16, 256, 24), None, 6),
    "pi0_edge_prefix": ((1, 8, 560, 64), (1, 1, 560, 64), (520, 560), 6),
    "pi0_edge_denoise_step": ((1, 8, 51, 64), (1, 1, 611, 64), (520, 560), 60),
    "siglip_smolvla_full": ((2, 12, 1024, 64), (2, 12, 1024, 64), None, 12),
    "smolvla_full_prefix": ((1, 15, 177, 64), (1, 5, 177, 64), (150, 177), 16),
    "smolvla_full_denoise_self": ((1, 15, 50, 64), (1, 5, 227, 64), (150, 177), 80),
    "smolvla_full_denoise_cross": ((1, 15, 50, 64), (1, 5, 177, 64), (150, 177), 80),
}


def attention_rows(runs: int, bf16: bool) -> dict[str, Any]:
    """float32 flash attention at each shape (and bf16's against it where the CPU has native bf16)."""
    from omni_ros.policy.layers import sdpa
    from omni_ros.policy.precision.attention import bf16_sdpa

    torch.manual_seed(0)
    rows: dict[str, Any] = {}
    for name, (q_shape, kv_shape, hidden, calls) in ATTENTION_SHAPES.items():
        q, k, v = torch.randn(q_shape), torch.randn(kv_shape), torch.randn(kv_shape)
        mask = None
        if hidden is not None:
            mask = torch.ones(1, 1, q_shape[2], kv_shape[2], dtype=torch.bool)
            mask[..., hidden[0] : hidden[1]] = False
        # q k^T and p v: 2 multiply-adds per query, key and head dimension, over every query head
        flops = 4 * q_shape[0] * q_shape[1] * q_shape[2] * kv_shape[2] * q_shape[3]
        with torch.inference_mode():
            row: dict[str, Any] = {"q": list(q_shape), "kv": list(kv_shape), "masked": hidden is not None}
            row["calls_per_inference"] = calls
            fns: dict[str, Callable[[], object]] = {"fp32_ms": partial(sdpa, q, k, v, mask)}
            if bf16:
                fns["bf16_ms"] = partial(bf16_sdpa, q, k, v, mask)
            row.update(_alternating_ms(fns, runs))
            row["fp32_gflops"] = round(flops / row["fp32_ms"] / 1e6, 1)
            row["fp32_inference_ms"] = round(row["fp32_ms"] * calls, 1)
            if bf16:
                row["bf16_speedup"] = round(row["fp32_ms"] / row["bf16_ms"], 2)
                row["bf16_rel_l2"] = _rel(bf16_sdpa(q, k, v, mask), sdpa(q, k, v, mask))
        rows[name] = row
    return rows


def _int_mm_heads(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int8 a @ b per head (torch's `_int_mm` multiplies matrices), int32, written in place (no stacking copy)."""
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2], dtype=torch.int32)
    for h in range(a.shape[0]):
        torch._int_mm(a[h], b[h], out=out[h])
    return out


def _int8_scores_operands(
    q: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q and k quantized per token (one scale per row of each head), as `_int_mm_heads` takes them: q [B*H, Q, D],
    k^T [B*H, D, K] contiguous; and their scales [B, H, rows, 1]."""
    from omni_ros.policy.precision.int8_linear import quantize_rows

    (qi, qs), (ki, ks) = quantize_rows(q), quantize_rows(k)
    return qi.flatten(0, 1), ki.flatten(0, 1).transpose(1, 2).contiguous(), qs, ks


def _int_mm_scores_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention with int8 q k^T (torch's `_int_mm`, one head at a time: it multiplies matrices) from per-token
    int8 q and k; the scale, the softmax and p v in float32, as int8 attention schemes keep them."""
    batch, heads, queries, dim = q.shape
    qi, kt, qs, ks = _int8_scores_operands(q * dim**-0.5, k)
    scores = _int_mm_heads(qi, kt).view(batch, heads, queries, -1)
    return torch.softmax(scores.float() * qs * ks.transpose(-1, -2), dim=-1) @ v


def int8_attention_rows(runs: int) -> dict[str, Any]:
    """The int8 attention kernels this stack has against float32 flash attention, at the shape that costs most
    (the SmolVLA vision tower's, unmasked)."""
    from omni_ros.policy.layers import sdpa
    from omni_ros.policy.precision.int8_linear import quantize_rows

    q_shape, _, _, calls = ATTENTION_SHAPES["siglip_smolvla_full"]
    torch.manual_seed(0)
    q, k, v = torch.randn(q_shape), torch.randn(q_shape), torch.randn(q_shape)
    row: dict[str, Any] = {"shape": "siglip_smolvla_full", "q": list(q_shape), "calls_per_inference": calls}
    with torch.inference_mode():
        reference = sdpa(q, k, v, None)
        fns: dict[str, Callable[[], object]] = {
            "fp32_flash_ms": partial(sdpa, q, k, v, None),
            "int8_int_mm_scores_ms": partial(_int_mm_scores_attention, q, k, v),
        }
        outputs = {"int8_int_mm_scores_ms": _int_mm_scores_attention(q, k, v)}
        # The scores' product alone, each precision's kernel (one head at a time for `_int_mm`): where the time of
        # the int8 attention above goes, if not into its product.
        q8, k8t, _, _ = _int8_scores_operands(q, k)
        fns["fp32_scores_bmm_ms"] = partial(torch.bmm, q.flatten(0, 1), k.flatten(0, 1).transpose(1, 2).contiguous())
        fns["int8_scores_int_mm_ms"] = partial(_int_mm_heads, q8, k8t)
        try:
            from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (registers llama::*)
            from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
        except (ImportError, OSError) as exc:
            row["executorch_sdpa"] = f"skipped: {exc}"
        else:
            # ExecuTorch's ops run on its own thread pool, sized to the cores: held to torch's thread count.
            _unsafe_reset_threadpool(torch.get_num_threads())
            # ExecuTorch's ops take [batch, sequence, heads, dim] and per-token scales / zero points of that shape.
            qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            (qi, qsc), (ki, ksc), (vi, vsc) = (quantize_rows(x) for x in (qs, ks, vs))
            zero = torch.zeros(qsc.shape, dtype=torch.int8)
            custom = torch.ops.llama.custom_sdpa
            quantized = torch.ops.llama.custom_quantized_sdpa
            fns["executorch_fp32_sdpa_ms"] = partial(custom, qs, ks, vs, 0, None, 0.0, False, None)
            fns["executorch_int8_sdpa_ms"] = partial(
                quantized, qi, ki, vi, 0, None, 0.0, False, None, zero, qsc, zero, ksc, zero, vsc, False
            )
            outputs["executorch_fp32_sdpa_ms"] = fns["executorch_fp32_sdpa_ms"]().transpose(1, 2)
            outputs["executorch_int8_sdpa_ms"] = fns["executorch_int8_sdpa_ms"]().transpose(1, 2)
        # The quantized op is a plain loop on x86 (seconds a call): fewer calls a round than the others.
        row.update(_alternating_ms(fns, max(1, runs // 10), rounds=3))
        for name, out in outputs.items():
            row[name.replace("_ms", "_rel_l2")] = _rel(out, reference)
            row[name.replace("_ms", "_over_fp32_flash")] = round(row[name] / row["fp32_flash_ms"], 2)
        row["int8_scores_over_fp32_scores"] = round(row["int8_scores_int_mm_ms"] / row["fp32_scores_bmm_ms"], 2)
        row["fp32_flash_inference_ms"] = round(row["fp32_flash_ms"] * calls, 1)
    return row


def _qlinear_once(linear: nn.Linear, x: torch.Tensor) -> float:
    """oneDNN's qlinear where the product skips it (AMD): one call after one warm-up, as it is far too slow there
    for rounds."""
    layer = forced_qlinear(linear)
    layer(x)
    start = time.perf_counter()
    layer(x)
    return round((time.perf_counter() - start) * 1e3, 1)


def forced_qlinear(linear: nn.Linear) -> nn.Module:
    """An Int8Linear forced onto oneDNN's qlinear (what `int8_kernel: onednn` ran before `qlinear_pays`)."""
    from omni_ros.policy.precision.int8_linear import Int8Linear

    layer = Int8Linear(linear)
    qweight = layer.qweight
    layer.packed = torch.ops.onednn.qlinear_prepack(qweight, None)
    layer.zero_points = torch.zeros(layer.out_features, dtype=torch.long)
    layer.kernel = "onednn"
    return layer


def int8_rows(runs: int) -> dict[str, Any]:
    from omni_ros.cpu_features import detect
    from omni_ros.policy.precision.bf16_linear import Bf16Linear
    from omni_ros.policy.precision.int8_linear import Int8Linear, qlinear_available, qlinear_pays

    # Without an int8 dot product the product runs its emulation (what `apply_precision` picks there).
    native = bool(detect().int8_dot)
    rows: dict[str, Any] = {}
    for name, (m, k, n) in {"pi0_edge_prefill": (560, 512, 2048), "pi0_edge_denoise_step": (51, 256, 1024)}.items():
        torch.manual_seed(0)
        linear = nn.Linear(k, n)
        x = torch.randn(1, m, k)
        layers = {"bf16_ms": Bf16Linear(linear), "int8_onednn_ms": Int8Linear(linear, emulate=not native)}
        if native and qlinear_available():
            int_mm = Int8Linear(linear)
            int_mm.packed, int_mm.kernel = None, "int_mm"  # torch's _int_mm on the plain weight
            layers["int8_int_mm_ms"] = int_mm
        with torch.inference_mode():
            row: dict[str, Any] = {"m_k_n": [m, k, n], "int8_kernel": layers["int8_onednn_ms"].kernel}
            row.update(_alternating_ms({key: partial(layer, x) for key, layer in layers.items()}, runs))
            if native and qlinear_available() and not qlinear_pays():
                row["onednn_qlinear_one_call_ms"] = _qlinear_once(linear, x)
        rows[name] = row
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20, help="calls per round (5 alternating rounds)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from omni_ros.policy.precision.attention import native_bf16

    report: dict[str, Any] = {"benchmark": "precision_kernels", "threads": args.threads, "runs": args.runs}
    bf16 = native_bf16()
    report["mlp"] = mlp_rows(args.runs) if bf16 else "skipped: this CPU has no native bf16 (AVX512_BF16 / AMX)"
    report["attention"] = attention_rows(args.runs, bf16)
    report["int8_attention"] = int8_attention_rows(args.runs)
    report["int8_linear"] = int8_rows(args.runs)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
