"""torch's nn.Linear (MKL sgemm on the plain weight) against the oneDNN-packed linear `policy.cpu_linear: packed`
runs, GEMM by GEMM, at the shapes of the policies we serve; prints one JSON document.

    .venv/bin/python bench/cpu_linear.py [--threads 1 2] [--runs 10] [--out bench/results/cpu_linear.json]

Shapes (rows x in -> out): the edge pi0 of bench/vs_lerobot.py (2 cameras, 22 prompt tokens: SigLIP 384,
Gemma 512 / 2048, expert 256 / 1024, 51 suffix tokens) and full-size SmolVLA (SigLIP 768 / 3072 over 1024
patches, SmolVLM 960 / 2560 over a ~177-token prefix, expert 720 / 2048 over 50 actions). For each, at each
thread count, both kernels one after the other in this process: GFLOP/s (2 per multiply-add, best of
`--runs`) and packed over plain, plus the largest difference between their outputs. Absolute numbers depend
on the machine; compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import emit

SHAPES = {
    "pi0_edge": [
        ("vision qkv", 512, 384, 1152),
        ("vision mlp in", 512, 384, 1536),
        ("vision mlp out", 512, 1536, 384),
        ("prefill q / o", 534, 512, 512),
        ("prefill gate / up", 534, 512, 2048),
        ("prefill down", 534, 2048, 512),
        ("expert q", 51, 256, 512),
        ("expert gate / up", 51, 256, 1024),
        ("expert down", 51, 1024, 256),
    ],
    "smolvla_full": [
        ("vision qkv", 1024, 768, 768),
        ("vision mlp in", 1024, 768, 3072),
        ("vision mlp out", 1024, 3072, 768),
        ("prefill q", 177, 960, 960),
        ("prefill gate / up", 177, 960, 2560),
        ("prefill down", 177, 2560, 960),
        ("expert gate / up", 50, 720, 2048),
        ("expert down", 50, 2048, 720),
    ],
}


def best_s(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(rows: int, k: int, n: int, runs: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from omni_ros.policy.cpu_linear import PackedLinear

    torch.manual_seed(0)
    layer = torch.nn.Linear(k, n)
    packed = PackedLinear(layer)
    x = torch.randn(rows, k)
    with torch.inference_mode():
        plain_s = best_s(lambda: F.linear(x, layer.weight, layer.bias), runs)
        packed_s = best_s(lambda: packed(x), runs)
        diff = float((packed(x) - layer(x)).abs().max())
    flop = 2 * rows * k * n
    return {
        "plain_gflops": round(flop / plain_s / 1e9, 1),
        "packed_gflops": round(flop / packed_s / 1e9, 1),
        "packed_speedup": round(plain_s / packed_s, 3),
        "max_abs_diff": diff,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()

    import torch

    from omni_ros.policy.cpu_linear import packed_linear_available

    if not packed_linear_available():
        sys.exit("oneDNN's packed linear is not available in this torch build / on this CPU")
    report: dict[str, Any] = {
        "benchmark": "cpu_linear",
        "machine": {"cpu": platform.processor() or platform.machine(), "load_average": os.getloadavg()},
        "torch": torch.__version__,
        "threads": {},
    }
    for threads in args.threads:
        torch.set_num_threads(threads)
        rows: dict[str, Any] = {}
        for model, shapes in SHAPES.items():
            for name, m, k, n in shapes:
                rows[f"{model}: {name} ({m}x{k} -> {n})"] = measure(m, k, n, args.runs)
        speedups = [r["packed_speedup"] for r in rows.values()]
        report["threads"][str(threads)] = {
            "shapes": rows,
            "packed_speedup_median": round(statistics.median(speedups), 3),
            "packed_speedup_min": min(speedups),
            "packed_speedup_max": max(speedups),
        }
        print(f"[bench] {threads} thread(s): packed/plain median {statistics.median(speedups):.3f}", file=sys.stderr)
    report["machine"]["load_average_after"] = os.getloadavg()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
