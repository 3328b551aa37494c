"""What share of the int8 target's time budget the GEMMs alone take, from two measured results per model.

    .venv/bin/python bench/int8_budget.py [--suffix _vnni] [--vs-lerobot vs_lerobot.json]
        [--smolvla smolvla_eager.json] [--out bench/results/int8_budget.json]

The target is one inference in 0.4x LeRobot 0.6.1's time. The budget is 0.4 x LeRobot's chunk time at the thread
count the GEMMs were timed with (bench/results/vs_lerobot.json for the edge-size pi0, smolvla_eager.json (2
threads) for SmolVLA); the pair must come from one CPU (each file records its own), else this says so; the GEMMs are one
inference's linear layers at their real shapes on every kernel this CPU runs (gemm_kernels_pi0_edge.json,
gemm_kernels_smolvla.json). A share above 1 means no kernel here can meet the target, whatever else is removed.

For each model it also sets each precision's measured chunk (vs_lerobot.json at the GEMMs' thread count for the
edge-size pi0, smolvla_eager.json for SmolVLA) against its own kernel's GEMM floor, stage by stage (the target:
the whole chunk within 1.3x of the floor): the stage timings of the two files name what dominates above the
GEMMs. An int8 row that ran XNNPACK's kernels (its precision says "(xnnpack)" or "(program)", the stage program
`auto` picks where XNNPACK's int8 GEMMs are fastest) is set against XNNPACK's int8 GEMMs, the others against
oneDNN's. `--vs-lerobot` and `--smolvla` choose other result files of the same benches (the `auto` runs).

With a bench/precision_kernels.py result of the same CPU and thread count (precision_kernels*.json), each stage
also gets float32 flash attention's time at its shapes over one inference's calls: the GEMMs and the attention
together are the floor that the kernels alone cannot go below (norms, rotary and glue come on top). Where that file
also timed the int8 attention kernels this stack has (its `int8_attention`), their time over float32 flash
attention's is copied beside the floor: why the floor's attention stays float32. With a bench/gemm_kernels.py
`--preset smolvla_attention` result of the same CPU and thread count (gemm_kernels_smolvla_attention*.json), each
SmolVLA row also gets the floor its kernel's GEMMs would leave if the vision attention's products ran at that
kernel's rate too (what an ideal fused attention kernel of that precision could reach).

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
# Rows with policy.compile on (vs_lerobot.py --compiled) run the same GEMM kernels as their precision.
PRECISION_KERNELS |= {f"{p}_compiled": k for p, k in PRECISION_KERNELS.items()}
# vs_lerobot stage -> (gemm_kernels stage, how many times an inference runs it)
STAGES = {"embed_prefix_ms": ("vision", 1), "prefill_ms": ("prefill", 1), "denoise_ms": ("denoise_step", 10)}
# model -> stage -> the precision_kernels attention rows that stage runs (each row holds its calls per inference)
ATTENTION = {
    "pi0_edge": {
        "embed_prefix_ms": ["pi0_edge_vision"],
        "prefill_ms": ["pi0_edge_prefix"],
        "denoise_ms": ["pi0_edge_denoise_step"],
    },
    "smolvla": {
        "embed_prefix_ms": ["siglip_smolvla_full"],
        "prefill_ms": ["smolvla_full_prefix"],
        "denoise_ms": ["smolvla_full_denoise_self", "smolvla_full_denoise_cross"],
    },
}
# model -> (its gemm_kernels result, the result holding LeRobot's chunk time, how to read that time)
MODELS = {
    "pi0_edge": ("gemm_kernels_pi0_edge.json", "vs_lerobot.json", lambda d, t: d["threads"][str(t)]["lerobot_ms"]),
    "smolvla": ("gemm_kernels_smolvla.json", "smolvla_eager.json", lambda d, t: d["results"]["lerobot"]["latency_ms"]),
}


def _cpu(result: dict[str, Any]) -> str:
    """The CPU a result file says it ran on: model and the extensions that choose kernels."""
    machine = result.get("machine") or result.get("cpu") or {}  # benches name it either way
    return f"{machine.get('model', 'unrecorded')} [{' '.join(machine.get('extensions', []))}]"


def measured_chunks(name: str, result: dict[str, Any], threads: int) -> dict[str, dict[str, Any]]:
    """Each precision's eager chunk in a model's result file: its time, stages and the precision it reports."""
    if name == "pi0_edge":  # vs_lerobot: one entry per thread count, stages as the pipeline times them
        run = result["threads"][str(threads)]
        rows = {"fp32": "omni_eager", "bf16": "omni_bf16", "int8": "omni_int8"}
        rows |= {f"{p}_compiled": f"omni_{p}_compiled" for p in ("fp32", "bf16", "int8")}
        return {
            p: {"ms": run[r]["latency_ms"], "stages": run[r]["stages_ms"], "precision": run[r].get("precision", "")}
            for p, r in rows.items()
            if r in run
        }
    # smolvla_eager: one thread count; stages per camera / per step, as the bench wraps the model's methods
    cameras, steps = len(result["model"]["cameras"]), result["model"]["steps"]
    rows = {"fp32": "omni_ros_eager", "bf16": "omni_ros_eager_bf16", "int8": "omni_ros_eager_int8"}
    out = {}
    for p, r in rows.items():
        row = result["results"].get(r)
        if not row or "latency" not in row:
            continue
        stage = {k: v["median_ms"] for k, v in row["stages"].items()}
        stages = {
            "embed_prefix_ms": round(stage["vision_per_camera"] * cameras, 1),
            "prefill_ms": stage["prefill"],
            "denoise_ms": round(stage["denoise_step"] * steps, 1),
        }
        out[p] = {"ms": row["latency"]["median_ms"], "stages": stages, "precision": row.get("precision", "")}
    return out


def floors(
    gemm: dict[str, Any], chunks: dict[str, dict[str, Any]], attention: dict[str, list[dict[str, Any]]] | None
) -> dict[str, Any]:
    """Each precision's chunk and stages over its kernel's GEMMs at the same shapes, and over the GEMMs plus
    float32 attention's time where `attention` (stage -> precision_kernels rows) is given."""
    out: dict[str, Any] = {}
    for precision, kernel in PRECISION_KERNELS.items():
        if precision not in chunks:
            continue
        chunk = chunks[precision]
        if "(xnnpack)" in str(chunk["precision"]) or "(program)" in str(chunk["precision"]):
            kernel = "xnnpack_int8"  # the stage program runs XNNPACK's int8 GEMMs too, in one delegate call
        if not gemm["inference_gemm_ms"].get(kernel):
            continue
        floor = gemm["inference_gemm_ms"][kernel]
        stages = {}
        for stage, (gemm_stage, times) in STAGES.items():
            stage_floor = gemm["stages"][gemm_stage][f"{kernel}_ms"] * times
            stages[stage] = {"ms": chunk["stages"][stage], "gemm_ms": round(stage_floor, 1)}
            stages[stage]["over_floor"] = round(chunk["stages"][stage] / stage_floor, 2)
            if attention is not None:
                stages[stage]["attention_ms"] = round(sum(r["fp32_inference_ms"] for r in attention[stage]), 1)
        out[precision] = {
            "kernel": kernel,
            "chunk_ms": chunk["ms"],
            "gemm_floor_ms": floor,
            "over_floor": round(chunk["ms"] / floor, 2),
            "within_target": chunk["ms"] <= FLOOR_TARGET * floor,
            "stages": stages,
        }
        if attention is not None:
            both = floor + sum(stage["attention_ms"] for stage in stages.values())
            out[precision]["gemm_and_attention_floor_ms"] = round(both, 1)
            out[precision]["gemm_and_attention_over_gemm_floor"] = round(both / floor, 2)
            out[precision]["over_gemm_and_attention_floor"] = round(chunk["ms"] / both, 2)
    return out


def attention_rows(
    name: str, suffix: str, cpu: str, threads: int
) -> tuple[dict[str, list[dict[str, Any]]] | None, str, dict[str, Any] | None]:
    """A model's attention rows per stage from a precision_kernels result of this CPU and thread count (any file
    `precision_kernels*{suffix}.json`), else why there is none; and that file's int8 attention timings, if any."""
    wanted = ATTENTION[name]
    seen = []
    for path in sorted(RESULTS.glob(f"precision_kernels*{suffix}.json")):
        kernels = json.loads(path.read_text())
        rows = kernels.get("attention")
        seen.append(f"{path.name}: {_cpu(kernels)}, {kernels.get('threads')} thread(s)")
        if _cpu(kernels) != cpu or kernels.get("threads") != threads or not isinstance(rows, dict):
            continue
        if all("fp32_inference_ms" in rows.get(row, {}) for names in wanted.values() for row in names):
            by_stage = {stage: [rows[r] for r in names] for stage, names in wanted.items()}
            return by_stage, f"bench/results/{path.name}", kernels.get("int8_attention")
        seen[-1] += " (predates these attention rows)"
    return None, f"no precision_kernels result at {threads} thread(s) on {cpu} with these shapes: {seen}", None


def attention_products(name: str, suffix: str, cpu: str, threads: int) -> dict[str, Any] | None:
    """The products inside a model's attention timed at every GEMM kernel (bench/gemm_kernels.py --preset
    smolvla_attention), from a result of this CPU and thread count; None without one."""
    path = RESULTS / f"gemm_kernels_{name}_attention{suffix}.json"
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    if _cpu(result) != cpu or result.get("threads") != threads:
        return None
    return {"source": f"bench/results/{path.name}", "inference_ms": result["inference_gemm_ms"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suffix", default="", help="read the result files named with this suffix (_vnni)")
    parser.add_argument(
        "--vs-lerobot",
        default="vs_lerobot.json",
        help="the edge pi0's chunks: a bench/vs_lerobot.py result in bench/results (vs_lerobot_compiled.json: with "
        "its --compiled rows)",
    )
    parser.add_argument(
        "--smolvla",
        default="smolvla_eager.json",
        help="SmolVLA's chunks: a bench/smolvla.py result in bench/results at the GEMMs' thread count "
        "(smolvla_auto_2thread.json: int8 as `auto` serves it, the stage program)",
    )
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    models: dict[str, Any] = {}
    for name, (gemm_file, lerobot_file, lerobot_ms) in MODELS.items():
        lerobot_file = args.vs_lerobot if name == "pi0_edge" else args.smolvla
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
        attention, source, int8_attention = attention_rows(name, args.suffix, models[name]["cpu"], gemm["threads"])
        models[name]["attention_source"] = source
        # Why the floor keeps float32 attention: the int8 attention kernels at hand, timed in that same file.
        if int8_attention and any(int8_attention["shape"] in rows for rows in ATTENTION[name].values()):
            kept = ("_over_fp32_flash", "_over_fp32_scores", "_rel_l2")
            models[name]["int8_attention_over_fp32_flash"] = {
                "shape": int8_attention["shape"],
                **{k: v for k, v in int8_attention.items() if k.endswith(kept)},
            }
        models[name]["chunk_over_gemm_floor"] = floors(gemm, measured_chunks(name, lerobot, gemm["threads"]), attention)
        products = attention_products(name, args.suffix, models[name]["cpu"], gemm["threads"])
        if products is not None:
            models[name]["attention_products"] = products
            # The floor if attention's products ran at each kernel's own GEMM rate (no softmax, no glue): what an
            # ideal fused attention kernel of that precision would leave.
            for row in models[name]["chunk_over_gemm_floor"].values():
                extra = products["inference_ms"].get(row["kernel"])
                if extra:
                    row["gemm_and_attention_products_floor_ms"] = round(row["gemm_floor_ms"] + extra, 1)
                    row["gemm_and_attention_products_over_gemm_floor"] = round(1 + extra / row["gemm_floor_ms"], 2)
    # Computed from results measured earlier: their own files say which CPU they ran on.
    report = {"benchmark": "int8_budget", "target_x_lerobot": TARGET, "cpu": "as in each source", "models": models}
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
