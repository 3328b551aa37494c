"""What share of the int8 target's time budget the GEMMs alone take, from two measured results per model.

    .venv/bin/python bench/int8_budget.py [--out bench/results/int8_budget.json]

The target is one inference in 0.4x LeRobot 0.6.1's time (2 threads). The budget is 0.4 x LeRobot's chunk time
(bench/results/vs_lerobot.json for the edge-size pi0, smolvla_eager.json for SmolVLA); the GEMMs are one
inference's linear layers at their real shapes on every kernel this CPU runs (gemm_kernels_pi0_edge.json,
gemm_kernels_smolvla.json). A share above 1 means no kernel here can meet the target, whatever else is removed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from common import emit

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 0.4
# model -> (its gemm_kernels result, the result holding LeRobot's chunk time, how to read that time)
MODELS = {
    "pi0_edge": ("gemm_kernels_pi0_edge.json", "vs_lerobot.json", lambda d: d["threads"]["2"]["lerobot_ms"]),
    "smolvla": ("gemm_kernels_smolvla.json", "smolvla_eager.json", lambda d: d["results"]["lerobot"]["latency_ms"]),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    models: dict[str, Any] = {}
    for name, (gemm_file, lerobot_file, lerobot_ms) in MODELS.items():
        gemm = json.loads((RESULTS / gemm_file).read_text())
        budget = TARGET * lerobot_ms(json.loads((RESULTS / lerobot_file).read_text()))
        kernels = {k: v for k, v in gemm["inference_gemm_ms"].items() if v}
        fastest_int8 = min((k for k in kernels if "int8" in k), key=kernels.__getitem__)
        fastest = min(kernels, key=kernels.__getitem__)
        models[name] = {
            "sources": [f"bench/results/{gemm_file}", f"bench/results/{lerobot_file}"],
            "budget_ms": round(budget, 1),
            "gemm_ms": kernels,
            "fastest_kernel": fastest,
            "fastest_int8_kernel": fastest_int8,
            "gemm_share_of_budget_fastest": round(kernels[fastest] / budget, 2),
            "gemm_share_of_budget_fastest_int8": round(kernels[fastest_int8] / budget, 2),
        }
    # Computed from results measured earlier: their own files say which CPU they ran on.
    report = {"benchmark": "int8_budget", "target_x_lerobot": TARGET, "cpu": "as in each source", "models": models}
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
