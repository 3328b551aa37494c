"""What share of the int8 target's time budget the GEMMs alone take, from two measured results per model.

    .venv/bin/python bench/int8_budget.py [--suffix _vnni] [--out bench/results/int8_budget.json]

The target is one inference in 0.4x LeRobot 0.6.1's time. The budget is 0.4 x LeRobot's chunk time at the thread
count the GEMMs were timed with (bench/results/vs_lerobot.json for the edge-size pi0, smolvla_eager.json (2
threads) for SmolVLA); the pair must come from one CPU (each file records its own), else this says so; the GEMMs are one
inference's linear layers at their real shapes on every kernel this CPU runs (gemm_kernels_pi0_edge.json,
gemm_kernels_smolvla.json). A share above 1 means no kernel here can meet the target, whatever else is removed.

For the edge-size pi0 it also sets each precision's measured chunk (vs_lerobot.json, same thread count) against
its own kernel's GEMM floor, stage by stage (the target: the whole chunk within 1.3x of the floor): the stage
timings of the two files name what dominates above the GEMMs. An int8 row that ran XNNPACK's kernels (its
precision says "(xnnpack)") is set against XNNPACK's int8 GEMMs, the others against oneDNN's.

`--suffix S` reads the files of another machine's runs (`vs_lerobot_S.json`, `gemm_kernels_pi0_edge_S.json`, ...).
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
FLOOR_TARGET = 1.3
# policy.precision -> the gemm_kernels row that is its kernel (int8: the oneDNN kernel the eager rows ran)
PRECISION_KERNELS = {"fp32": "eager_packed", "bf16": "eager_bf16", "int8": "eager_int8_onednn"}
# vs_lerobot stage -> (gemm_kernels stage, how many times an inference runs it)
STAGES = {"embed_prefix_ms": ("vision", 1), "prefill_ms": ("prefill", 1), "denoise_ms": ("denoise_step", 10)}
# model -> (its gemm_kernels result, the result holding LeRobot's chunk time, how to read that time)
MODELS = {
    "pi0_edge": ("gemm_kernels_pi0_edge.json", "vs_lerobot.json", lambda d, t: d["threads"][str(t)]["lerobot_ms"]),
    "smolvla": ("gemm_kernels_smolvla.json", "smolvla_eager.json", lambda d, t: d["results"]["lerobot"]["latency_ms"]),
}


def _cpu(result: dict[str, Any]) -> str:
    """The CPU a result file says it ran on: model and the extensions that choose kernels."""
    machine = result.get("machine", {})
    return f"{machine.get('model', 'unrecorded')} [{' '.join(machine.get('extensions', []))}]"


def floors(gemm: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """Each precision's chunk and stages (vs_lerobot's eager rows) over its kernel's GEMMs at the same shapes."""
    row_of = {"fp32": "omni_eager", "bf16": "omni_bf16", "int8": "omni_int8"}
    run = measured["threads"][str(gemm["threads"])]
    out: dict[str, Any] = {}
    for precision, kernel in PRECISION_KERNELS.items():
        if row_of[precision] not in run:
            continue
        chunk = run[row_of[precision]]
        if "(xnnpack)" in str(chunk.get("precision", "")):
            kernel = "xnnpack_int8"
        if not gemm["inference_gemm_ms"].get(kernel):
            continue
        floor = gemm["inference_gemm_ms"][kernel]
        stages = {}
        for stage, (gemm_stage, times) in STAGES.items():
            stage_floor = gemm["stages"][gemm_stage][f"{kernel}_ms"] * times
            stages[stage] = {"ms": chunk["stages_ms"][stage], "gemm_ms": round(stage_floor, 1)}
            stages[stage]["over_floor"] = round(chunk["stages_ms"][stage] / stage_floor, 2)
        out[precision] = {
            "kernel": kernel,
            "chunk_ms": chunk["latency_ms"],
            "gemm_floor_ms": floor,
            "over_floor": round(chunk["latency_ms"] / floor, 2),
            "within_target": chunk["latency_ms"] <= FLOOR_TARGET * floor,
            "stages": stages,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suffix", default="", help="read the result files named with this suffix (_vnni)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    models: dict[str, Any] = {}
    for name, (gemm_file, lerobot_file, lerobot_ms) in MODELS.items():
        gemm_file, lerobot_file = (f.replace(".json", f"{args.suffix}.json") for f in (gemm_file, lerobot_file))
        if not (RESULTS / gemm_file).is_file() or not (RESULTS / lerobot_file).is_file():
            models[name] = {"skipped": f"bench/results/{gemm_file} or {lerobot_file} is missing"}
            continue
        gemm = json.loads((RESULTS / gemm_file).read_text())
        lerobot = json.loads((RESULTS / lerobot_file).read_text())
        cpus = {_cpu(gemm), _cpu(lerobot)}
        if len(cpus) != 1 or "unrecorded" in next(iter(cpus)):
            # A budget from one CPU and GEMMs from another would be a figure of neither: said, not computed.
            models[name] = {"skipped": f"{gemm_file} and {lerobot_file} are not from one recorded CPU: {sorted(cpus)}"}
            continue
        budget = TARGET * lerobot_ms(lerobot, gemm["threads"])
        kernels = {k: v for k, v in gemm["inference_gemm_ms"].items() if v}
        fastest_int8 = min((k for k in kernels if "int8" in k), key=kernels.__getitem__)
        fastest = min(kernels, key=kernels.__getitem__)
        models[name] = {
            "sources": [f"bench/results/{gemm_file}", f"bench/results/{lerobot_file}"],
            "cpu": cpus.pop(),
            "threads": gemm["threads"],
            "budget_ms": round(budget, 1),
            "gemm_ms": kernels,
            "fastest_kernel": fastest,
            "fastest_int8_kernel": fastest_int8,
            "gemm_share_of_budget_fastest": round(kernels[fastest] / budget, 2),
            "gemm_share_of_budget_fastest_int8": round(kernels[fastest_int8] / budget, 2),
        }
        if name == "pi0_edge":
            models[name]["chunk_over_gemm_floor"] = floors(gemm, lerobot)
    # Computed from results measured earlier: their own files say which CPU they ran on.
    report = {"benchmark": "int8_budget", "target_x_lerobot": TARGET, "cpu": "as in each source", "models": models}
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
