"""Eager torch vs ExecuTorch XNNPACK fp32 vs dynamic int8, on one CPU, in one run.

    .venv/bin/python bench/backends.py [--preset small] [--threads 2] [--runs 10] [--work-dir DIR] [--out FILE]

Exports the preset (seeded random weights) to XNNPACK fp32 and int8-dynamic
`.pte` files (reused from --work-dir when already there for the same preset),
then measures each backend in its own fresh process, one after the other:
cold start (construct + first inference), per-method medians, end to end
(observation -> action chunk) medians for the staged and the fused program,
and peak RSS. Prints one JSON document with the speedups over eager, the
int8 accuracy cost (max/mean abs difference of the chunk against eager fp32,
same noise) and the delegated subgraphs per method.

On a machine whose cores are busy with other work, multi-threaded eager PyTorch
collapses (its OpenMP threads wait for a descheduled peer), which inflates every
ratio against it: pass `--threads 2 1` and read the 1-thread comparison too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import emit, median_ms

RECIPES = {"xnnpack_fp32": "none", "xnnpack_int8": "int8-dynamic"}


def peak_rss_mb() -> float:
    """This process's peak RSS. Not getrusage: ru_maxrss survives exec, so a child would report its parent's."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def observation(camera_names, state_dim: int) -> dict:
    rng = np.random.default_rng(0)
    return {
        "images": {n: rng.integers(0, 255, (480, 640, 3), dtype=np.uint8) for n in camera_names},
        "state": rng.normal(size=state_dim).astype(np.float32),
        "prompt": "reach the red block",
    }


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One backend in this (fresh) process."""
    import torch

    torch.set_num_threads(args.threads[0])
    start = time.perf_counter()
    result: dict[str, Any] = {}
    if args.worker == "eager":
        from omni_ros.policy.loading import from_preset

        policy = from_preset(args.preset)
        obs = observation(policy.metadata.camera_names, policy.metadata.state_dim)
        first = policy.infer(obs)
        result["cold_start_ms"] = round((time.perf_counter() - start) * 1e3, 1)
        model = policy.runner.model
        inputs = policy.processor.inputs([policy.processor.parse(obs)])
        noise = policy.draw_noise(1)
        with torch.inference_mode():
            prefix, mask = model.embed_prefix(inputs)
            cache = model.prefill(prefix, mask)
            t = torch.full((1,), 0.5)
            result["methods_ms"] = {
                "encode_images": median_ms(
                    lambda: model.encode_images(inputs.images, inputs.tokens, inputs.token_mask), args.runs
                ),
                "prefill": median_ms(lambda: model.prefill(prefix, mask), args.runs),
                "denoise_step": median_ms(
                    lambda: model.denoise_step(cache, mask, inputs.state, noise, t), args.runs * 3
                ),
            }
        e2e = median_ms(lambda: policy.infer(obs), args.runs)
        result["end_to_end_ms"] = {"staged": e2e}
    else:
        from omni_ros.backends.executorch_runner import load_pte
        from omni_ros.policy.pi0.stages import prefix_mask_of

        policy = load_pte(args.pte, num_threads=args.threads[0], mode="staged")
        obs = observation(policy.metadata.camera_names, policy.metadata.state_dim)
        first = policy.infer(obs)
        result["cold_start_ms"] = round((time.perf_counter() - start) * 1e3, 1)
        runner, cfg = policy.runner, policy.processor.cfg
        inputs = policy.processor.inputs([policy.processor.parse(obs)])
        encoder_inputs = [inputs.images, *([inputs.tokens, inputs.token_mask] if cfg.vision.film else [])]
        image_tokens = runner._run("encode_images", encoder_inputs)[0].clone()
        args_prefill = [image_tokens, inputs.image_masks, inputs.tokens, inputs.token_mask]
        cache = [c.clone() for c in runner._run("prefill", args_prefill)]
        pmask = prefix_mask_of(inputs.image_masks, inputs.token_mask, cfg.vision.num_tokens)
        x, t = policy.draw_noise(1), torch.full((1,), 0.5)
        result["methods_ms"] = {
            "encode_images": median_ms(lambda: runner._run("encode_images", encoder_inputs), args.runs),
            "prefill": median_ms(lambda: runner._run("prefill", args_prefill), args.runs),
            "denoise_step": median_ms(
                lambda: runner._run("denoise_step", [pmask, inputs.state, x, t, *cache]), args.runs * 3
            ),
        }
        staged = median_ms(lambda: policy.infer(obs), args.runs)
        policy.close()
        fused = load_pte(args.pte, num_threads=args.threads[0], mode="fused")
        fused_actions = fused.infer(obs)["actions"]
        result["fused_matches_staged_max_abs"] = float(np.abs(fused_actions - first["actions"]).max())
        result["end_to_end_ms"] = {"staged": staged, "fused": median_ms(lambda: fused.infer(obs), args.runs)}
        sample_args = [*inputs.as_tuple(), fused.draw_noise(1)]
        result["methods_ms"]["sample"] = median_ms(lambda: fused.runner._run("sample", sample_args), args.runs)
    result["peak_rss_mb"] = peak_rss_mb()
    result["actions"] = first["actions"].tolist()
    return result


def run_worker(kind: str, args: argparse.Namespace, threads: int, pte: Path | None = None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", kind, "--preset", args.preset, "--threads", str(threads)]
    cmd += ["--runs", str(args.runs)] + (["--pte", str(pte)] if pte else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {kind} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(results: dict[str, Any]) -> dict[str, Any]:
    """Speedups over eager and the accuracy cost against eager fp32 (same weights, same noise)."""
    eager_actions = np.asarray(results["eager"].pop("actions"))
    eager = results["eager"]
    for variant in (name for name in results if name != "eager"):
        r = results[variant]
        actions = np.asarray(r.pop("actions"))
        diff = np.abs(actions - eager_actions)
        r["vs_eager_actions"] = {
            "max_abs": float(diff.max()),
            "mean_abs": float(diff.mean()),
            "relative_l2": float(np.linalg.norm(actions - eager_actions) / np.linalg.norm(eager_actions)),
        }
        r["speedup_vs_eager"] = {
            mode: round(eager["end_to_end_ms"]["staged"] / ms, 2) for mode, ms in r["end_to_end_ms"].items()
        }
        r["method_speedup_vs_eager"] = {
            m: round(eager["methods_ms"][m] / ms, 2) for m, ms in r["methods_ms"].items() if m in eager["methods_ms"]
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[2], help="thread counts to compare at (each gets its own runs)"
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--work-dir", default="/tmp/omni_ros_bench_backends")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--worker", choices=["eager", "pte"], help=argparse.SUPPRESS)
    parser.add_argument("--pte", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    import torch

    from omni_ros.export.exporter import export_preset
    from omni_ros.export.sidecar import read_sidecar

    torch.set_num_threads(args.threads[0])
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    exports: dict[str, Any] = {}
    for variant, recipe in RECIPES.items():
        pte = work / f"{args.preset}_{variant}.pte"
        try:
            sidecar = read_sidecar(pte)
            reused = sidecar.model.name == args.preset and sidecar.quantize == recipe
        except Exception:
            reused = False
        if not reused:
            result = export_preset(args.preset, pte, quantize=recipe)
            exports[variant] = {
                "export_s": round(result.seconds, 1),
                **{k: round(v, 1) for k, v in result.timings.items()},
            }
            exports[variant]["exporter_peak_rss_mb"] = peak_rss_mb()
            sidecar = read_sidecar(pte)
        else:
            exports[variant] = {"reused": str(pte)}
        exports[variant]["pte_mb"] = round(pte.stat().st_size / 1e6, 2)
        exports[variant]["delegated_subgraphs"] = {m: r["delegated_subgraphs"] for m, r in sidecar.delegation.items()}
        exports[variant]["portable_ops"] = {m: r["portable_ops"] for m, r in sidecar.delegation.items()}

    by_threads = {}
    for threads in args.threads:
        results = {"eager": run_worker("eager", args, threads)}
        for variant in RECIPES:
            results[variant] = run_worker("pte", args, threads, work / f"{args.preset}_{variant}.pte")
        by_threads[f"threads_{threads}"] = compare(results)
    report = {
        "benchmark": "backends",
        "preset": args.preset,
        "threads": args.threads,
        "runs": args.runs,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
        "targets": {"xnnpack_fp32_speedup": 1.6, "xnnpack_int8_speedup": 3.5},
        "exports": exports,
        "results": by_threads,
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
