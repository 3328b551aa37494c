"""Policy latency on this machine: per stage, whole call, and KV cache vs recompute.

    .venv/bin/python bench/policy_latency.py [--presets tiny small] [--runs 20] [--threads 2] [--out FILE]

Prints one JSON document: for each preset, median and p95 (ms) of vision
encoding per camera, prefix forward (prefill), one denoise step, the whole
observation -> chunk call with 1 and 2 cameras, sampling with the prefix KV
cache against recomputing the prefix at every step (and their ratio), and
peak RSS. Everything is measured in one process, one preset after the other.
"""

from __future__ import annotations

import omni_ros  # noqa: F401  (before torch: its OpenMP thread settings, omni_ros/cpu_threads.py)

# isort: split
import argparse
import platform
import resource
import statistics
import sys
from collections.abc import Callable

import numpy as np
import torch
from common import emit, timings_ms

from omni_ros.policy.loading import from_preset
from omni_ros.policy.pi0.modeling import count_parameters
from omni_ros.policy.pipeline import InferencePipeline


def measure(fn: Callable[[], object], runs: int, warmup: int) -> dict[str, float]:
    samples = sorted(timings_ms(fn, runs, warmup))
    return {
        "median_ms": round(statistics.median(samples), 3),
        "p95_ms": round(samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))], 3),
        "min_ms": round(samples[0], 3),
        "runs": runs,
    }


def observation(policy: InferencePipeline, cameras: int) -> dict:
    rng = np.random.default_rng(0)
    names = policy.metadata.camera_names[:cameras]
    return {
        "images": {n: rng.integers(0, 255, (480, 640, 3), dtype=np.uint8) for n in names},
        "state": rng.normal(size=policy.metadata.state_dim).astype(np.float32),
        "prompt": "reach the red block",
    }


def bench_preset(name: str, runs: int, warmup: int) -> dict:
    result: dict = {}
    for cameras in (1, 2):
        # A model configured for exactly the cameras it gets: masked camera slots still cost compute.
        names = ["base", "wrist"][:cameras]
        policy = from_preset(name, camera_names=names, seed=0)
        obs = observation(policy, cameras)
        result[f"infer_{cameras}cam"] = measure(lambda p=policy, o=obs: p.infer(o), runs, warmup)
        if cameras == 2:
            break
        result["parameters_1cam"] = count_parameters(policy.runner.model)["total"]

    # Stages and cache comparison on the 2-camera model.
    model, processor = policy.runner.model, policy.processor
    cfg = processor.cfg
    inputs = processor.inputs([processor.parse(obs)])
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(0))
    one_tile = inputs.images[:, 0]
    with torch.inference_mode():
        prefix, mask = model.embed_prefix(inputs)
        cache = model.prefill(prefix, mask)
        t = torch.full((1,), 0.5)
        result["vision_per_camera"] = measure(lambda: model.vision(one_tile), runs, warmup)
        result["prefix_forward"] = measure(lambda: model.prefill(prefix, mask), runs, warmup)
        result["denoise_step"] = measure(lambda: model.denoise_step(cache, mask, inputs.state, noise, t), runs, warmup)
        steps = 10
        cached = measure(lambda: model.sample(inputs, noise, num_steps=steps, use_cache=True), runs, warmup)
        recompute = measure(lambda: model.sample(inputs, noise, num_steps=steps, use_cache=False), runs, warmup)
        a = model.sample(inputs, noise, num_steps=steps, use_cache=True)
        b = model.sample(inputs, noise, num_steps=steps, use_cache=False)
    result["sample_10_steps_cached"] = cached
    result["sample_10_steps_recompute"] = recompute
    result["recompute_over_cached"] = round(recompute["median_ms"] / cached["median_ms"], 2)
    result["cached_vs_recompute_max_abs_diff"] = float((a - b).abs().max())
    result["parameters_2cam"] = count_parameters(model)["total"]
    result["prefix_tokens_2cam"] = cfg.prefix_len
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    report = {
        "benchmark": "policy_latency",
        "torch": torch.__version__,
        "threads": args.threads,
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
        "presets": {},
    }
    for name in args.presets:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        report["presets"][name] = bench_preset(name, args.runs, args.warmup)
    small = report["presets"].get("small")
    if small:
        report["targets"] = {
            "small_cached_at_least_3x_faster_than_recompute": small["recompute_over_cached"] >= 3.0,
            "small_1cam_under_300ms": small["infer_1cam"]["median_ms"] < 300,
            "small_2cam_under_400ms": small["infer_2cam"]["median_ms"] < 400,
        }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
