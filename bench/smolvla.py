"""Full-size SmolVLA on this CPU: LeRobot 0.6.1 vs omni_ros eager fp32, XNNPACK fp32 and int8, one run, same weights.

    .venv/bin/python bench/smolvla.py [--threads 2] [--runs 3] [--work-dir DIR] [--out bench/results/smolvla.json]
        [--lerobot-python .venv-lerobot/bin/python] [--lerobot-script scripts/lerobot_bench.py] [--profile]

LeRobot's default SmolVLA config over SmolVLM2-500M dimensions with random weights (built from config only by
LeRobot's half, `scripts/lerobot_bench.py --policy smolvla`, in LeRobot's own venv, which also times LeRobot),
2 cameras of 480x640 -> 512 px tiles, chunk 50, 10 denoising steps. The same folder is then loaded by omni_ros
(the LeRobot layout, weights memory-mapped) and exported to XNNPACK fp32 and int8-dynamic (the staged methods).
The eager rows load the folder the way the node does (the backend factory's `load_checkpoint`), so the int8 row
runs the kernel `auto` picks (`--int8-kernel` to pin one): on an x86 CPU with VNNI and no AMX the stage program,
whose stages come from the pipeline's timing of each chunk. Every contender runs in a fresh process of its own,
one after the other, at the same thread count:

    cold start        process start -> first chunk (imports, load, first inference)
    latency           observation -> action chunk, median of --runs after a warm-up chunk
    stages            vision per camera, prefix forward (prefill), one denoising step
    peak RSS          VmHWM of the process, against the size of the fp32 weights
    GFLOP/s           the eager chunk's matmul FLOPs (counted from the config) / its latency, as a share of the
                      fp32 matmul peak measured in this run (torch.mm, same threads)

Exported programs are kept in the work dir and reused by the next run over the same weights (--reexport).
With a target missed, `--profile` adds the top operators of one eager chunk (torch.profiler, self CPU time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

T_PROCESS = time.perf_counter()

import numpy as np  # noqa: E402
from common import add_precision_args, cpu_facts, emit, timings_ms  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FOLDER = "smolvla_full"  # what the LeRobot half writes into the work dir
TARGETS = {"eager_vs_lerobot": 0.8, "int8_vs_lerobot": 0.4, "peak_rss_vs_fp32_weights": 1.3, "gflops_share": 0.6}
SEED_VISION_S = (0.6, 1.2)  # SigLIP-class encoder, one 512 px tile, 8 CPU threads in llama.cpp


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(samples)
    return {"median_ms": round(statistics.median(ms), 1), "min_ms": round(ms[0], 1), "n": len(ms)}


def timed(fn, runs: int, warmup: int = 1) -> dict[str, float]:
    return summary(timings_ms(fn, runs, warmup))


def inputs_of(work: Path) -> tuple[dict, np.ndarray, dict]:
    """The observation (omni_ros form), noise and metadata the LeRobot half used."""
    from safetensors.numpy import load_file

    meta = json.loads((work / f"{FOLDER}_inputs.json").read_text())
    tensors = load_file(str(work / f"{FOLDER}_inputs.safetensors"))
    images = {k.removeprefix("observation.images."): tensors[k] for k in meta["cameras"]}
    obs = {"images": images, "state": tensors["observation.state"], "prompt": meta["prompt"]}
    return obs, tensors["noise"][0], meta


# -- FLOPs -------------------------------------------------------------------------------------------------------


def chunk_gflop(cfg, cameras: int, prompt_tokens: int, steps: int) -> dict[str, float]:
    """Matmul GFLOP of one chunk (2 per multiply-add; linears, attention scores and values, the conv as a matmul).
    Norms, softmax and element-wise ops are left out (they are not matmul work)."""
    v, t, e = cfg.vision, cfg.text, cfg.expert
    patches = (cfg.tile_size // v.patch_size) ** 2
    per_vit_layer = 4 * v.width**2 + 2 * v.width * v.mlp_dim
    vision = 2 * patches * (3 * v.patch_size**2 * v.width + v.depth * per_vit_layer)
    vision += v.depth * 2 * 2 * patches * patches * v.width  # q k^T and p v
    tokens = cfg.tokens_per_camera
    vision += 2 * tokens * v.width * v.scale_factor**2 * t.width  # connector
    p = cameras * tokens + prompt_tokens + 1
    q, kv = t.num_heads * t.head_dim, t.num_kv_heads * t.head_dim
    plan = cfg.layer_plan()
    last = max(i for i, _ in plan)
    per_text_layer = 2 * t.width * q + 2 * t.width * kv + 3 * t.width * t.mlp_dim
    prefill = 2 * p * (last * per_text_layer + t.width * (q + 2 * kv))  # the last layer: q, k, v only
    prefill += last * 2 * 2 * p * p * q
    prefill += 2 * p * sum(2 * kv * kv for _, kind in plan if kind == "cross")  # the expert's k/v of the cache
    prefill += 2 * cfg.max_state_dim * t.width
    h = cfg.action_horizon
    step = 2 * h * (cfg.max_action_dim * e.width + 3 * e.width**2 + e.width * cfg.max_action_dim)  # in, time MLP, out
    for _, kind in plan:
        step += 2 * h * (2 * e.width * q + 3 * e.width * e.mlp_dim)
        step += 2 * h * 2 * e.width * kv if kind == "self" else 0
        step += 2 * 2 * h * (p + h if kind == "self" else p) * q
    return {
        "vision_per_camera": vision / 1e9,
        "prefill": prefill / 1e9,
        "denoise_step": step / 1e9,
        "chunk": (cameras * vision + prefill + steps * step) / 1e9,
    }


def matmul_peak_gflops(threads: int) -> dict[str, float]:
    """Best fp32 matmul throughput at this thread count (torch.mm, and the oneDNN-packed product where there is
    one): square 2048 and a vision-MLP-shaped product."""
    import torch

    torch.set_num_threads(threads)
    out = {}
    for name, (m, k, n) in {"mm_2048": (2048, 2048, 2048), "mm_1024x768x3072": (1024, 768, 3072)}.items():
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(2):
            torch.mm(a, b)
        best = min(timed_once(lambda a=a, b=b: torch.mm(a, b)) for _ in range(8))
        out[name] = round(2 * m * k * n / best / 1e9, 1)
        # The same product from a oneDNN-packed weight (what policy.cpu_linear: packed runs), where available.
        from omni_ros.policy.cpu_linear import packed_linear_available

        if packed_linear_available():
            w = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), None)
            best = min(timed_once(lambda a=a, w=w: torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], ""))
                       for _ in range(8))  # fmt: skip
            out[f"{name}_onednn_packed"] = round(2 * m * k * n / best / 1e9, 1)
    out["peak"] = max(out.values())
    return out


def timed_once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- workers (each in a fresh process) ---------------------------------------------------------------------------


def worker_eager(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    # The product's loader of a checkpoint (the backend factory's): int8 runs the kernel `auto` picks here, the
    # stage program included.
    from omni_ros.backends.stage_program import load_checkpoint

    work = Path(args.work_dir)
    obs, noise, _ = inputs_of(work)
    t0 = time.perf_counter()
    policy = load_checkpoint(
        work / FOLDER, cpu_linear=args.cpu_linear, precision=args.precision, int8_kernel=args.int8_kernel
    )
    loaded = time.perf_counter()
    first = policy.infer(obs, noise=noise)
    cold = {"load_s": round(loaded - t0, 2), "first_chunk_s": round(time.perf_counter() - loaded, 2)}
    cold["total_s"] = round(time.perf_counter() - T_PROCESS, 2)
    result: dict[str, Any] = {"cold_start": cold, "rss_after_first_chunk_mb": peak_rss_mb()}
    inputs = policy.processor.inputs([policy.processor.parse(obs)])
    model = getattr(policy.runner, "model", None)
    if model is not None:
        with torch.inference_mode():
            prefix, mask = model.embed_prefix(inputs)
            cache = model.prefill(prefix, mask)
            x, t = torch.from_numpy(noise)[None], torch.full((1,), 0.5)
            tile = inputs.images[:, 0]
            result["stages"] = {
                "vision_per_camera": timed(lambda: model.embed_images(tile), args.runs),
                "prefill": timed(lambda: model.prefill(prefix, mask), args.runs),
                "denoise_step": timed(lambda: model.denoise_step(cache, mask, inputs.state, x, t), args.runs * 3),
            }
        result["latency"] = timed(lambda: policy.infer(obs, noise=noise), args.runs)
    else:  # an exported program (int8_kernel program): its stages from the pipeline's own timing of each chunk
        timings: list[dict[str, float]] = []
        result["latency"] = timed(lambda: timings.append(policy.infer(obs, noise=noise)["policy_timing"]), args.runs)
        per = {"vision_per_camera": ("embed_prefix_ms", inputs.images.shape[1]), "prefill": ("prefill_ms", 1)}
        per["denoise_step"] = ("denoise_ms", policy.num_steps or 1)
        result["stages"] = {name: summary([t[key] / count for t in timings[1:]]) for name, (key, count) in per.items()}
    result["prompt_tokens"] = int(inputs.token_mask.sum())
    if args.profile:
        result["profile_top_ops"] = profile(lambda: policy.infer(obs, noise=noise))
    result["peak_rss_mb"] = peak_rss_mb()
    result["actions"] = first["actions"].tolist()
    result["precision"] = policy.metadata.precision
    return result


def profile(fn) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    total = sum(e.self_cpu_time_total for e in prof.key_averages()) or 1
    return [
        {
            "op": e.key,
            "self_ms": round(e.self_cpu_time_total / 1e3, 1),
            "share": round(e.self_cpu_time_total / total, 3),
            "calls": e.count,
        }
        for e in rows
    ]


def worker_pte(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from omni_ros.backends.executorch_runner import load_pte
    from omni_ros.policy.smolvla.modeling import prefix_mask_of
    from omni_ros.policy.smolvla.stages import static_prompt

    work = Path(args.work_dir)
    obs, noise, _ = inputs_of(work)
    t0 = time.perf_counter()
    policy = load_pte(args.pte, num_threads=args.threads, mode="staged")
    loaded = time.perf_counter()
    first = policy.infer(obs, noise=noise)
    cold = {"load_s": round(loaded - t0, 2), "first_chunk_s": round(time.perf_counter() - loaded, 2)}
    cold["total_s"] = round(time.perf_counter() - T_PROCESS, 2)
    result: dict[str, Any] = {"cold_start": cold}
    runner, cfg = policy.runner, policy.processor.cfg
    inputs = static_prompt(cfg, policy.processor.inputs([policy.processor.parse(obs)]))
    tile = inputs.images[:, 0].contiguous()
    tokens = torch.cat([runner._run("encode_image", [inputs.images[:, i]])[0].clone() for i in range(2)], dim=1)
    prefill_in = [tokens, inputs.image_masks, inputs.tokens, inputs.token_mask, inputs.state]
    cache = [c.clone() for c in runner._run("prefill", prefill_in)]
    mask = prefix_mask_of(inputs.image_masks, inputs.token_mask, cfg.tokens_per_camera)
    x, t = torch.from_numpy(noise)[None], torch.full((1,), 0.5)
    result["stages"] = {
        "vision_per_camera": timed(lambda: runner._run("encode_image", [tile]), args.runs),
        "prefill": timed(lambda: runner._run("prefill", prefill_in), args.runs),
        "denoise_step": timed(lambda: runner._run("denoise_step", [mask, x, t, *cache]), args.runs * 3),
    }
    result["latency"] = timed(lambda: policy.infer(obs, noise=noise), args.runs)
    result["peak_rss_mb"] = peak_rss_mb()
    result["actions"] = first["actions"].tolist()
    return result


def worker_export(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    from omni_ros.export.exporter import export_checkpoint

    methods = ("encode_image", "prefill", "denoise_step")  # the fused loop of 10 unrolled steps is left out
    result = export_checkpoint(Path(args.work_dir) / FOLDER, args.pte, quantize=args.quantize, methods=methods)
    return {
        "export_s": round(result.seconds, 1),
        "pte_mb": round(result.bytes / 1e6, 1),
        "exporter_peak_rss_mb": peak_rss_mb(),
        "delegation": {m: {k: r[k] for k in ("delegated_subgraphs", "portable_ops")} for m, r in result.report.items()},
    }


def worker_peak(args: argparse.Namespace) -> dict[str, Any]:
    return matmul_peak_gflops(args.threads)


WORKERS = {"eager": worker_eager, "pte": worker_pte, "export": worker_export, "peak": worker_peak}


def run_worker(kind: str, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", kind, "--threads", str(args.threads), "--runs", str(args.runs)]
    cmd += ["--work-dir", str(args.work_dir), "--int8-kernel", args.int8_kernel] + (
        ["--profile"] if args.profile else []
    )
    for key, value in extra.items():
        cmd += [f"--{key}", str(value)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    log(f"[{kind}] {' '.join(f'{k}={v}' for k, v in extra.items())}")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {kind} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def exported(args: argparse.Namespace, pte: Path, quantize: str) -> dict[str, Any]:
    """Export the folder to `pte` (minutes at full size), or reuse the program an earlier run of this
    benchmark wrote for the same weights (its export report is kept beside it); --reexport forces it."""
    report = pte.with_suffix(".export.json")
    weights = (args.work_dir / FOLDER / "model.safetensors").stat()
    stamp = {"weights_bytes": weights.st_size, "weights_mtime": weights.st_mtime, "quantize": quantize}
    if not args.reexport and pte.is_file() and report.is_file():
        saved = json.loads(report.read_text())
        if saved.get("stamp") == stamp:
            log(f"[export] reusing {pte} (exported in {saved['result']['export_s']} s)")
            return {**saved["result"], "reused": True}
    result = run_worker("export", args, pte=pte, quantize=quantize)
    report.write_text(json.dumps({"stamp": stamp, "result": result}, indent=1))
    return result


def run_lerobot(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [str(args.lerobot_python), str(args.lerobot_script), "--policy", "smolvla", "--threads", str(args.threads)]
    cmd += ["--out", str(args.work_dir), "--runs", str(args.runs), "--warmup", "1"]
    log("[lerobot] " + " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the LeRobot half failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3, help="timed chunks (stages: 3x for one denoising step)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/omni_ros_bench_smolvla"))
    parser.add_argument("--out", help="also write the JSON here (bench/results/smolvla.json)")
    parser.add_argument("--lerobot-python", type=Path, default=ROOT / ".venv-lerobot" / "bin" / "python")
    parser.add_argument("--lerobot-script", type=Path, default=ROOT / "scripts" / "lerobot_bench.py")
    parser.add_argument("--profile", action="store_true", help="the eager chunk's top operators too")
    parser.add_argument(
        "--no-int8", action="store_true", help="skip the int8 export and run (its export alone took 989 s here)"
    )
    parser.add_argument("--reexport", action="store_true", help="export again even if the work dir holds programs")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--pte", help=argparse.SUPPRESS)
    parser.add_argument("--quantize", help=argparse.SUPPRESS)
    parser.add_argument("--cpu-linear", default="packed", help=argparse.SUPPRESS)
    parser.add_argument(
        "--int8-kernel",
        default="auto",
        help="policy.int8_kernel of the eager int8 row (default auto: on an x86 CPU with VNNI and no AMX, the stages "
        "exported whole to one XNNPACK int8 program on the first load)",
    )
    add_precision_args(parser)
    parser.add_argument(
        "--no-export", action="store_true", help="LeRobot and eager only (no XNNPACK export or run; much shorter)"
    )
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return 0
    if not args.lerobot_python.is_file() or not args.lerobot_script.is_file():
        parser.error(
            f"LeRobot's half needs {args.lerobot_python} and {args.lerobot_script} (bash scripts/lerobot_venv.sh)"
        )
    args.work_dir.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    lerobot = run_lerobot(args)  # builds the folder on first use, then times LeRobot
    _, _, meta = inputs_of(args.work_dir)
    # Eager as the node and server run it (linears oneDNN-packed, policy.cpu_linear: packed) and with torch's
    # plain nn.Linear (dense).
    results: dict[str, Any] = {
        "lerobot": lerobot,
        "omni_ros_eager": run_worker("eager", args, **{"cpu-linear": "packed"}),
        "omni_ros_eager_dense": run_worker("eager", args, **{"cpu-linear": "dense"}),
    }
    for precision in args.precisions:
        results[f"omni_ros_eager_{precision}"] = run_worker("eager", args, precision=precision)
    fp32_chunk = np.asarray(results["omni_ros_eager"]["actions"])
    for precision in args.precisions:
        chunk = np.asarray(results[f"omni_ros_eager_{precision}"]["actions"])
        rel = float(np.linalg.norm(chunk - fp32_chunk) / np.linalg.norm(fp32_chunk))
        results[f"omni_ros_eager_{precision}"]["rel_l2_vs_fp32"] = round(rel, 5)
    exports = {}
    recipes = [("xnnpack_fp32", "none")] + ([] if args.no_int8 else [("xnnpack_int8", "int8-dynamic")])
    recipes = [] if args.no_export else recipes
    for name, recipe in recipes:
        pte = args.work_dir / f"smolvla_{name}.pte"
        exports[name] = exported(args, pte, recipe)
        results[f"omni_ros_{name}"] = run_worker("pte", args, pte=pte)
    peak = run_worker("peak", args)

    from omni_ros.policy import layouts

    cfg = layouts.read(args.work_dir / FOLDER).config
    eager = results["omni_ros_eager"]
    flops = chunk_gflop(cfg, len(meta["cameras"]), eager["prompt_tokens"], cfg.num_steps)
    weights_mb = lerobot["weights_fp32_mb"]
    le_ms = lerobot["latency_ms"]
    le_first = np.asarray(lerobot["actions_first_row"])
    for name, r in results.items():
        if name == "lerobot":
            continue
        r["vs_lerobot_latency"] = round(r["latency"]["median_ms"] / le_ms, 3)
        r["peak_rss_vs_fp32_weights"] = round(r["peak_rss_mb"] / weights_mb, 2)
        r["first_action_vs_lerobot_max_abs"] = float(np.abs(np.asarray(r.pop("actions"))[0] - le_first).max())
    stage_gflops = {
        s: round(flops[s] / (eager["stages"][s]["median_ms"] / 1e3), 1)
        for s in ("vision_per_camera", "prefill", "denoise_step")
    }
    achieved = flops["chunk"] / (eager["latency"]["median_ms"] / 1e3)
    vision_s = {k: results[k]["stages"]["vision_per_camera"]["median_ms"] / 1e3 for k in results if k != "lerobot"}
    vision_s["lerobot"] = lerobot["stages"]["vision_per_camera"]["median_ms"] / 1e3
    report = {
        "benchmark": "smolvla",
        "threads": args.threads,
        "runs": args.runs,
        "machine": {
            **cpu_facts(),
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
        },
        "model": {
            "param_count": lerobot["param_count"],
            "weights_fp32_mb": round(weights_mb, 1),
            "cameras": meta["cameras"],
            "camera_hw": meta["build"]["camera_hw"],
            "tile": cfg.tile_size,
            "prompt_tokens": eager["prompt_tokens"],
            "chunk": [cfg.action_horizon, cfg.max_action_dim],
            "steps": cfg.num_steps,
        },
        "targets": TARGETS,
        "results": results,
        "exports": exports,
        "flops": {
            "gflop": {k: round(v, 2) for k, v in flops.items()},
            "matmul_peak_gflops": peak,
            "eager_chunk_gflops": round(achieved, 1),
            "eager_share_of_peak": round(achieved / peak["peak"], 3),
            "eager_stage_gflops": stage_gflops,
            "eager_stage_share_of_peak": {k: round(v / peak["peak"], 3) for k, v in stage_gflops.items()},
        },
        "vision_one_tile_s": {k: round(v, 3) for k, v in vision_s.items()},
        "vision_seed_figure_s": {"range": list(SEED_VISION_S), "threads": 8, "engine": "llama.cpp"},
        "met": {
            "eager_vs_lerobot": eager["vs_lerobot_latency"] <= TARGETS["eager_vs_lerobot"],
            "int8_vs_lerobot": (
                results["omni_ros_xnnpack_int8"]["vs_lerobot_latency"] <= TARGETS["int8_vs_lerobot"]
                if "omni_ros_xnnpack_int8" in results
                else None  # not run (--no-int8)
            ),
            "eager_peak_rss": eager["peak_rss_vs_fp32_weights"] <= TARGETS["peak_rss_vs_fp32_weights"],
            "gflops_share": achieved / peak["peak"] >= TARGETS["gflops_share"],
            **{
                f"eager_{p}_vs_lerobot": results[f"omni_ros_eager_{p}"]["vs_lerobot_latency"] <= budget
                for p, budget in (("int8", 0.4), ("bf16", 0.6))
                if f"omni_ros_eager_{p}" in results
            },
            **{
                f"eager_{p}_rel_l2": results[f"omni_ros_eager_{p}"]["rel_l2_vs_fp32"] <= bound
                for p, bound in (("int8", 0.04), ("bf16", 0.01))
                if f"omni_ros_eager_{p}" in results
            },
        },
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
