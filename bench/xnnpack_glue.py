"""What the int8 XNNPACK path does around its GEMMs, each choice against its alternative, side by side.

    .venv/bin/python bench/xnnpack_glue.py --checkpoint DIR [--threads 1 2] [--rounds 5] [--no-build | --no-ab]
        [--out bench/results/xnnpack_glue.json]

On a LeRobot checkpoint (bench/vs_lerobot.py's edge pi0 folder, or bench/smolvla.py's), `policy.precision int8`
with XNNPACK's kernels, for each thread count, in fresh processes:

- `mlp`: every MLP one XNNPACK method (what the product does) against one method per linear with torch's
  activation between them (`xnnpack_mlp.mlp_specs` turned off): both policies in one process, chunks timed in
  alternating rounds, stage by stage.
- `step_threads`: the denoising steps on one torch thread against torch's threads as set, one policy, alternating
  rounds (the product times both on its first chunks and keeps the faster: omni_ros.cpu_threads.StepThreads).
- `build` (unless --no-build; one thread count): the chunk time and peak RSS of the process that built its kernels,
  lowering them itself (in process) or in a child (the product), against a fresh process reading the cache they
  built; each in an empty cache folder. `--no-ab` runs only this part.

Medians of --rounds chunks per arm; a random observation (2 cameras at 480x640), the same for every arm.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import cpu_facts, emit

STAGES = ("embed_prefix_ms", "prefill_ms", "denoise_ms", "infer_ms")


def log(msg: str) -> None:
    print(f"[xnnpack_glue] {msg}", file=sys.stderr, flush=True)


def _observation(meta: Any) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    images = {c: rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for c in meta.camera_names}
    return {"images": images, "state": np.zeros(meta.state_dim, np.float32), "prompt": "pick up the cube"}


def _load(checkpoint: str, cache: str, mlp_methods: bool = True) -> Any:
    import omni_ros.policy
    from omni_ros.policy.precision import xnnpack_mlp

    real = xnnpack_mlp.mlp_specs
    if not mlp_methods:
        xnnpack_mlp.mlp_specs = lambda model, names: []  # type: ignore[assignment]
    try:
        return omni_ros.policy.load(checkpoint, precision="int8", int8_kernel="xnnpack", cache_dir=cache)
    finally:
        xnnpack_mlp.mlp_specs = real  # type: ignore[assignment]


def _medians(samples: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(s[k] for s in samples), 1) for k in STAGES}


def _alternate(arms: dict[str, Any], rounds: int) -> dict[str, dict[str, float]]:
    """arm name -> () -> policy_timing; one chunk of each in turn, `rounds` times, after one warm-up each."""
    for run in arms.values():
        run()
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, run in arms.items():
            samples[name].append(run())
    return {name: _medians(s) for name, s in samples.items()}


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from omni_ros.cpu_threads import StepThreads

    threads = args.threads[0]  # a worker runs at one thread count
    torch.set_num_threads(threads)
    if args.worker == "ab":
        mlp, linears = _load(args.checkpoint, args.cache), _load(args.checkpoint, args.cache, mlp_methods=False)
        obs = _observation(mlp.metadata)
        out = {"mlp": _alternate({
            "one_method_per_mlp": lambda: mlp.infer(obs)["policy_timing"],
            "one_method_per_linear": lambda: linears.infer(obs)["policy_timing"],
        }, args.rounds)}  # fmt: skip
        del linears
        runner = mlp.runner

        def steps_on(n: int) -> Callable[[], dict[str, float]]:
            def run() -> dict[str, float]:
                runner.step_threads = StepThreads((n,))  # the product times both and keeps the faster
                return mlp.infer(obs)["policy_timing"]

            return run

        out["step_threads"] = _alternate({
            "steps_on_1_torch_thread": steps_on(1),
            f"steps_on_{threads}_torch_threads": steps_on(threads),
        }, args.rounds)  # fmt: skip
        return out
    # worker "build": the first process's chunks, the kernels lowered here or in a child
    if args.worker == "build_in_process":
        from omni_ros.policy.precision import xnnpack_linears

        xnnpack_linears._write_program = xnnpack_linears.lower_program  # type: ignore[assignment]
    start = time.perf_counter()
    policy = _load(args.checkpoint, args.cache)
    load_s = time.perf_counter() - start
    obs = _observation(policy.metadata)
    timing = _alternate({"chunk": lambda: policy.infer(obs)["policy_timing"]}, args.rounds)["chunk"]
    # ru_maxrss: this process's own peak (KiB on Linux), a child's lowering not included.
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"load_s": round(load_s, 1), "peak_rss_mb": round(peak_mb), **timing}


def run_worker(args: argparse.Namespace, kind: str, threads: int, cache: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", kind, "--checkpoint", args.checkpoint, "--cache", cache]
    cmd += ["--threads", str(threads), "--rounds", str(args.rounds)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{kind} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a LeRobot pi0 / pi0.5 / SmolVLA folder")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-build", action="store_true", help="skip the in-process / child build comparison")
    parser.add_argument("--no-ab", action="store_true", help="only the build comparison")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return 0
    report: dict[str, Any] = {
        "benchmark": "xnnpack_glue",
        "checkpoint": Path(args.checkpoint).name,
        "rounds": args.rounds,
    }
    with tempfile.TemporaryDirectory(prefix="omni_glue_") as tmp:
        shared = str(Path(tmp) / "shared")  # the A/B arms' kernels, built once
        report["threads"] = {}
        for threads in [] if args.no_ab else args.threads:
            log(f"{threads} thread(s): one method per MLP vs per linear, step threads (builds kernels once) ...")
            report["threads"][str(threads)] = run_worker(args, "ab", threads, shared)
        if not args.no_build:
            threads = args.threads[0]
            build: dict[str, Any] = {"threads": threads}
            for kind in ("build_in_process", "build_in_child"):
                cache = str(Path(tmp) / kind)
                log(f"{kind}: first load at {threads} thread(s), then a fresh process on its cache ...")
                build[kind] = {"first_process": run_worker(args, kind, threads, cache)}
                build[kind]["fresh_process"] = run_worker(args, "build_in_child", threads, cache)
            report["build"] = build
    report["machine"] = cpu_facts()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
