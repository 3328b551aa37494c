"""What glibc's page faults cost an inference, and what keeping freed heap pages (omni_ros/heap.py) saves.

    .venv/bin/python bench/heap_faults.py --checkpoint DIR [DIR ...] [--precisions fp32 bf16 int8]
        [--threads 1 2] [--runs 8] [--out bench/results/heap_faults.json]

For each checkpoint x precision x thread count, two fresh processes, one after the other: `kept` (the product
as it runs: omni_ros.heap.keep_freed_heap at load) and `glibc` (OMNI_ROS_KEEP_FREED_HEAP=0: the allocator's
defaults). Each loads the policy (policy.cpu_linear packed, as the node runs it), runs 3 warm-up inferences
and then --runs timed ones on a worker thread (the node infers on one: a thread's own malloc arena), and reports
the medians of the chunk time and its stages, the minor page faults an inference took (getrusage), and the
process's peak RSS. `kept_over_glibc` is the chunk-time ratio of the two processes of one row, measured
back to back: compare ratios, not times across runs. The observation is synthetic (random 480 x 640 images
for every camera, random state), the same in both processes.

Checkpoints used for the committed result: the edge pi0 of bench/vs_lerobot.py (its work dir's pi0_edge) and
the full-size SmolVLA of bench/realtime.py (its work dir's smolvla_full), both built by LeRobot.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import add_worker_args, cpu_facts, emit

WARMUP = 3


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import resource
    import threading

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    import omni_ros.heap
    import omni_ros.policy

    policy = omni_ros.policy.load(args.checkpoint, precision=args.precision, cpu_linear="packed")
    meta = policy.metadata
    rng = np.random.default_rng(0)
    obs = {
        "images": {c: rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for c in meta.camera_names},
        "state": rng.normal(size=meta.state_dim).astype(np.float32),
        "prompt": "pick up the cube",
    }
    rows: list[tuple[int, dict[str, float]]] = []

    def run() -> None:
        for _ in range(WARMUP):
            policy.infer(obs)
        for _ in range(args.runs):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            timing = policy.infer(obs)["policy_timing"]
            rows.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, timing))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    stages = {k: round(statistics.median(t[k] for _, t in rows), 1) for k in rows[0][1] if k.endswith("_ms")}
    return {
        "heap": "kept" if omni_ros.heap.keep_freed_heap() else "glibc",
        "precision_chosen": meta.precision,
        "chunk_ms": stages.pop("infer_ms"),
        "stages_ms": stages,
        "minor_faults_per_inference": int(statistics.median(f for f, _ in rows)),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run_worker(args: argparse.Namespace, checkpoint: str, precision: str, threads: int, keep: bool) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--checkpoint", checkpoint, "--precision", precision]
    cmd += ["--threads", str(threads), "--runs", str(args.runs)]
    env = dict(os.environ, OMNI_ROS_KEEP_FREED_HEAP="1" if keep else "0")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {checkpoint} {precision} x {threads} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", nargs="+", help="checkpoint folders (each one's rows in turn)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "int8"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=8, help="timed inferences per process (after 3 warm-up)")
    parser.add_argument("--out", help="also write the JSON here")
    add_worker_args(parser)
    args = parser.parse_args()
    if args.worker:
        args.threads = args.threads[0]
        args.checkpoint = args.checkpoint[0]
        print(json.dumps(worker(args)))
        return 0
    if not args.checkpoint:
        parser.error("--checkpoint: at least one checkpoint folder")
    rows = []
    for checkpoint in args.checkpoint:
        for threads in args.threads:
            for precision in args.precisions:
                print(f"[heap] {Path(checkpoint).name} {precision} x {threads} ...", file=sys.stderr, flush=True)
                glibc = run_worker(args, checkpoint, precision, threads, keep=False)
                kept = run_worker(args, checkpoint, precision, threads, keep=True)
                row = {
                    "checkpoint": Path(checkpoint).name,
                    "precision": precision,
                    "threads": threads,
                    "glibc": glibc,
                    "kept": kept,
                    "kept_over_glibc": round(kept["chunk_ms"] / glibc["chunk_ms"], 3),
                }
                print(
                    f"[heap]   glibc {glibc['chunk_ms']:.0f} ms, {glibc['minor_faults_per_inference']} faults; "
                    f"kept {kept['chunk_ms']:.0f} ms, {kept['minor_faults_per_inference']} faults",
                    file=sys.stderr,
                    flush=True,
                )
                rows.append(row)
    report = {
        "benchmark": "heap_faults",
        "runs": args.runs,
        "rows": rows,
        "command": "bench/heap_faults.py " + " ".join(sys.argv[1:]),
        "cpu": cpu_facts(),
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
